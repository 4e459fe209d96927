// backend_2x.cpp — the torch 2.x adapter: a c10d::Backend whose every method forwards to
// the core (core.cpp), the Python module `libcoll_torch`, and the registration of
// "libcoll" for CPU tensors.  meson picks it instead of pg_1x.cpp when torch >= 2.
//
// NOT COMPILED on this project's Debian 12 machines (torch 1.13 only): written against
// torch 2.x's c10d::Backend (same virtual methods as 1.13's ProcessGroup) and to be
// checked on a machine with torch 2.x.  It must never hold logic of its own beyond
// forwarding, and never block with the GIL held.
#include <torch/extension.h>
#include <pybind11/chrono.h>
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

 private:
  Core core_;
};

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
  py::class_<libcoll_torch::BackendLibcoll, c10::intrusive_ptr<libcoll_torch::BackendLibcoll>,
             c10d::Backend>(m, "BackendLibcoll");
  m.def("create_process_group", &libcoll_torch::create, py::arg("store"), py::arg("rank"),
        py::arg("size"), py::arg("timeout"),
        "The creator registered with torch.distributed.Backend for \"libcoll\".");
  py::object backend = dist.attr("Backend");
  if (!backend.attr("_plugins").contains("LIBCOLL")) {
    py::list devices;
    devices.append("cpu");
    backend.attr("register_backend")("libcoll", m.attr("create_process_group"),
                                     py::arg("devices") = devices);
  }
}
