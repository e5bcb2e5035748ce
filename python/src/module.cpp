// pipeswap._C: the Python binding of the optimizer-state swap runtime over the torch backend.
//
// Bindings are pybind11, the copy torch ships and builds its own Python layer with: its tensor type
// caster passes at::Tensor both ways without copies, and a Python callable can be called from C++
// during the step (the update runs torch's own Adam/AdamW on the batch's views). TORCH_LIBRARY
// operators would suit stateless kernels; this object owns a runtime with state, a callback into
// Python and phases called between steps, which a custom operator cannot express.
//
// One Runtime per optimizer: the device's shared torch backend and transfer engine, a
// tensor_optimizer and, once configured, an optimizer_swap. Changing the parameters or the settings rebuilds the
// optimizer_swap; the state carries over (optimizer_state).
#include <torch/extension.h>

#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <optional>
#include <string>
#include <vector>

#include <pipeswap/backend/torch.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>

namespace py = pybind11;
namespace pt = pipeswap::torch;

namespace {

std::vector<pipeswap::state_key> parse_keys(std::vector<std::string> const& names) {
  return pipeswap::validate_state_keys(names);
}

/// The torch backend and the transfer engine of one device, shared by every runtime on it: one
/// copy-stream pair and one pinned pool per device, as the swap jobs are meant to share them (the
/// optimizers' now, an activation manager's later). Runtimes hold it; it goes with the last one.
struct device_context {
  explicit device_context(c10::Device d) : b(d), engine(b) {}
  pt::backend b;
  pipeswap::transfer_engine<pt::backend> engine;

  static std::shared_ptr<device_context> of(c10::Device d) {
    static std::map<std::string, std::weak_ptr<device_context>> contexts;
    auto& slot = contexts[d.str()];
    auto ctx = slot.lock();
    if (!ctx) slot = ctx = std::make_shared<device_context>(d);
    return ctx;
  }
};

class runtime {
public:
  runtime(c10::Device device, py::function update)
      : ctx_(device_context::of(device)), b_(ctx_->b), engine_(ctx_->engine),
        opt_(b_, [this](std::vector<pt::tensor_optimizer::batch_item>& items) {
          py::list l;
          for (auto& it : items) l.append(py::make_tuple(it.param, py::cast(it.states)));
          update_(l);
        }),
        update_(std::move(update)) {}

  ~runtime() { rt_.reset(); } // hands the state back before the optimizer goes

  std::size_t add_param(at::Tensor const& p, std::vector<std::string> const& keys) {
    detach();
    return opt_.add_param(p.sizes(), p.strides(), p.scalar_type(), parse_keys(keys));
  }

  void configure(std::size_t swap_times, bool packed, std::size_t resident_share, bool defer_offload,
                 std::size_t min_numel) {
    pipeswap::swap_config c;
    c.swap_times = swap_times;
    c.packed = packed;
    c.resident_share = resident_share;
    c.defer_offload = defer_offload;
    c.min_numel = min_numel;
    c.validate();
    detach();
    cfg_ = c;
  }

  void set_active(std::vector<std::size_t> const& active) { opt_.set_active(active); }

  void step() {
    auto& rt = attach();
    try {
      rt.step();
    } catch (...) {
      // Torch semantics: a failed step() is over. Batches before the failing one keep their update
      // (their state moved with them); the rest were not touched. Nothing is lost either way.
      rt.discard_interrupted_step();
      throw;
    }
  }

  std::size_t prefetch(std::optional<std::size_t> max_batches) {
    if (!rt_) return 0; // before the first step no batch order is known
    return rt_->prefetch(max_batches.value_or(std::numeric_limits<std::size_t>::max()));
  }
  void finish_offload() {
    if (rt_) rt_->finish_offload();
  }
  bool offload_pending() const { return rt_ && rt_->offload_pending(); }

  /// Brings every slot home (host mirrors complete and synchronized).
  void synchronize() {
    if (rt_) rt_->synchronize_cpu_mirrors();
  }

  /// Views of parameter i's slots where the state rests after synchronize(): CPU tensors over the
  /// host mirrors of swapped slots, device tensors over the storage of resident ones.
  std::vector<at::Tensor> state_views(std::size_t i) {
    auto& rt = attach();
    rt.synchronize_cpu_mirrors();
    std::vector<at::Tensor> out;
    for (auto s : opt_.param_slots(i)) {
      if (rt.is_swappable(s)) {
        out.push_back(opt_.view(i, rt.host_mirror(s).data(), c10::Device(c10::kCPU)));
      } else {
        out.push_back(opt_.view(i, rt.resident_device(s).get(), b_.device()));
      }
    }
    return out;
  }

  py::dict stats() {
    py::dict d;
    d["device"] = b_.device().str();
    d["params"] = opt_.size();
    d["slots"] = opt_.slots().size();
    if (rt_) {
      d["batches"] = rt_->last_plan().size();
      d["swappable_bytes"] = rt_->swappable_bytes();
      d["resident_bytes"] = rt_->resident_bytes();
      d["arena_bytes"] = rt_->arena_bytes();
      d["max_batch_bytes"] = rt_->max_batch_bytes();
      d["host_store_bytes"] = rt_->host_store_bytes();
      d["prefetched_batches"] = rt_->prefetched_batches();
      d["resident_batches"] = rt_->resident_batches();
      d["resident_share_bytes"] = rt_->resident_share_bytes();
    }
    return d;
  }

private:
  pipeswap::optimizer_swap<pt::tensor_optimizer>& attach() {
    if (!rt_) rt_ = std::make_unique<pipeswap::optimizer_swap<pt::tensor_optimizer>>(engine_, opt_, cfg_);
    return *rt_;
  }
  void detach() { rt_.reset(); }

