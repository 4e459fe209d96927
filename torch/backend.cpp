// backend.cpp — the torch 2.x adapter: a c10d::Backend whose every method forwards to the
// core (core.cpp), the Python module `libcoll_torch`, and the registration of "libcoll"
// for CPU and CUDA tensors (one backend serves both; a build without CUDA refuses CUDA
// tensors with its own sentence rather than torch's "no backend for cuda").  Built against
// torch 2.15 (C++20) by the project's set-up, and against the GPU machine's torch 2.11 by
// scripts/gpu_check.sh.
//
// It must never hold logic of its own beyond forwarding, and never block with the GIL held.
#include <torch/extension.h>
#include <pybind11/chrono.h>
#include <pybind11/eval.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "core.hpp"

namespace libcoll_torch {

class BackendLibcoll : public c10d::Backend {
 public:
  BackendLibcoll(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                 std::chrono::milliseconds timeout)
      : c10d::Backend(rank, size), core_(store, rank, size, timeout) {}

  // destroy_process_group() drops the last reference with the GIL held; the core's
  // completion thread may need it to free a tensor (see Core::shutdown).
  ~BackendLibcoll() override {
    if (Py_IsInitialized() && PyGILState_Check()) {
      pybind11::gil_scoped_release nogil;
      core_.shutdown();
    } else {
      core_.shutdown();
    }
  }

  const std::string getBackendName() const override { return "libcoll"; }

  using WorkPtr = c10::intrusive_ptr<c10d::Work>;
  using Tensors = std::vector<at::Tensor>;
  using TensorLists = std::vector<std::vector<at::Tensor>>;

  WorkPtr broadcast(Tensors &t, const c10d::BroadcastOptions &o) override {
    return core_.broadcast(t, o);
  }
  WorkPtr allreduce(Tensors &t, const c10d::AllreduceOptions &o) override {
    return core_.allreduce(t, o);
  }
  WorkPtr allreduce_coalesced(Tensors &t, const c10d::AllreduceCoalescedOptions &o) override {
    return core_.allreduce_coalesced(t, o);
  }
  WorkPtr reduce(Tensors &t, const c10d::ReduceOptions &o) override { return core_.reduce(t, o); }
  WorkPtr allgather(TensorLists &out, Tensors &in, const c10d::AllgatherOptions &o) override {
    return core_.allgather(out, in, o);
  }
  WorkPtr _allgather_base(at::Tensor &out, at::Tensor &in,
                          const c10d::AllgatherOptions &o) override {
    return core_.allgather_base(out, in, o);
  }
  WorkPtr allgather_coalesced(TensorLists &out, Tensors &in,
                              const c10d::AllgatherOptions &o) override {
    return core_.allgather_coalesced(out, in, o);
  }
  WorkPtr gather(TensorLists &out, Tensors &in, const c10d::GatherOptions &o) override {
    return core_.gather(out, in, o);
  }
  WorkPtr scatter(Tensors &out, TensorLists &in, const c10d::ScatterOptions &o) override {
    return core_.scatter(out, in, o);
  }
  WorkPtr reduce_scatter(Tensors &out, TensorLists &in,
                         const c10d::ReduceScatterOptions &o) override {
    return core_.reduce_scatter(out, in, o);
  }
  WorkPtr _reduce_scatter_base(at::Tensor &out, at::Tensor &in,
                               const c10d::ReduceScatterOptions &o) override {
    return core_.reduce_scatter_base(out, in, o);
  }
  // The names torch 2.x has had since 2.1; newer torch's all_gather_single_coalesced and
  // reduce_scatter_single_coalesced forward to them by default.
  WorkPtr allgather_into_tensor_coalesced(Tensors &out, Tensors &in,
                                          const c10d::AllgatherOptions &o) override {
    return core_.allgather_into_tensor_coalesced(out, in, o);
  }
  WorkPtr reduce_scatter_tensor_coalesced(Tensors &out, Tensors &in,
                                          const c10d::ReduceScatterOptions &o) override {
    return core_.reduce_scatter_tensor_coalesced(out, in, o);
  }
  WorkPtr alltoall_base(at::Tensor &out, at::Tensor &in, std::vector<int64_t> &os,
                        std::vector<int64_t> &is, const c10d::AllToAllOptions &o) override {
    return core_.alltoall_base(out, in, os, is, o);
  }
  WorkPtr alltoall(Tensors &out, Tensors &in, const c10d::AllToAllOptions &o) override {
    return core_.alltoall(out, in, o);
  }
  WorkPtr send(Tensors &t, int dst, int tag) override { return core_.send(t, dst, tag); }
  WorkPtr recv(Tensors &t, int src, int tag) override { return core_.recv(t, src, tag); }
  WorkPtr recvAnysource(Tensors &t, int tag) override { return core_.recv_anysource(t, tag); }
  WorkPtr barrier(const c10d::BarrierOptions &o) override { return core_.barrier(o); }

