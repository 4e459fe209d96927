// core.cpp — torch tensors onto libcoll calls (see core.hpp): dtype and op mapping,
// staging of non-contiguous tensors, one coll_stream per operation, the Work that
// synchronizes it, and the completion thread that completes futures nobody waits on.
//
// Mapping: float16/bfloat16/float32/float64/int8/uint8/int32/int64 are libcoll dtypes;
// bool is uint8 (SUM and MAX as MAX = logical or, PRODUCT and MIN as MIN = logical and,
// as ProcessGroupNCCL does); complex64/128 are float pairs (SUM, AVG, PREMUL_SUM only).
// Operations that only move data (broadcast, gathers, scatter, all-to-all, send/recv) move
// bytes, so they take every dtype.  PREMUL_SUM scales a copy of the input, then sums.
// Bitwise reductions are refused.  Non-contiguous tensors go through a contiguous copy
// that is copied back once the operation finished.
//
// CUDA tensors (all of one call on one device) take the same mapping on device memory:
// staging copies, libcoll's calls and the copies back are all enqueued on the device's
// current CUDA stream, in that order, so no thread waits for any of them (launch_cuda).
// libcoll's device data path serves all-reduce, reduce, reduce-scatter, all-gather and
// broadcast; the other collectives on device buffers take its host-driven path.
//
// It must never block the caller on the network (only wait() and the completion thread
// wait), never print, and never swallow libcoll's sentence.
#include "core.hpp"

#include <climits>
#include <cstring>
#include <stdexcept>

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "coll_config.h"
#if COLL_HAVE_CUDA
#include <coll_cuda.h>
#endif

