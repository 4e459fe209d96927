// core.hpp — the PyTorch binding's core, independent of which c10d base class exposes it:
// a libcoll communicator made through a c10d store, every torch collective mapped onto
// libcoll calls enqueued on a coll_stream, and the Work that waits for that stream.
// CUDA tensors go on the coll_stream that wraps the tensor's current CUDA stream (NCCL's
// semantics), reached through c10's device-generic interfaces so that the module never
// links libc10_cuda nor the CUDA runtime.
//
// The adapter (backend.cpp, torch 2.x's c10d::Backend) only forwards its virtual methods
// here.  This file must never include the adapter's headers (Backend.hpp) nor touch Python.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <coll.h>

namespace libcoll_torch {

// A coll_stream, destroyed (after it synchronized) with its last owner: the operations of
// a coalescing region share one.
using Stream = std::shared_ptr<coll_stream>;

// One enqueued operation: the stream it went on, the tensors it must keep alive, what to
// do once it finished (copy results back into non-contiguous tensors), and its future.
// The stream is synchronized exactly once, by whichever comes first: wait(), or the
// core's completion thread (which is what completes getFuture() without anyone waiting).
// An operation of a coalescing region (in_region) is a follower: its libcoll calls run only
// once the region ends, so until arm() it cannot be waited for, and then the region's Work
// (its leader) synchronizes the stream they share and hands it the result (follow()).
//
// A CUDA operation (the second constructor) was enqueued on the current CUDA stream of its
// device, copies back included, and `done` was recorded there after it.  Its wait() blocks
// no thread: it makes the caller's current stream wait for `done` (nothing to do on the
// same stream).  The completion thread settles it by synchronizing `done`, not the whole
// stream, then completes the future.  libcoll reports a CUDA stream's errors per stream:
// a failure reaches the Work settled first once the stream is idle (see settle()).
class Work : public c10d::Work {
 public:
  Work(int rank, c10d::OpType type, Stream stream, std::string what,
       std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep, std::function<void()> after,
       bool in_region = false);
  Work(int rank, c10d::OpType type, Stream stream, std::string what,
       std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep, c10::Stream on,
       c10::Event done);
  bool isCompleted() override;
  bool wait(std::chrono::milliseconds timeout) override;
  // NCCL's meaning for a CUDA operation: the current stream waits for it.  A host
  // operation keeps c10d's (nothing to order with a stream).
  void synchronize() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override;
  // Blocks until the stream is done, then finishes the Work and completes the future.
  void settle();
  // A follower's region ended: the stream now carries its calls.
  void arm() { armed_ = true; }
  // Makes this Work the leader of `followers`, before anyone can settle it.
  void lead(std::vector<c10::intrusive_ptr<Work>> followers) { followers_ = std::move(followers); }
  // A follower finishes with its leader's result r (sentence: why it failed).
  void follow(coll_result r, const char *sentence);

 private:
  // With settle_mu_ held: record the stream's result, run `after`, finish.  Returns
  // whether the future should be completed (by the caller, without the lock).
  void record(coll_result r, const char *sentence);
  void complete_future();
  // A CUDA operation's end: its result once `done` completed, with settle_mu_ held.
  void record_cuda();
  // A CUDA operation that already failed throws its error.
  void rethrow_failure();

  std::mutex settle_mu_;
  bool settled_ = false;
  std::atomic<bool> armed_;
  const bool follower_;
  std::vector<c10::intrusive_ptr<Work>> followers_;
  Stream stream_;
  std::string what_;
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> keep_;
  std::function<void()> after_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  // A CUDA operation: the CUDA stream it went on, and the event recorded after it.
  std::optional<c10::Stream> on_;
  std::optional<c10::Event> done_;
};

class Core {
 public:
  // Collective over the group: rank 0 puts a libcoll unique id in `store`, every rank
  // joins; the communicator's timeout becomes `timeout`.  Throws with libcoll's sentence.
  Core(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
       std::chrono::milliseconds timeout);
  ~Core();
  Core(const Core &) = delete;
  Core &operator=(const Core &) = delete;

  using WorkPtr = c10::intrusive_ptr<c10d::Work>;
  using Tensors = std::vector<at::Tensor>;
  using TensorLists = std::vector<std::vector<at::Tensor>>;