  // batch_isend_irecv coalesces only where the backend says it can; without, its sends
  // and receives run one at a time and two ranks' crossing large sends deadlock.
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override { core_.start_coalescing(); }
  WorkPtr endCoalescing() override { return core_.end_coalescing(); }

  // The blocking path (Core::now) behind the Python wrappers below.
  Core &core() { return core_; }

 private:
  Core core_;
};

// dist.all_reduce, all_gather_into_tensor, reduce_scatter_tensor and all_to_all_single with
// async_op=False on a group whose CPU backend is libcoll call the blocking path (Core::now):
// no Work, no stream, libcoll runs the call on the caller's thread.  Everything else
// (async_op, tensor subclasses such as DTensor, complex all_reduce, an open coalescing
// block, another backend, a rank outside the group, no default group yet) goes to torch's
// own function, kept as _torch_<name>.  On 2 shared cores a Work costs two thread hand-offs,
// tens of microseconds; this is what brings a small torch-level call near coll-bench's time
// (docs/pytorch.md).
static const char *blocking_py = R"(
import torch
import torch.distributed as _dist
import torch.distributed.distributed_c10d as _c10d

_cpu = torch.device("cpu")
_Tensor = torch.Tensor


def _libcoll_of(group):
    try:
        pg = _c10d._get_default_group() if group is None else group
        if not isinstance(pg, _c10d.ProcessGroup) or pg in _c10d._world.pg_coalesce_state:
            return None
        b = pg._get_backend(_cpu)
    except (RuntimeError, ValueError, AttributeError):
        return None
    return b if isinstance(b, BackendLibcoll) else None


def _plain(*ts):
    return all(type(t) is _Tensor and t.device.type == "cpu" for t in ts)


_torch_all_reduce = _c10d.all_reduce
_torch_all_gather_into_tensor = _c10d.all_gather_into_tensor
_torch_reduce_scatter_tensor = _c10d.reduce_scatter_tensor
_torch_all_to_all_single = _c10d.all_to_all_single


def all_reduce(tensor, op=_dist.ReduceOp.SUM, group=None, async_op=False):
    if not async_op and _plain(tensor) and not tensor.is_complex():
        b = _libcoll_of(group)
        if b is not None:
            return b._all_reduce_now(tensor, op)
    return _torch_all_reduce(tensor, op, group, async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    if not async_op and _plain(output_tensor, input_tensor):
        b = _libcoll_of(group)
        if b is not None:
            return b._all_gather_into_tensor_now(output_tensor, input_tensor)
    return _torch_all_gather_into_tensor(output_tensor, input_tensor, group, async_op)


def reduce_scatter_tensor(output, input, op=_dist.ReduceOp.SUM, group=None, async_op=False):
    if not async_op and _plain(output, input) and not input.is_complex():
        b = _libcoll_of(group)
        if b is not None:
            return b._reduce_scatter_tensor_now(output, input, op)
    return _torch_reduce_scatter_tensor(output, input, op, group, async_op)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
                      group=None, async_op=False):
    if not async_op and _plain(output, input):
        b = _libcoll_of(group)
        if b is not None:
            return b._all_to_all_single_now(output, input, output_split_sizes or [],
                                            input_split_sizes or [])
    return _torch_all_to_all_single(output, input, output_split_sizes, input_split_sizes,
                                    group, async_op)


for _f in (all_reduce, all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single):
    _orig = globals()["_torch_" + _f.__name__]
    _f.__doc__ = _orig.__doc__
    if getattr(getattr(_c10d, _f.__name__), "__module__", "") != __name__:
        setattr(_c10d, _f.__name__, _f)
        setattr(_dist, _f.__name__, _f)
)";