namespace libcoll_torch {

namespace {

// The OpTypes of the coalesced tensor collectives came after torch 2.11 (the first GPU
// run of this binding, on torch 2.11, stopped at them in the compiler): where the
// enum lacks one, the Work says COALESCED, which every torch 2.x has.
template <typename T = c10d::OpType>
constexpr T allgather_into_tensor_coalesced_op() {
  if constexpr (requires { T::ALLGATHER_INTO_TENSOR_COALESCED; })
    return T::ALLGATHER_INTO_TENSOR_COALESCED;
  else
    return T::COALESCED;
}
template <typename T = c10d::OpType>
constexpr T reduce_scatter_tensor_coalesced_op() {
  if constexpr (requires { T::REDUCE_SCATTER_TENSOR_COALESCED; })
    return T::REDUCE_SCATTER_TENSOR_COALESCED;
  else
    return T::COALESCED;
}

std::runtime_error error(const std::string &what, const std::string &sentence) {
  return std::runtime_error("libcoll " + what + ": " + sentence);
}

// libcoll's sentence for a failed call, saying first that it was the process group's
// timeout when it was (torch's callers look for the word, as Gloo's "Timed out" gives it).
std::string failure(coll_result r, const char *sentence) {
  std::string s = sentence && *sentence ? sentence : coll_result_string(r);
  return r == COLL_ERR_TIMEOUT ? "its timeout passed: " + s : s;
}

// Where one call's tensors are: nullopt for the CPU, else their CUDA device.
using Dev = std::optional<c10::Device>;

std::string where(const Dev &d) { return d ? d->str() : "cpu"; }

// The device of every tensor in `ts`, which must all be dense and on one device: the CPU,
// or one CUDA device where this build has CUDA.
Dev place(const std::vector<at::Tensor> &ts, const char *what) {
  Dev dev;
  bool first = true;
  for (const at::Tensor &t : ts) {
    if (t.is_sparse())
      throw error(what, "the libcoll backend takes dense tensors only, this one is sparse");
    c10::Device d = t.device();
    if (!d.is_cpu() && !d.is_cuda())
      throw error(what,
                  "the libcoll backend takes CPU and CUDA tensors, this one is on " + d.str());
    if (d.is_cuda() && !COLL_HAVE_CUDA)
      throw error(what, "this libcoll_torch was built without CUDA (meson -Dcuda, nvcc), so it "
                        "takes CPU tensors only; this one is on " +
                            d.str());
    Dev here = d.is_cuda() ? Dev(d) : std::nullopt;
    if (first) {
      dev = here;
      first = false;
    } else if (here != dev) {
      throw error(what, "the tensors of one call must all be on one device, this call has "
                        "tensors on " +
                            where(dev) + " and on " + d.str());
    }
  }
  return dev;
}

Dev check_one(const std::vector<at::Tensor> &ts, const char *what) {
  if (ts.size() != 1)
    throw error(what, "the libcoll backend takes one tensor per call (one process per "
                      "device), got " +
                          std::to_string(ts.size()));
  return place(ts, what);
}

// `a` followed by every tensor of `lists`, for place().
std::vector<at::Tensor> all_of(std::vector<at::Tensor> a,
                               const std::vector<std::vector<at::Tensor>> &lists) {
  for (auto &l : lists) a.insert(a.end(), l.begin(), l.end());
  return a;
}

size_t nbytes(const at::Tensor &t) { return (size_t)t.numel() * t.element_size(); }

// The tensor itself if contiguous, else a contiguous copy (copied back by `after`).
at::Tensor wire_of(const at::Tensor &t) { return t.is_contiguous() ? t : t.contiguous(); }

// Copies `wire` back into `user` when they differ.
void copy_back(const at::Tensor &user, const at::Tensor &wire) {
  if (!user.is_same(wire)) user.copy_(wire);
}

// Bytes of `src` (any layout) into dst.
void pack(uint8_t *dst, const at::Tensor &src) {
  at::Tensor c = src.contiguous();
  if (c.numel()) std::memcpy(dst, c.data_ptr(), nbytes(c));
}

// Bytes at src into `dst` (any layout).
void unpack(const at::Tensor &dst, const uint8_t *src) {
  if (!dst.numel()) return;
  if (dst.is_contiguous()) {
    std::memcpy(dst.data_ptr(), src, nbytes(dst));
    return;
  }
  at::Tensor c = at::empty(dst.sizes(), dst.options());
  std::memcpy(c.data_ptr(), src, nbytes(c));
  dst.copy_(c);
}

at::Tensor byte_buffer(size_t n) { return at::empty({(int64_t)n}, at::kByte); }
uint8_t *bytes_of(const at::Tensor &t) { return (uint8_t *)t.data_ptr(); }

// A staging buffer of n bytes on the call's device.
at::Tensor byte_buffer(size_t n, const Dev &dev) {
  if (!dev) return byte_buffer(n);
  return at::empty({(int64_t)n}, at::TensorOptions().dtype(at::kByte).device(*dev));
}

// The bytes of contiguous `t` as a 1-D uint8 tensor sharing its memory.
at::Tensor byte_view(const at::Tensor &t) { return t.reshape({-1}).view(at::kByte); }

// Bytes of `src` (any layout) into `flat` (a byte buffer) at byte `off`: memcpy on the
// CPU, a copy enqueued on the current stream for CUDA (a kernel cannot memcpy).
void pack_into(const at::Tensor &flat, size_t off, const at::Tensor &src) {
  if (!flat.is_cuda()) return pack(bytes_of(flat) + off, src);
  if (src.numel())
    flat.narrow(0, (int64_t)off, (int64_t)nbytes(src)).copy_(byte_view(src.contiguous()));
}

// Bytes of `flat` at byte `off` into `dst` (any layout), as pack_into.
void unpack_from(const at::Tensor &dst, const at::Tensor &flat, size_t off) {
  if (!flat.is_cuda()) return unpack(dst, bytes_of(flat) + off);
  if (!dst.numel()) return;
  at::Tensor region = flat.narrow(0, (int64_t)off, (int64_t)nbytes(dst));
  if (dst.is_contiguous()) {
    byte_view(dst).copy_(region);
    return;
  }
  at::Tensor c = at::empty(dst.sizes(), dst.options());
  byte_view(c).copy_(region);
  dst.copy_(c);
}

// A reduction's libcoll dtype and element multiplier (2 for complex), or a refusal.
struct Typed {
  coll_dtype dtype;
  size_t mult;
};

Typed typed(at::ScalarType t, const char *what) {
  switch (t) {
  case at::kFloat: return {COLL_FLOAT32, 1};
  case at::kDouble: return {COLL_FLOAT64, 1};
  case at::kHalf: return {COLL_FLOAT16, 1};
  case at::kBFloat16: return {COLL_BFLOAT16, 1};
  case at::kChar: return {COLL_INT8, 1};
  case at::kByte: return {COLL_UINT8, 1};
  case at::kInt: return {COLL_INT32, 1};
  case at::kLong: return {COLL_INT64, 1};
  case at::kBool: return {COLL_UINT8, 1};
  case at::kComplexFloat: return {COLL_FLOAT32, 2};
  case at::kComplexDouble: return {COLL_FLOAT64, 2};
  default:
    throw error(what, std::string("libcoll cannot reduce ") + c10::toString(t) +
                          " tensors (it reduces float16, bfloat16, float32, float64, int8, "
                          "uint8, int32, int64, bool and complex64/128)");
  }
}

const char *op_name(c10d::ReduceOp::RedOpType op) {
  switch (op) {
  case c10d::ReduceOp::SUM: return "SUM";
  case c10d::ReduceOp::AVG: return "AVG";
  case c10d::ReduceOp::PRODUCT: return "PRODUCT";
  case c10d::ReduceOp::MIN: return "MIN";
  case c10d::ReduceOp::MAX: return "MAX";
  case c10d::ReduceOp::BAND: return "BAND";
  case c10d::ReduceOp::BOR: return "BOR";
  case c10d::ReduceOp::BXOR: return "BXOR";
  case c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
  default: return "an unknown ReduceOp";
  }
}

// A reduction as libcoll runs it: dtype, multiplier, op, and the PREMUL_SUM factor.
struct Reduction {
  Typed ty{COLL_FLOAT32, 1};
  coll_op op = COLL_SUM;
  bool premul = false;
  double factor = 1.0;
  at::Tensor factor_tensor;  // defined when the factor is a tensor
};

Reduction reduction(const c10d::ReduceOp &rop, at::ScalarType t, const char *what) {
  Reduction r;
  r.ty = typed(t, what);
  r.op = COLL_SUM;
  const bool is_bool = t == at::kBool, is_complex = at::isComplexType(t);
  const auto op = rop.op_;
  auto refuse = [&](const std::string &why) -> Reduction {
    throw error(what, std::string("ReduceOp.") + op_name(op) +
                          " is not supported by the "
                          "libcoll backend" +
                          why);
  };
  switch (op) {
  case c10d::ReduceOp::SUM: r.op = is_bool ? COLL_MAX : COLL_SUM; break;
  case c10d::ReduceOp::AVG:
    if (is_bool) return refuse(" on bool tensors");
    r.op = COLL_AVG;
    break;
  case c10d::ReduceOp::PRODUCT:
    if (is_complex) return refuse(" on complex tensors (only SUM and AVG are)");
    r.op = is_bool ? COLL_MIN : COLL_PROD;
    break;
  case c10d::ReduceOp::MIN:
  case c10d::ReduceOp::MAX:
    if (is_complex) return refuse(" on complex tensors (only SUM and AVG are)");
    r.op = op == c10d::ReduceOp::MIN ? COLL_MIN : COLL_MAX;
    break;
  case c10d::ReduceOp::PREMUL_SUM: {
    if (is_bool) return refuse(" on bool tensors");
    auto *s = dynamic_cast<c10d::NCCLPreMulSumSupplement *>(rop.supplement_.get());
    if (!s) return refuse(" without its factor");
    r.premul = true;
    r.op = COLL_SUM;
    r.factor_tensor = s->tensor_factor;
    if (!r.factor_tensor.defined()) r.factor = s->double_factor;
    break;
  }
  default:
    return refuse(": libcoll has no bitwise reductions (it has SUM, PRODUCT, MIN, MAX, "
                  "AVG and PREMUL_SUM)");
  }
  return r;
}

// The input scaled for PREMUL_SUM (a new tensor), or `t` itself.
at::Tensor scaled(const Reduction &r, const at::Tensor &t) {
  if (!r.premul) return t;
  if (r.factor_tensor.defined()) return t.mul(r.factor_tensor.to(t.device()));
  return t.mul(r.factor);
}

size_t count_of(const Reduction &r, const at::Tensor &t) { return (size_t)t.numel() * r.ty.mult; }

void same_shape(const at::Tensor &a, const at::Tensor &b, const char *what, const char *which) {
  if (a.scalar_type() != b.scalar_type() || a.numel() != b.numel())
    throw error(what, std::string(which) + " holds " + std::to_string(a.numel()) + " " +
                          c10::toString(a.scalar_type()) + " elements where " +
                          std::to_string(b.numel()) + " " + c10::toString(b.scalar_type()) +
                          " were expected");
}

int check_root(int64_t root, int size, const char *what) {
  if (root < 0 || root >= size)
    throw error(what, "root " + std::to_string(root) + " is not a rank of this group of " +
                          std::to_string(size));
  return (int)root;
}

}  // namespace

// ---------------------------------------------------------------------------- Work

Work::Work(int rank, c10d::OpType type, Stream stream, std::string what,
           std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep,
           std::function<void()> after, bool in_region)
    : c10d::Work(rank, type), armed_(!in_region), follower_(in_region), stream_(std::move(stream)),
      what_(std::move(what)), outputs_(std::move(outputs)), keep_(std::move(keep)),
      after_(std::move(after)), future_(c10::make_intrusive<c10::ivalue::Future>(
                                    c10::ListType::create(c10::TensorType::get()))) {}

Work::Work(int rank, c10d::OpType type, Stream stream, std::string what,
           std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep, c10::Stream on,
           c10::Event done)
    : Work(rank, type, std::move(stream), std::move(what), std::move(outputs), std::move(keep),
           nullptr) {
  on_ = on;
  done_.emplace(std::move(done));
}

void Work::record(coll_result r, const char *sentence) {
  std::exception_ptr e;
  if (r != COLL_OK) {
    e = std::make_exception_ptr(error(what_ + " failed", failure(r, sentence)));
  } else if (after_) {
    try {
      after_();
    } catch (const std::exception &x) {
      e = std::make_exception_ptr(error(what_ + " failed copying its result", x.what()));
    }
  }
  after_ = nullptr;
  keep_.clear();
  // The region's operations share its result, and finish before the region does: waiting
  // for the region is waiting for their copies back too.
  for (auto &f : followers_) f->follow(r, sentence);
  followers_.clear();
  settled_ = true;
  finish(e);
}

void Work::complete_future() {
  std::exception_ptr e = exception();
  if (e)
    future_->setError(e);
  else
    future_->markCompleted(c10::IValue(outputs_));
}

// libcoll counts a CUDA stream's calls and keeps the first error per stream, not per
// call: once `done_` completed this operation has ended, but coll_stream_query answers
// "in progress" while later calls on the same CUDA stream run.  Then this one counts as
// done, and an error stays with the stream for the first Work that finds it idle (or the
// next call, on a communicator libcoll has marked failed).  Drops the stream: a settled
// Work outliving the core must not hold what shutdown destroys.
void Work::record_cuda() {
  coll_result r = coll_stream_query(stream_.get());
  const char *sentence = nullptr;
  if (r == COLL_IN_PROGRESS)
    r = COLL_OK;
  else if (r != COLL_OK)
    sentence = coll_comm_last_error(nullptr);
  std::string s = sentence ? sentence : "";
  stream_.reset();
  record(r, sentence ? s.c_str() : nullptr);
}

void Work::settle() {
  if (follower_) return;  // its region's Work settles it
  {
    std::lock_guard<std::mutex> g(settle_mu_);
    if (settled_) return;
    if (done_) {
      std::string bad;
      try {
        done_->synchronize();  // the operation's end, not the stream's
      } catch (const c10::Error &x) {
        bad = x.what_without_backtrace();
      } catch (const std::exception &x) { bad = x.what(); }
      if (bad.empty()) {
        record_cuda();
      } else {
        stream_.reset();
        record(COLL_ERR_SYSTEM, ("waiting for its CUDA event: " + bad).c_str());
      }
    } else {
      coll_result r = coll_stream_synchronize(stream_.get());
      record(r, r == COLL_OK ? nullptr : coll_comm_last_error(nullptr));
    }
  }
  complete_future();
}

void Work::follow(coll_result r, const char *sentence) {
  {
    std::lock_guard<std::mutex> g(settle_mu_);
    if (settled_) return;
    armed_ = true;
    record(r, sentence);
  }
  complete_future();
}

bool Work::isCompleted() {
  if (follower_) {
    std::lock_guard<std::mutex> g(mutex_);
    return completed_;
  }
  {
    std::unique_lock<std::mutex> g(settle_mu_, std::try_to_lock);
    if (!g.owns_lock()) return false;  // another thread is synchronizing it right now
    if (settled_) return true;
    if (done_) {
      bool ended = true;
      std::string bad;
      try {
        ended = done_->query();
      } catch (const c10::Error &x) {
        bad = x.what_without_backtrace();
      } catch (const std::exception &x) { bad = x.what(); }
      if (!ended) return false;
      if (bad.empty()) {
        record_cuda();
      } else {
        stream_.reset();
        record(COLL_ERR_SYSTEM, ("querying its CUDA event: " + bad).c_str());
      }
      g.unlock();
      complete_future();
      return true;
    }
    coll_result r = coll_stream_query(stream_.get());
    if (r == COLL_IN_PROGRESS) return false;
    record(r, r == COLL_OK ? nullptr : coll_comm_last_error(nullptr));
  }
  complete_future();
  return true;
}

void Work::rethrow_failure() {
  std::exception_ptr e = exception();
  if (e) std::rethrow_exception(e);
}

void Work::synchronize() {
  if (!done_) {
    c10d::Work::synchronize();  // a host operation: as before CUDA came
    return;
  }
  rethrow_failure();
  // The caller's current stream on the operation's device; nothing to wait for on the
  // stream the operation went on (stream order already puts it first).
  auto *impl = c10::impl::getDeviceGuardImpl(on_->device_type());
  c10::Stream cur = impl->getStream(on_->device());
  if (cur != *on_) done_->block(cur);
}

bool Work::wait(std::chrono::milliseconds timeout) {
  // A CUDA operation: as NCCL's, the wait is the current stream's, not the caller's (a
  // timeout has nothing to bound: no thread waits).  A failure already known is raised.
  if (done_) {
    synchronize();
    return true;
  }
  if (!armed_)
    throw error(what_, "was waited for inside its coalescing region: its libcoll calls run only "
                       "once the region ends (endCoalescing), so wait for it after that");
  if (timeout == std::chrono::milliseconds(0) && !follower_) {
    settle();
  } else if (timeout == std::chrono::milliseconds(0)) {
    std::unique_lock<std::mutex> g(mutex_);
    cv_.wait(g, [this] { return completed_; });  // the stream is the region's: see follow()
  } else {
    // The completion thread settles every Work (finish() then signals the base class's
    // cv_): wait for that, up to the deadline, without polling.  The communicator's own
    // timeout still bounds the operation itself.
    std::unique_lock<std::mutex> g(mutex_);
    if (!cv_.wait_for(g, timeout, [this] { return completed_; }))
      throw error(what_, "did not finish within " + std::to_string(timeout.count()) +
                             " ms (Work.wait timeout)");
  }
  std::exception_ptr e = exception();
  if (e) std::rethrow_exception(e);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> Work::getFuture() { return future_; }

std::vector<at::Tensor> Work::result() { return outputs_; }

// ---------------------------------------------------------------------------- Core

Core::Core(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
           std::chrono::milliseconds timeout)
    : rank_(rank), size_(size) {
  // Generation: how many times this group's store has seen a libcoll init, so that a
  // store reused by a second init_process_group gets a fresh id.
  int64_t n = store->add("libcoll/init", 1);
  std::string key = "libcoll/id/" + std::to_string((n - 1) / size);
  coll_unique_id id;
  if (rank == 0) {
    coll_result r = coll_get_unique_id(&id);
    if (r != COLL_OK) throw error("init", coll_comm_last_error(nullptr));
    store->set(key, std::vector<uint8_t>(id.internal, id.internal + sizeof id.internal));
  } else {
    std::vector<uint8_t> v = store->get(key);
    if (v.size() != sizeof id.internal)
      throw error("init", "the store's " + key + " holds " + std::to_string(v.size()) +
                              " bytes, not a libcoll unique id of " +
                              std::to_string(sizeof id.internal));
    std::memcpy(id.internal, v.data(), v.size());
  }
  coll_result r = coll_comm_init_rank(&comm_, size, id, rank);
  if (r != COLL_OK) throw error("init", coll_comm_last_error(nullptr));
  long long ms = timeout.count();
  r = coll_comm_set_timeout(comm_, ms < 0 ? 0 : ms > INT_MAX ? INT_MAX : (int)ms);
  if (r != COLL_OK) {
    std::string s = coll_comm_last_error(comm_);
    coll_comm_abort(comm_);
    throw error("init", s);
  }
  thread_ = std::thread([this] { completion_main(); });
}

Core::~Core() { shutdown(); }

void Core::shutdown() {
  {
    std::lock_guard<std::mutex> g(qmu_);
    stop_ = true;
  }
  qcv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // Every Work was settled and let go of its CUDA stream's coll_stream: destroying them
  // drains their CUDA streams, which needs the communicator still alive.
  std::map<std::pair<int, void *>, Stream> streams;
  {
    std::lock_guard<std::mutex> g(cuda_mu_);
    streams.swap(cuda_streams_);
  }
  streams.clear();
  if (comm_) coll_comm_destroy(comm_);
  comm_ = nullptr;
}

// Settles the Works in the order they were enqueued (the order libcoll runs them), so
// that every future completes although nobody calls wait().
void Core::completion_main() {
  for (;;) {
    c10::intrusive_ptr<Work> w;
    {
      std::unique_lock<std::mutex> g(qmu_);
      qcv_.wait(g, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      w = std::move(queue_.front());
      queue_.pop_front();
    }
    w->settle();
  }
}

void Core::fail(const char *what, coll_result r) const {
  const char *s = coll_comm_last_error(comm_);
  throw error(what, s && *s ? s : coll_result_string(r));
}

namespace {
Stream new_stream(const char *what) {
  coll_stream_t s;
  if (coll_stream_create(&s) != COLL_OK) throw error(what, coll_comm_last_error(nullptr));
  return Stream(s, [](coll_stream_t p) { coll_stream_destroy(p); });  // synchronizes first
}

// Set by Core::now around one operation on this thread: launch runs it blocking.  Cleared
// on every way out of the operation, a throw included.
thread_local bool blocking_now = false;
struct BlockingNow {
  BlockingNow() { blocking_now = true; }
  ~BlockingNow() { blocking_now = false; }
};
}  // namespace

void Core::now(const std::function<void()> &op) {
  if (co_thread_.load() == std::this_thread::get_id())
    throw error("a blocking call", "cannot run inside this thread's coalescing region");
  BlockingNow scope;
  op();
}

Core::WorkPtr Core::launch(c10d::OpType type, const char *what, Tensors outputs, Tensors keep,
                           std::function<coll_result(coll_stream_t)> enqueue,
                           std::function<void()> after, std::optional<c10::Device> dev) {
  if (dev)
    return launch_cuda(type, what, std::move(outputs), std::move(keep), enqueue, after, *dev);
  if (blocking_now) {  // Core::now: libcoll's blocking call (a NULL stream), then the copy back
    coll_result r = enqueue(nullptr);
    if (r != COLL_OK)
      throw error(std::string(what) + " failed", failure(r, coll_comm_last_error(comm_)));
    if (after) after();
    return WorkPtr();
  }
  const bool grouped = co_thread_.load() == std::this_thread::get_id();
  Stream st = grouped ? co_stream_ : new_stream(what);
  coll_result r = enqueue(st.get());
  if (r != COLL_OK) {
    // Outside a region the stream goes with `st` (waiting for what an earlier call of this
    // op enqueued); inside one libcoll left the refused call out and the region stays open.
    std::string s = coll_comm_last_error(comm_);
    throw error(what, s.empty() ? coll_result_string(r) : s);
  }
  auto w = c10::make_intrusive<Work>(rank_, type, st, what, std::move(outputs), std::move(keep),
                                     std::move(after), grouped);
  if (grouped) {
    co_parts_.push_back(w);  // armed and queued by end_coalescing
    return w;
  }
  {
    std::lock_guard<std::mutex> g(qmu_);
    queue_.push_back(w);
  }
  qcv_.notify_one();
  return w;
}

Stream Core::cuda_stream(c10::Device dev, void *cs, const char *what) {
  std::lock_guard<std::mutex> g(cuda_mu_);
  auto key = std::make_pair((int)dev.index(), cs);
  auto it = cuda_streams_.find(key);
  if (it != cuda_streams_.end()) return it->second;
#if COLL_HAVE_CUDA
  coll_stream_t s;
  if (coll_stream_create_cuda(&s, (cudaStream_t)cs) != COLL_OK)
    throw error(what, coll_comm_last_error(nullptr));
  Stream st(s, [](coll_stream_t p) { coll_stream_destroy(p); });  // drains the CUDA stream
  cuda_streams_.emplace(key, st);
  return st;
#else
  (void)cs;
  throw error(what, "this libcoll_torch was built without CUDA");
#endif
}

// The device's current CUDA stream carries everything: the staging copies the caller
// already enqueued, libcoll's calls, then `after` (copies back), then the event the Work
// waits for.  Nothing here waits for the GPU.  A coalescing region's stream is a host
// coll_stream, and libcoll groups no point-to-point calls on device memory: CUDA tensors
// stay out of regions.  Core::now's blocking call is NCCL's for a device: ordered on the
// stream, no Work.
Core::WorkPtr Core::launch_cuda(c10d::OpType type, const char *what, Tensors outputs, Tensors keep,
                                const std::function<coll_result(coll_stream_t)> &enqueue,
                                const std::function<void()> &after, c10::Device dev) {
  if (co_thread_.load() == std::this_thread::get_id())
    throw error(what, "the libcoll backend cannot take CUDA tensors inside a coalescing region "
                      "(batch_isend_irecv, _coalescing_manager): issue these calls one by one");
  c10::DeviceGuard guard(dev);
  auto *impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  c10::Stream on = impl->getStream(dev);
  Stream st = cuda_stream(dev, on.native_handle(), what);
  coll_result r = enqueue(st.get());
  if (r != COLL_OK) {
    std::string s = coll_comm_last_error(comm_);
    throw error(what, s.empty() ? coll_result_string(r) : s);
  }
  if (after) after();
  if (blocking_now) return WorkPtr();
  c10::Event done(c10::DeviceType::CUDA);
  done.record(on);
  auto w = c10::make_intrusive<Work>(rank_, type, st, what, std::move(outputs), std::move(keep), on,
                                     std::move(done));
  {
    std::lock_guard<std::mutex> g(qmu_);
    queue_.push_back(w);
  }
  qcv_.notify_one();
  return w;
}

void Core::start_coalescing() {
  if (co_thread_.load() != std::thread::id())
    throw error("startCoalescing", "a coalescing region is already open on this process group "
                                   "(regions do not nest)");
  Stream st = new_stream("startCoalescing");
  coll_result r = coll_group_start();
  if (r != COLL_OK) {
    const char *s = coll_comm_last_error(nullptr);
    throw error("startCoalescing", s && *s ? s : coll_result_string(r));
  }
  co_stream_ = std::move(st);
  co_parts_.clear();
  co_thread_ = std::this_thread::get_id();
}

// Runs the region's libcoll group, then hands the region's own Work to the completion
// thread: it carries every operation's outputs and leads their Works.  The stream is
// synchronized once, by it (a synchronize returns an error once, then clears it), and it
// hands that result to each operation (copying non-contiguous results back) before it
// completes itself.
Core::WorkPtr Core::end_coalescing() {
  const char *what = "endCoalescing";
  std::thread::id opener = co_thread_.load();
  if (opener == std::thread::id())
    throw error(what, "no coalescing region is open on this process group");
  if (opener != std::this_thread::get_id())
    throw error(what, "the coalescing region was opened on another thread, and libcoll's "
                      "groups belong to the thread that opens them");
  co_thread_ = std::thread::id();
  Stream st = std::move(co_stream_);
  std::vector<c10::intrusive_ptr<Work>> parts = std::move(co_parts_);
  co_parts_.clear();
  coll_result r = coll_group_end();
  if (r != COLL_OK) {
    const char *c = coll_comm_last_error(comm_);
    std::string s = failure(r, c && *c ? c : coll_comm_last_error(nullptr));
    for (auto &p : parts) p->follow(r, ("its coalescing region failed: " + s).c_str());
    throw error(what, s);
  }
  Tensors outputs;
  for (auto &p : parts) {
    Tensors o = p->result();
    outputs.insert(outputs.end(), o.begin(), o.end());
    p->arm();
  }
  auto w = c10::make_intrusive<Work>(rank_, c10d::OpType::COALESCED, st, "coalesced operations",
                                     outputs, Tensors{}, nullptr);
  w->lead(std::move(parts));
  {
    std::lock_guard<std::mutex> g(qmu_);
    queue_.push_back(w);
  }
  qcv_.notify_one();
  return w;
}

// ---------------------------------------------------------------------------- operations

Core::WorkPtr Core::broadcast(Tensors &tensors, const c10d::BroadcastOptions &opts) {
  const char *what = "broadcast";
  Dev dev = check_one(tensors, what);
  int root = check_root(opts.rootRank, size_, what);
  at::Tensor t = tensors[0], w = wire_of(t);
  return launch(
      c10d::OpType::BROADCAST, what, {t}, {w},
      [=, this](coll_stream_t s) {
        return coll_broadcast(w.data_ptr(), w.data_ptr(), nbytes(w), COLL_UINT8, root, comm_, s);
      },
      [=] { copy_back(t, w); }, dev);
}

Core::WorkPtr Core::allreduce(Tensors &tensors, const c10d::AllreduceOptions &opts) {
  const char *what = "all_reduce";
  Dev dev = check_one(tensors, what);
  at::Tensor t = tensors[0];
  Reduction red = reduction(opts.reduceOp, t.scalar_type(), what);
  at::Tensor w = wire_of(t);
  if (red.premul) w = wire_of(scaled(red, w));
  return launch(
      c10d::OpType::ALLREDUCE, what, {t}, {w},
      [=, this](coll_stream_t s) {
        return coll_all_reduce(w.data_ptr(), w.data_ptr(), count_of(red, w), red.ty.dtype, red.op,
                               comm_, s);
      },
      [=] { copy_back(t, w); }, dev);
}

// One all-reduce per dtype over a flat buffer holding that dtype's tensors end to end
// (scaled first for PREMUL_SUM), copied back into the tensors once it finished.  A dtype
// with a single contiguous tensor goes on the wire as it is (nothing to copy back).
Core::WorkPtr Core::allreduce_coalesced(Tensors &tensors,
                                        const c10d::AllreduceCoalescedOptions &opts) {
  const char *what = "all_reduce_coalesced";
  struct Bucket {
    Reduction red;
    std::vector<size_t> members;  // indices into tensors
    at::Tensor flat;
  };
  std::vector<Bucket> buckets;
  Dev dev = place(tensors, what);
  for (size_t i = 0; i < tensors.size(); i++) {
    Bucket *b = nullptr;
    for (auto &x : buckets)
      if (tensors[x.members[0]].scalar_type() == tensors[i].scalar_type()) b = &x;
    if (!b) {
      buckets.push_back({reduction(opts.reduceOp, tensors[i].scalar_type(), what), {}, {}});
      b = &buckets.back();
    }
    b->members.push_back(i);
  }
  Tensors users = tensors, keep;
  for (auto &b : buckets) {
    if (b.members.size() == 1) {
      b.flat = wire_of(scaled(b.red, tensors[b.members[0]])).reshape({-1});
    } else {
      Tensors parts;
      for (size_t i : b.members) parts.push_back(tensors[i].reshape({-1}));
      b.flat = scaled(b.red, at::cat(parts));
    }
    keep.push_back(b.flat);
  }
  return launch(
      c10d::OpType::ALLREDUCE_COALESCED, what, users, keep,
      [=, this](coll_stream_t s) {
        for (auto &b : buckets) {
          coll_result r = coll_all_reduce(b.flat.data_ptr(), b.flat.data_ptr(),
                                          count_of(b.red, b.flat), b.red.ty.dtype, b.red.op, comm_,
                                          s);
          if (r != COLL_OK) return r;
        }
        return COLL_OK;
      },
      [=] {
        for (auto &b : buckets) {
          int64_t off = 0;
          for (size_t i : b.members) {
            const at::Tensor &u = users[i];
            at::Tensor part = b.flat.narrow(0, off, u.numel());
            off += u.numel();
            if (u.numel() && u.data_ptr() != part.data_ptr()) u.copy_(part.view(u.sizes()));
          }
        }
      },
      dev);
}

Core::WorkPtr Core::reduce(Tensors &tensors, const c10d::ReduceOptions &opts) {
  const char *what = "reduce";
  Dev dev = check_one(tensors, what);
  int root = check_root(opts.rootRank, size_, what);
  at::Tensor t = tensors[0];
  Reduction red = reduction(opts.reduceOp, t.scalar_type(), what);
  at::Tensor w = wire_of(t);
  at::Tensor send = red.premul ? wire_of(scaled(red, w)) : w;
  bool is_root = rank_ == root;
  return launch(
      c10d::OpType::REDUCE, what, {t}, {w, send},
      [=, this](coll_stream_t s) {
        return coll_reduce(send.data_ptr(), is_root ? w.data_ptr() : nullptr, count_of(red, w),
                           red.ty.dtype, red.op, root, comm_, s);
      },
      [=] {
        if (is_root) copy_back(t, w);
      },
      dev);
}

Core::WorkPtr Core::allgather(TensorLists &outputs, Tensors &inputs,
                              const c10d::AllgatherOptions &) {
  const char *what = "all_gather";
  Dev dev = check_one(inputs, what);
  if (outputs.size() != 1 || outputs[0].size() != (size_t)size_)
    throw error(what, "takes one list of " + std::to_string(size_) + " output tensors");
  place(all_of(inputs, outputs), what);
  at::Tensor in = wire_of(inputs[0]);
  for (auto &o : outputs[0]) same_shape(o, in, what, "an output tensor");
  size_t b = nbytes(in);
  at::Tensor flat = byte_buffer(b * size_, dev);
  Tensors outs = outputs[0];
  return launch(
      c10d::OpType::ALLGATHER, what, outs, {in, flat},
      [=, this](coll_stream_t s) {
        return coll_all_gather(in.data_ptr(), flat.data_ptr(), b, COLL_UINT8, comm_, s);
      },
      [=] {
        for (size_t i = 0; i < outs.size(); i++) unpack_from(outs[i], flat, i * b);
      },
      dev);
}

Core::WorkPtr Core::allgather_base(at::Tensor &output, at::Tensor &input,
                                   const c10d::AllgatherOptions &) {
  const char *what = "all_gather_into_tensor";
  Dev dev = place({output, input}, what);
  if (output.scalar_type() != input.scalar_type() || output.numel() != input.numel() * size_)
    throw error(what, "the output tensor must hold " + std::to_string(size_) +
                          " times the input's elements, of the same dtype");
  at::Tensor in = wire_of(input), out = wire_of(output), user = output;
  return launch(
      c10d::OpType::_ALLGATHER_BASE, what, {user}, {in, out},
      [=, this](coll_stream_t s) {
        return coll_all_gather(in.data_ptr(), out.data_ptr(), nbytes(in), COLL_UINT8, comm_, s);
      },
      [=] { copy_back(user, out); }, dev);
}

Core::WorkPtr Core::allgather_coalesced(TensorLists &outputs, Tensors &inputs,
                                        const c10d::AllgatherOptions &) {
  const char *what = "all_gather_coalesced";
  if (outputs.size() != (size_t)size_)
    throw error(what, "takes " + std::to_string(size_) + " output lists, one per rank");
  Dev dev = place(all_of(inputs, outputs), what);
  size_t total = 0;
  for (auto &t : inputs) total += nbytes(t);
  for (auto &l : outputs) {
    if (l.size() != inputs.size())
      throw error(what, "every output list must hold one tensor per input tensor");
    for (size_t j = 0; j < l.size(); j++) same_shape(l[j], inputs[j], what, "an output tensor");
  }
  at::Tensor in = byte_buffer(total, dev), flat = byte_buffer(total * size_, dev);
  size_t off = 0;
  for (auto &t : inputs) {
    pack_into(in, off, t);
    off += nbytes(t);
  }
  Tensors outs;
  for (auto &l : outputs) outs.insert(outs.end(), l.begin(), l.end());
  TensorLists lists = outputs;
  return launch(
      c10d::OpType::ALLGATHER_COALESCED, what, outs, {in, flat},
      [=, this](coll_stream_t s) {
        return coll_all_gather(in.data_ptr(), flat.data_ptr(), total, COLL_UINT8, comm_, s);
      },
      [=] {
        for (size_t i = 0; i < lists.size(); i++) {
          size_t o = i * total;
          for (auto &t : lists[i]) {
            unpack_from(t, flat, o);
            o += nbytes(t);
          }
        }
      },
      dev);
}

Core::WorkPtr Core::gather(TensorLists &outputs, Tensors &inputs, const c10d::GatherOptions &opts) {
  const char *what = "gather";
  Dev dev = check_one(inputs, what);
  int root = check_root(opts.rootRank, size_, what);
  at::Tensor in = wire_of(inputs[0]);
  size_t b = nbytes(in);
  bool is_root = rank_ == root;
  Tensors outs;
  at::Tensor flat;
  if (is_root) {
    if (outputs.size() != 1 || outputs[0].size() != (size_t)size_)
      throw error(what, "the root takes one list of " + std::to_string(size_) + " output tensors");
    place(all_of(inputs, outputs), what);
    for (auto &o : outputs[0]) same_shape(o, in, what, "an output tensor");
    outs = outputs[0];
    flat = byte_buffer(b * size_, dev);
  } else if (!outputs.empty() && !outputs[0].empty()) {
    throw error(what, "only the root (rank " + std::to_string(root) + ") takes output tensors");
  }
  return launch(
      c10d::OpType::GATHER, what, outs, {in, flat},
      [=, this](coll_stream_t s) {
        return coll_gather(in.data_ptr(), is_root ? flat.data_ptr() : nullptr, b, COLL_UINT8, root,
                           comm_, s);
      },
      [=] {
        for (size_t i = 0; i < outs.size(); i++) unpack_from(outs[i], flat, i * b);
      },
      dev);
}

Core::WorkPtr Core::scatter(Tensors &outputs, TensorLists &inputs,
                            const c10d::ScatterOptions &opts) {
  const char *what = "scatter";
  Dev dev = check_one(outputs, what);
  int root = check_root(opts.rootRank, size_, what);
  at::Tensor user = outputs[0], out = wire_of(user);
  size_t b = nbytes(out);
  bool is_root = rank_ == root;
  at::Tensor flat;
  if (is_root) {
    if (inputs.size() != 1 || inputs[0].size() != (size_t)size_)
      throw error(what, "the root takes one list of " + std::to_string(size_) + " input tensors");
    place(all_of(outputs, inputs), what);
    flat = byte_buffer(b * size_, dev);
    for (size_t i = 0; i < inputs[0].size(); i++) {
      same_shape(inputs[0][i], out, what, "an input tensor");
      pack_into(flat, i * b, inputs[0][i]);
    }
  } else if (!inputs.empty() && !inputs[0].empty()) {
    throw error(what, "only the root (rank " + std::to_string(root) + ") takes input tensors");
  }
  return launch(
      c10d::OpType::SCATTER, what, {user}, {out, flat},
      [=, this](coll_stream_t s) {
        return coll_scatter(is_root ? flat.data_ptr() : nullptr, out.data_ptr(), b, COLL_UINT8,
                            root, comm_, s);
      },
      [=] { copy_back(user, out); }, dev);
}

Core::WorkPtr Core::reduce_scatter(Tensors &outputs, TensorLists &inputs,
                                   const c10d::ReduceScatterOptions &opts) {
  const char *what = "reduce_scatter";
  Dev dev = check_one(outputs, what);
  if (inputs.size() != 1 || inputs[0].size() != (size_t)size_)
    throw error(what, "takes one list of " + std::to_string(size_) + " input tensors");
  at::Tensor user = outputs[0], out = wire_of(user);
  Reduction red = reduction(opts.reduceOp, out.scalar_type(), what);
  int64_t n = out.numel();
  place(all_of(outputs, inputs), what);
  at::Tensor flat = at::empty({n * size_}, out.options());
  for (size_t i = 0; i < inputs[0].size(); i++) {
    same_shape(inputs[0][i], out, what, "an input tensor");
    flat.narrow(0, (int64_t)i * n, n).copy_(inputs[0][i].reshape({-1}));
  }
  if (red.premul) flat = wire_of(scaled(red, flat));
  return launch(
      c10d::OpType::REDUCE_SCATTER, what, {user}, {out, flat},
      [=, this](coll_stream_t s) {
        return coll_reduce_scatter(flat.data_ptr(), out.data_ptr(), count_of(red, out),
                                   red.ty.dtype, red.op, comm_, s);
      },
      [=] { copy_back(user, out); }, dev);
}

Core::WorkPtr Core::reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                                        const c10d::ReduceScatterOptions &opts) {
  const char *what = "reduce_scatter_tensor";
  Dev dev = place({output, input}, what);
  if (output.scalar_type() != input.scalar_type() || input.numel() != output.numel() * size_)
    throw error(what, "the input tensor must hold " + std::to_string(size_) +
                          " times the output's elements, of the same dtype");
  Reduction red = reduction(opts.reduceOp, output.scalar_type(), what);
  at::Tensor user = output, out = wire_of(output), in = wire_of(scaled(red, wire_of(input)));
  return launch(
      c10d::OpType::_REDUCE_SCATTER_BASE, what, {user}, {in, out},
      [=, this](coll_stream_t s) {
        return coll_reduce_scatter(in.data_ptr(), out.data_ptr(), count_of(red, out), red.ty.dtype,
                                   red.op, comm_, s);
      },
      [=] { copy_back(user, out); }, dev);
}

// Each input gathered into its output (size_ times its elements): one libcoll all-gather
// per pair, all on one stream, so they run in call order and finish as one Work.
Core::WorkPtr Core::allgather_into_tensor_coalesced(Tensors &outputs, Tensors &inputs,
                                                    const c10d::AllgatherOptions &) {
  const char *what = "all_gather_into_tensor_coalesced";
  if (outputs.size() != inputs.size())
    throw error(what, "takes one output tensor per input tensor, got " +
                          std::to_string(outputs.size()) + " outputs for " +
                          std::to_string(inputs.size()) + " inputs");
  Tensors users = outputs, ins, outs, keep;
  Dev dev = place(all_of(outputs, {inputs}), what);
  for (size_t i = 0; i < inputs.size(); i++) {
    if (outputs[i].scalar_type() != inputs[i].scalar_type() ||
        outputs[i].numel() != inputs[i].numel() * size_)
      throw error(what, "output tensor " + std::to_string(i) + " must hold " +
                            std::to_string(size_) +
                            " times its input's elements, of the same dtype");
    ins.push_back(wire_of(inputs[i]));
    outs.push_back(wire_of(outputs[i]));
  }
  keep = ins;
  keep.insert(keep.end(), outs.begin(), outs.end());
  return launch(
      allgather_into_tensor_coalesced_op(), what, users, keep,
      [=, this](coll_stream_t s) {
        for (size_t i = 0; i < ins.size(); i++) {
          coll_result r = coll_all_gather(ins[i].data_ptr(), outs[i].data_ptr(), nbytes(ins[i]),
                                          COLL_UINT8, comm_, s);
          if (r != COLL_OK) return r;
        }
        return COLL_OK;
      },
      [=] {
        for (size_t i = 0; i < users.size(); i++) copy_back(users[i], outs[i]);
      },
      dev);
}

// Each input (size_ times its output's elements) reduce-scattered into its output, each
// pair with its own dtype's reduction: one libcoll reduce-scatter per pair on one stream.
Core::WorkPtr Core::reduce_scatter_tensor_coalesced(Tensors &outputs, Tensors &inputs,
                                                    const c10d::ReduceScatterOptions &opts) {
  const char *what = "reduce_scatter_tensor_coalesced";
  if (outputs.size() != inputs.size())
    throw error(what, "takes one output tensor per input tensor, got " +
                          std::to_string(outputs.size()) + " outputs for " +
                          std::to_string(inputs.size()) + " inputs");
  Tensors users = outputs, ins, outs, keep;
  std::vector<Reduction> reds;
  Dev dev = place(all_of(outputs, {inputs}), what);
  for (size_t i = 0; i < inputs.size(); i++) {
    if (outputs[i].scalar_type() != inputs[i].scalar_type() ||
        inputs[i].numel() != outputs[i].numel() * size_)
      throw error(what, "input tensor " + std::to_string(i) + " must hold " +
                            std::to_string(size_) +
                            " times its output's elements, of the same dtype");
    reds.push_back(reduction(opts.reduceOp, outputs[i].scalar_type(), what));
    ins.push_back(wire_of(scaled(reds.back(), wire_of(inputs[i]))));
    outs.push_back(wire_of(outputs[i]));
  }
  keep = ins;
  keep.insert(keep.end(), outs.begin(), outs.end());
  return launch(
      reduce_scatter_tensor_coalesced_op(), what, users, keep,
      [=, this](coll_stream_t s) {
        for (size_t i = 0; i < ins.size(); i++) {
          coll_result r = coll_reduce_scatter(ins[i].data_ptr(), outs[i].data_ptr(),
                                              count_of(reds[i], outs[i]), reds[i].ty.dtype,
                                              reds[i].op, comm_, s);
          if (r != COLL_OK) return r;
        }
        return COLL_OK;
      },
      [=] {
        for (size_t i = 0; i < users.size(); i++) copy_back(users[i], outs[i]);
      },
      dev);
}

namespace {
// Byte counts and displacements of an all-to-all split along dim 0 ("rows").
void splits_to_bytes(const at::Tensor &t, const std::vector<int64_t> &splits, int size,
                     const char *what, const char *which, std::vector<size_t> &counts,
                     std::vector<size_t> &displs) {
  int64_t rows = t.dim() ? t.size(0) : 1;
  size_t row = rows ? nbytes(t) / rows : 0;
  counts.assign(size, 0);
  displs.assign(size, 0);
  if (splits.empty()) {
    if (rows % size)
      throw error(what, std::string("the ") + which + " tensor's first dimension (" +
                            std::to_string(rows) + ") does not divide by the group size " +
                            std::to_string(size) + " and no split sizes were given");
    for (int i = 0; i < size; i++) counts[i] = row * (rows / size);
  } else {
    if (splits.size() != (size_t)size)
      throw error(what, std::string("takes one ") + which + " split size per rank (" +
                            std::to_string(size) + "), got " + std::to_string(splits.size()));
    int64_t sum = 0;
    for (int i = 0; i < size; i++) {
      if (splits[i] < 0) throw error(what, std::string("a negative ") + which + " split size");
      counts[i] = row * splits[i];
      sum += splits[i];
    }
    if (sum != rows)
      throw error(what, std::string("the ") + which + " split sizes add up to " +
                            std::to_string(sum) + " rows, the tensor has " + std::to_string(rows));
  }
  size_t off = 0;
  for (int i = 0; i < size; i++) {
    displs[i] = off;
    off += counts[i];
  }
}
}  // namespace

Core::WorkPtr Core::alltoall_base(at::Tensor &output, at::Tensor &input,
                                  std::vector<int64_t> &output_splits,
                                  std::vector<int64_t> &input_splits,
                                  const c10d::AllToAllOptions &) {
  const char *what = "all_to_all_single";
  Dev dev = place({output, input}, what);
  if (output.scalar_type() != input.scalar_type())
    throw error(what, "the input and output tensors must have the same dtype");
  at::Tensor user = output, out = wire_of(output), in = wire_of(input);
  if (in.numel() && out.numel() && in.data_ptr() == out.data_ptr()) in = in.clone();
  std::vector<size_t> sc, sd, rc, rd;
  splits_to_bytes(in, input_splits, size_, what, "input", sc, sd);
  splits_to_bytes(out, output_splits, size_, what, "output", rc, rd);
  return launch(
      c10d::OpType::ALLTOALL_BASE, what, {user}, {in, out},
      [=, this](coll_stream_t s) {
        return coll_all_to_allv(in.data_ptr(), sc.data(), sd.data(), out.data_ptr(), rc.data(),
                                rd.data(), COLL_UINT8, comm_, s);
      },
      [=] { copy_back(user, out); }, dev);
}

Core::WorkPtr Core::alltoall(Tensors &outputs, Tensors &inputs, const c10d::AllToAllOptions &) {
  const char *what = "all_to_all";
  if (outputs.size() != (size_t)size_ || inputs.size() != (size_t)size_)
    throw error(what, "takes " + std::to_string(size_) + " input and output tensors, one per rank");
  std::vector<size_t> sc(size_), sd(size_), rc(size_), rd(size_);
  size_t sin = 0, sout = 0;
  Dev dev = place(all_of(inputs, {outputs}), what);
  for (int i = 0; i < size_; i++) {
    sc[i] = nbytes(inputs[i]);
    sd[i] = sin;
    sin += sc[i];
    rc[i] = nbytes(outputs[i]);
    rd[i] = sout;
    sout += rc[i];
  }
  at::Tensor in = byte_buffer(sin, dev), out = byte_buffer(sout, dev);
  for (int i = 0; i < size_; i++) pack_into(in, sd[i], inputs[i]);
  Tensors outs = outputs;
  return launch(
      c10d::OpType::ALLTOALL, what, outs, {in, out},
      [=, this](coll_stream_t s) {
        return coll_all_to_allv(in.data_ptr(), sc.data(), sd.data(), out.data_ptr(), rc.data(),
                                rd.data(), COLL_UINT8, comm_, s);
      },
      [=] {
        for (size_t i = 0; i < outs.size(); i++) unpack_from(outs[i], out, rd[i]);
      },
      dev);
}

// Tags: libcoll has none; messages between two ranks match in the order they were sent.
Core::WorkPtr Core::send(Tensors &tensors, int dst, int) {
  const char *what = "send";
  Dev dev = check_one(tensors, what);
  at::Tensor w = wire_of(tensors[0]);
  return launch(
      c10d::OpType::SEND, what, {tensors[0]}, {w},
      [=, this](coll_stream_t s) {
        return coll_send(w.data_ptr(), nbytes(w), COLL_UINT8, dst, comm_, s);
      },
      nullptr, dev);
}

Core::WorkPtr Core::recv(Tensors &tensors, int src, int) {
  const char *what = "recv";
  Dev dev = check_one(tensors, what);
  at::Tensor t = tensors[0], w = wire_of(t);
  return launch(
      c10d::OpType::RECV, what, {t}, {w},
      [=, this](coll_stream_t s) {
        return coll_recv(w.data_ptr(), nbytes(w), COLL_UINT8, src, comm_, s);
      },
      [=] { copy_back(t, w); }, dev);
}

Core::WorkPtr Core::recv_anysource(Tensors &, int) {
  throw error("recv", "the libcoll backend cannot receive from any source: name the sending "
                      "rank (src=...)");
}

Core::WorkPtr Core::barrier(const c10d::BarrierOptions &) {
  return launch(c10d::OpType::BARRIER, "barrier", {}, {},
                [=, this](coll_stream_t s) { return coll_barrier(comm_, s); });
}

}  // namespace libcoll_torch
