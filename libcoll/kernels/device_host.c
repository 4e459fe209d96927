/* device_host.c — coll_device_host, the device interface (device_ops.h) of a back end
 * with no device: every buffer is host memory, no call has an event or a ticket, the
 * device data path is never wanted, and a stream wraps nothing.
 *
 * What a communicator of a build without CUDA gets (comm.c), and what every plain
 * coll_stream_t carries (exec/stream.c): so a host call goes from exec/ down to here
 * and no further, never into cuda/.  The answers and sentences are those cuda.c's and
 * peer.c's stubs of a build without CUDA gave before the interface existed; the hooks
 * that can only be reached with device work (which prepare never reports) fail with
 * COLL_ERR_INTERNAL.
 *
 * Must never: allocate, lock, make a system call, or know about any device (no CUDA
 * type, no cuda/ header): prepare runs on every call's path.
 */
#include <string.h>

#include "device_ops.h"

static coll_result host_comm_setup(struct coll_comm *comm) {
  (void)comm;
  return COLL_OK;
}
static void host_comm_free(struct coll_comm *comm, coll_comm_end how) { (void)comm, (void)how; }
static coll_result host_comm_lazy(struct coll_comm *comm, const coll_work *w, const char *fn,
                                  coll_device_exchange xchg) {
  (void)w, (void)xchg;
  return coll_fail(comm, COLL_ERR_INTERNAL, "%s: device work in a build without CUDA", fn);
}
static void host_comm_wake(struct coll_comm *comm) { (void)comm; }

/* Host memory, no event, no ticket; nothing for the device data path. */
static coll_result host_prepare(struct coll_comm *comm, const char *fn, coll_work *w) {
  (void)comm, (void)fn;
  w->device = false;
  w->cuda_event = NULL;
  w->cuda_ticket = 0;
  return COLL_OK;
}
static coll_result host_prepare_stream(struct coll_comm *comm, const char *fn, coll_work *w) {
  (void)comm, (void)fn, (void)w;
  return COLL_OK;
}
static coll_result host_after_submit(struct coll_comm *comm, coll_work *w, coll_result r) {
  (void)comm, (void)w;
  return r;
}

static coll_result host_exec_begin(struct coll_comm *comm, const coll_work *w,
                                   const coll_mem_ops **ops, coll_conn ***send, coll_conn ***recv,
                                   size_t *slot_bytes) {
  (void)ops, (void)send, (void)recv, (void)slot_bytes;
  if (!w->device) return COLL_OK;
  return coll_fail(comm, COLL_ERR_INTERNAL, "device work in a build without CUDA");
}
static coll_result host_exec_end(struct coll_comm *comm, const coll_work *w, coll_result r) {
  (void)comm, (void)w;
  return r;
}
static void host_work_done(coll_work *w) { (void)w; }

static bool host_peer_wanted(struct coll_comm *comm) {
  (void)comm;
  return false;
}
static void host_peer_describe(struct coll_comm *comm, const char *fn, const coll_work *w,
                               void *out) {
  (void)comm, (void)fn, (void)w;
  memset(out, 0, COLL_DEVICE_DESC_BYTES);
}
static coll_result host_peer_map(struct coll_comm *comm, const char *fn, coll_work *w,
                                 const void *descs) {
  (void)comm, (void)fn, (void)descs;
  w->peer_ok = false;
  return COLL_OK;
}
static coll_result host_peer_finish(struct coll_comm *comm, coll_work *w, coll_result r) {
  (void)comm, (void)w;
  return r;
}
static void *host_peer_done_event(struct coll_comm *comm) {
  (void)comm;
  return NULL;
}
static coll_result host_wait_event(struct coll_comm *comm, void *event, const char *what) {
  (void)event, (void)what;
  return coll_fail(comm, COLL_ERR_INTERNAL, "a device event in a build without CUDA");
}
static void host_peer_poison(struct coll_comm *comm) { (void)comm; }

static coll_result host_stream_sync(struct coll_stream *s) {
  (void)s;
  return COLL_OK;
}
static bool host_stream_idle(struct coll_stream *s) {
  (void)s;
  return true;
}
static void host_stream_free(struct coll_stream *s) { (void)s; }
static void host_ticket_done_locked(struct coll_stream *s, uint32_t t) { (void)s, (void)t; }

const coll_device_ops coll_device_host = {
    .name = "host",
    .comm_setup = host_comm_setup,
    .comm_free = host_comm_free,
    .comm_lazy = host_comm_lazy,
    .comm_wake = host_comm_wake,
    .prepare = host_prepare,
    .prepare_stream = host_prepare_stream,
    .after_submit = host_after_submit,
    .exec_begin = host_exec_begin,
    .exec_end = host_exec_end,
    .work_done = host_work_done,
    .peer_wanted = host_peer_wanted,
    .peer_describe = host_peer_describe,
    .peer_map = host_peer_map,
    .peer_finish = host_peer_finish,
    .peer_done_event = host_peer_done_event,
    .wait_event = host_wait_event,
    .peer_poison = host_peer_poison,
    .stream_sync = host_stream_sync,
    .stream_idle = host_stream_idle,
    .stream_free = host_stream_free,
    .ticket_done_locked = host_ticket_done_locked,
};