static c10::intrusive_ptr<BackendLibcoll> create(const c10::intrusive_ptr<c10d::Store> &store,
                                                 int rank, int size,
                                                 std::chrono::milliseconds timeout) {
  pybind11::gil_scoped_release nogil;  // the rendezvous waits for the other ranks
  return c10::make_intrusive<BackendLibcoll>(store, rank, size, timeout);
}

}  // namespace libcoll_torch

PYBIND11_MODULE(libcoll_torch, m) {
  namespace py = pybind11;
  m.doc() = "libcoll as a torch.distributed backend: importing it registers \"libcoll\"";
  py::module_ dist = py::module_::import("torch.distributed");
  using libcoll_torch::BackendLibcoll;
  using Tensors = std::vector<at::Tensor>;
  // Each returns None once the call finished; the GIL is released while it runs.
  py::class_<BackendLibcoll, c10::intrusive_ptr<BackendLibcoll>, c10d::Backend>(m, "BackendLibcoll")
      .def(
          "_all_reduce_now",
          // Takes the op itself, not an AllreduceOptions: building that object from Python
          // costs more than the rest of the wrapper.
          [](BackendLibcoll &b, at::Tensor t, const c10d::ReduceOp &op) {
            c10d::AllreduceOptions o;
            o.reduceOp = op;
            Tensors v{std::move(t)};
            b.core().now([&] { b.core().allreduce(v, o); });
          },
          py::arg("tensor"), py::arg("op"), py::call_guard<py::gil_scoped_release>())
      .def(
          "_all_gather_into_tensor_now",
          [](BackendLibcoll &b, at::Tensor out, at::Tensor in) {
            b.core().now([&] { b.core().allgather_base(out, in, c10d::AllgatherOptions()); });
          },
          py::arg("output"), py::arg("input"), py::call_guard<py::gil_scoped_release>())
      .def(
          "_reduce_scatter_tensor_now",
          [](BackendLibcoll &b, at::Tensor out, at::Tensor in, const c10d::ReduceOp &op) {
            c10d::ReduceScatterOptions o;
            o.reduceOp = op;
            b.core().now([&] { b.core().reduce_scatter_base(out, in, o); });
          },
          py::arg("output"), py::arg("input"), py::arg("op"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "_all_to_all_single_now",
          [](BackendLibcoll &b, at::Tensor out, at::Tensor in, std::vector<int64_t> out_splits,
             std::vector<int64_t> in_splits) {
            b.core().now([&] {
              b.core().alltoall_base(out, in, out_splits, in_splits, c10d::AllToAllOptions());
            });
          },
          py::arg("output"), py::arg("input"), py::arg("output_splits"), py::arg("input_splits"),
          py::call_guard<py::gil_scoped_release>());
  m.def("create_process_group", &libcoll_torch::create, py::arg("store"), py::arg("rank"),
        py::arg("size"), py::arg("timeout"),
        "The creator registered with torch.distributed.Backend for \"libcoll\".");
  py::object backend = dist.attr("Backend");
  if (!backend.attr("_plugins").contains("LIBCOLL")) {
    py::list devices;
    devices.append("cpu");
    devices.append("cuda");
    backend.attr("register_backend")("libcoll", m.attr("create_process_group"),
                                     py::arg("devices") = devices);
  }
  py::exec(libcoll_torch::blocking_py, m.attr("__dict__"));
}