  std::shared_ptr<device_context> ctx_; // first: outlives the optimizer's state and the runtime
  pt::backend& b_;
  pipeswap::transfer_engine<pt::backend>& engine_;
  pt::tensor_optimizer opt_;
  py::function update_;
  pipeswap::swap_config cfg_;
  std::unique_ptr<pipeswap::optimizer_swap<pt::tensor_optimizer>> rt_;
};

/// The innermost exception of a nest of step_errors, so a Python error raised by the update reaches
/// the caller as itself.
void rethrow_innermost(std::exception const& e) {
  try {
    std::rethrow_if_nested(e);
  } catch (py::error_already_set&) {
    throw;
  } catch (std::exception const& inner) {
    rethrow_innermost(inner);
    throw;
  }
}

/// The Backend concept's semantic rules, checked on a torch backend of `device` (tests/python runs it
/// on the CPU, bench/gpu on CUDA): round trips through device memory on new streams, ordering by
/// events, zero sizes, and the errors a misuse gets. Throws std::runtime_error naming the rule.
void backend_selftest(c10::Device device) {
  auto require = [](bool ok, char const* rule) {
    if (!ok) throw std::runtime_error(std::string("torch backend self-test: ") + rule);
  };
  pt::backend b(device);
  auto const s1 = b.new_stream();
  auto const s2 = b.new_stream();
  require(s1 != s2 && s1 != b.current_stream(), "new_stream() gives distinct streams");
  std::size_t const n = 1 << 20;
  std::byte* h = b.allocate_host(n);
  std::byte* back = b.allocate_host(n);
  for (std::size_t i = 0; i < n; ++i) h[i] = static_cast<std::byte>(i * 7 + 3);
  auto d = b.allocate_device(n, s1);
  b.copy_h2d(d, h, n, s1);
  b.wait_event(s2, b.record_event(s1));
  b.copy_d2h(back, d, n, s2);
  auto const done = b.record_event(s2);
  b.synchronize(done);
  require(std::memcmp(h, back, n) == 0, "h2d on one stream, d2h on another after its event: bytes round-trip");
  b.deallocate_device(d, n, s2); // released on another stream than its allocation's
  require(b.device_blocks() == 0, "deallocate_device returns the block");
  require(!b.allocate_device(0, s1) && b.allocate_host(0) == nullptr, "zero sizes give null");
  b.deallocate_device({}, 0, s1);
  b.deallocate_host(nullptr, 0);
  b.copy_h2d({}, nullptr, 0, s1);
  bool threw = false;
  try {
    b.deallocate_device(pipeswap::device_ptr(h), n, s1);
  } catch (pipeswap::error const&) {
    threw = true;
  }
  require(threw, "deallocate_device of an address it did not allocate throws error_type");
  threw = false;
  try {
    (void)b.allocate_device(16, c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::kMeta)));
  } catch (pipeswap::error const&) {
    threw = true;
  }
  require(threw, "a stream of another device throws error_type");
  auto const d2 = b.allocate_device(64, b.current_stream()); // still usable after the errors
  b.deallocate_device(d2, 64, b.current_stream());
  b.deallocate_host(h, n);
  b.deallocate_host(back, n);
}

} // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "pipeswap's optimizer-state swap runtime over the torch backend";
  m.attr("torch_version") = PIPESWAP_TORCH_BUILT_FOR; // torch.__version__ at build time
  m.attr("has_cuda") = static_cast<bool>(PIPESWAP_TORCH_CUDA);

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (pipeswap::step_error const& e) {
      try {
        rethrow_innermost(e);
      } catch (py::error_already_set& inner) {
        // The update's own Python exception, with the batch named in a note-like chained error.
        inner.restore();
        return;
      } catch (pipeswap::invalid_argument const& inner) {
        PyErr_SetString(PyExc_ValueError, (std::string(e.what()) + ": " + inner.what()).c_str());
        return;
      } catch (std::exception const& inner) {
        PyErr_SetString(PyExc_RuntimeError, (std::string(e.what()) + ": " + inner.what()).c_str());
        return;
      }
      PyErr_SetString(PyExc_RuntimeError, e.what());
    } catch (pipeswap::invalid_argument const& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (pipeswap::error const& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  m.def("_backend_selftest", &backend_selftest, py::arg("device"));

  py::class_<runtime>(m, "Runtime")
      .def(py::init<c10::Device, py::function>(), py::arg("device"), py::arg("update"))
      .def("add_param", &runtime::add_param, py::arg("param"), py::arg("keys"))
      .def("configure", &runtime::configure, py::arg("swap_times"), py::arg("packed"),
           py::arg("resident_share"), py::arg("defer_offload"), py::arg("min_numel"))
      .def("set_active", &runtime::set_active)
      .def("step", &runtime::step)
      .def("prefetch", &runtime::prefetch, py::arg("max_batches") = py::none())
      .def("finish_offload", &runtime::finish_offload)
      .def_property_readonly("offload_pending", &runtime::offload_pending)
      .def("synchronize", &runtime::synchronize)
      .def("state_views", &runtime::state_views)
      .def("stats", &runtime::stats);
}
