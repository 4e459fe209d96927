// pg_1x.cpp — the torch 1.x adapter: a c10d::ProcessGroup whose every method forwards to
// the core (core.cpp), the Python module `libcoll_torch`, and the registration of the
// backend "libcoll" with torch.distributed when the module is imported.
//
// It must never hold logic of its own beyond forwarding (a torch 2.x adapter,
// backend_2x.cpp, is the same file over c10d::Backend), and never block with the GIL held.
#include <torch/extension.h>
#include <pybind11/chrono.h>
#include <pybind11/eval.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "core.hpp"

namespace libcoll_torch {

class ProcessGroupLibcoll : public c10d::ProcessGroup {
 public:
  ProcessGroupLibcoll(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                      std::chrono::milliseconds timeout)
      : c10d::ProcessGroup(rank, size), core_(store, rank, size, timeout) {
    init();
  }
  // destroy_process_group() drops the last reference with the GIL held; the core's
  // completion thread may need it to free a tensor (see Core::shutdown).
  ~ProcessGroupLibcoll() override {
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

  // The blocking all_reduce behind dist.all_reduce(async_op=False) (see below).
  void allreduce_now(Tensors &t, const c10d::AllreduceOptions &o) { core_.allreduce_now(t, o); }

 private:
  Core core_;
};

// The creator torch.distributed calls with (store, rank, size, timeout).
static c10::intrusive_ptr<ProcessGroupLibcoll> create(const c10::intrusive_ptr<c10d::Store> &store,
                                                      int rank, int size,
                                                      std::chrono::milliseconds timeout) {
  pybind11::gil_scoped_release nogil;  // the rendezvous waits for the other ranks
  return c10::make_intrusive<ProcessGroupLibcoll>(store, rank, size, timeout);
}

// dist.all_reduce with async_op=False on a libcoll group calls the blocking path: no Work,
// no stream, libcoll runs the call on the caller's thread.  Everything else (async_op,
// complex tensors, another backend, a rank outside the group) goes to torch's own
// function, which the wrapper keeps as `_torch_all_reduce`.  On 2 shared cores this is
// what brings a small torch-level all_reduce near coll-bench's time (docs/perf.md).
static const char *fast_path_py = R"(
import torch
import torch.distributed as _dist
import torch.distributed.distributed_c10d as _c10d

_torch_all_reduce = _c10d.all_reduce
_Tensor = torch.Tensor

def all_reduce(tensor, op=_dist.ReduceOp.SUM, group=None, async_op=False):
    pg = _c10d.GroupMember.WORLD if group is None else group
    if (not async_op and isinstance(pg, ProcessGroupLibcoll) and isinstance(tensor, _Tensor)
            and pg._all_reduce_now(tensor, op)):
        return None
    return _torch_all_reduce(tensor, op, group, async_op)

all_reduce.__doc__ = _torch_all_reduce.__doc__
if getattr(_c10d.all_reduce, "__module__", "") != __name__:
    _c10d.all_reduce = _dist.all_reduce = all_reduce
)";

}  // namespace libcoll_torch

PYBIND11_MODULE(libcoll_torch, m) {
  namespace py = pybind11;
  m.doc() = "libcoll as a torch.distributed backend: importing it registers \"libcoll\"";
  py::module_ dist = py::module_::import("torch.distributed");
  py::class_<libcoll_torch::ProcessGroupLibcoll,
             c10::intrusive_ptr<libcoll_torch::ProcessGroupLibcoll>, c10d::ProcessGroup>(
      m, "ProcessGroupLibcoll")
      .def(py::init(&libcoll_torch::create), py::arg("store"), py::arg("rank"), py::arg("size"),
           py::arg("timeout"))
      .def(
          "_all_reduce_now",
          // Takes the op itself, not an AllreduceOptions: building that object from Python
          // cost more than the rest of the wrapper (docs/perf.md, the overhead table).
          // Returns false, having done nothing, for what the blocking path leaves to
          // torch's function (complex tensors: torch views them as real pairs first).
          [](libcoll_torch::ProcessGroupLibcoll &pg, at::Tensor t, const c10d::ReduceOp &op) {
            if (t.is_complex()) return false;
            c10d::AllreduceOptions o;
            o.reduceOp = op;
            std::vector<at::Tensor> v{std::move(t)};
            pg.allreduce_now(v, o);
            return true;
          },
          py::arg("tensor"), py::arg("op"), py::call_guard<py::gil_scoped_release>(),
          "dist.all_reduce(async_op=False) on this group: libcoll's blocking call, no Work; "
          "False (nothing done) for complex tensors.");
  m.def("create_process_group", &libcoll_torch::create, py::arg("store"), py::arg("rank"),
        py::arg("size"), py::arg("timeout"),
        "The creator registered with torch.distributed.Backend for \"libcoll\".");
  py::object backend = dist.attr("Backend");
  if (!backend.attr("_plugins").contains("LIBCOLL"))
    backend.attr("register_backend")("libcoll", m.attr("create_process_group"));
  py::exec(libcoll_torch::fast_path_py, m.attr("__dict__"));
}