  WorkPtr broadcast(Tensors &tensors, const c10d::BroadcastOptions &opts);
  WorkPtr allreduce(Tensors &tensors, const c10d::AllreduceOptions &opts);
  WorkPtr allreduce_coalesced(Tensors &tensors, const c10d::AllreduceCoalescedOptions &opts);
  WorkPtr reduce(Tensors &tensors, const c10d::ReduceOptions &opts);
  WorkPtr allgather(TensorLists &outputs, Tensors &inputs, const c10d::AllgatherOptions &opts);
  WorkPtr allgather_base(at::Tensor &output, at::Tensor &input, const c10d::AllgatherOptions &opts);
  WorkPtr allgather_coalesced(TensorLists &outputs, Tensors &inputs,
                              const c10d::AllgatherOptions &opts);
  WorkPtr gather(TensorLists &outputs, Tensors &inputs, const c10d::GatherOptions &opts);
  WorkPtr scatter(Tensors &outputs, TensorLists &inputs, const c10d::ScatterOptions &opts);
  WorkPtr reduce_scatter(Tensors &outputs, TensorLists &inputs,
                         const c10d::ReduceScatterOptions &opts);
  WorkPtr reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                              const c10d::ReduceScatterOptions &opts);
  // One tensor per operation, several operations in one Work: the functional collectives
  // (funcol, hence DTensor and tensor parallelism) call these even for a single tensor.
  WorkPtr allgather_into_tensor_coalesced(Tensors &outputs, Tensors &inputs,
                                          const c10d::AllgatherOptions &opts);
  WorkPtr reduce_scatter_tensor_coalesced(Tensors &outputs, Tensors &inputs,
                                          const c10d::ReduceScatterOptions &opts);
  WorkPtr alltoall_base(at::Tensor &output, at::Tensor &input, std::vector<int64_t> &output_splits,
                        std::vector<int64_t> &input_splits, const c10d::AllToAllOptions &opts);
  WorkPtr alltoall(Tensors &outputs, Tensors &inputs, const c10d::AllToAllOptions &opts);
  WorkPtr send(Tensors &tensors, int dst, int tag);
  WorkPtr recv(Tensors &tensors, int src, int tag);
  WorkPtr recv_anysource(Tensors &tensors, int tag);
  WorkPtr barrier(const c10d::BarrierOptions &opts);

  // c10d's coalescing (batch_isend_irecv, _coalescing_manager with a device): every
  // operation the calling thread issues on this group until end_coalescing goes on one
  // stream inside a libcoll group (coll_group_start/end), so its sends and receives move
  // as one operation: crossing sends cannot deadlock whatever their size or order (one at
  // a time, libcoll runs a communicator's operations in call order, and a large send
  // waits for its receive).  end_coalescing returns the Work of the whole region; each
  // operation's own Work completes with it.  Regions do not nest, and one is opened,
  // filled and closed on one thread (libcoll's groups are per thread); other threads'
  // operations meanwhile run as usual.
  void start_coalescing();
  WorkPtr end_coalescing();

  // The blocking path of dist.all_reduce, all_gather_into_tensor, reduce_scatter_tensor and
  // all_to_all_single with async_op=False (backend.cpp's Python wrappers): `op` calls one
  // of the methods above, which then runs libcoll's blocking call on the caller's thread —
  // no stream, no Work, no hand-off to libcoll's progress thread nor to the completion
  // thread — and returns a null Work.  Ordered after every operation launched before it
  // (libcoll runs a communicator's calls in call order).  Throws libcoll's sentence.
  void now(const std::function<void()> &op);

  // Stops the completion thread and destroys the communicator; idempotent (the
  // destructor calls it too).  The completion thread may need the GIL: dropping the last
  // reference to a tensor whose Python object C++ owns decrefs it under the GIL.  So an
  // adapter calls this with the GIL released, or a destroy_process_group() that holds it
  // would wait for that thread forever.
  void shutdown();

  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  // Makes a stream, lets `enqueue` put libcoll calls on it, hands the Work to the
  // completion thread (in a coalescing region: the region's stream, and the Work waits
  // for end_coalescing).  A call libcoll refuses throws its sentence.
  // On a CUDA device (`dev`: a CUDA device, from place()), the libcoll calls and `after`
  // go on that device's current CUDA stream (launch_cuda).
  WorkPtr launch(c10d::OpType type, const char *what, Tensors outputs, Tensors keep,
                 std::function<coll_result(coll_stream_t)> enqueue,
                 std::function<void()> after = nullptr,
                 std::optional<c10::Device> dev = std::nullopt);
  WorkPtr launch_cuda(c10d::OpType type, const char *what, Tensors outputs, Tensors keep,
                      const std::function<coll_result(coll_stream_t)> &enqueue,
                      const std::function<void()> &after, c10::Device dev);
  // The coll_stream wrapping CUDA stream `cs` of device `dev`, made on first use and kept
  // until shutdown (making one allocates pinned memory; destroying one drains `cs`).
  Stream cuda_stream(c10::Device dev, void *cs, const char *what);
  [[noreturn]] void fail(const char *what, coll_result r) const;
  void completion_main();

  int rank_, size_;
  coll_comm_t comm_ = nullptr;
  std::mutex qmu_;
  std::condition_variable qcv_;
  std::deque<c10::intrusive_ptr<Work>> queue_;
  bool stop_ = false;
  std::thread thread_;
  // The open coalescing region: the thread that opened it (none: no region), its stream
  // and its operations, touched only by that thread.
  std::atomic<std::thread::id> co_thread_{};
  Stream co_stream_;
  std::vector<c10::intrusive_ptr<Work>> co_parts_;
  // The coll_streams of CUDA streams, by (device index, cudaStream_t).
  std::mutex cuda_mu_;
  std::map<std::pair<int, void *>, Stream> cuda_streams_;
};

}  // namespace libcoll_torch
