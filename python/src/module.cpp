// pipeswap._C: the Python binding of the optimizer-state swap runtime and of the activation swap
// (saved tensors) over the torch backend, and of the schedule layer they are placed by.
//
// Bindings are pybind11, the copy torch ships and builds its own Python layer with: its tensor type
// caster passes at::Tensor both ways without copies, and a Python callable can be called from C++
// during the step (the update runs torch's own Adam/AdamW on the batch's views). TORCH_LIBRARY
// operators would suit stateless kernels; this object owns a runtime with state, a callback into
// Python and phases called between steps, which a custom operator cannot express.
//
// Threads: no binding releases the GIL (no py::gil_scoped_release anywhere), copies and waits
// included, so this module's C++ code runs in one thread at a time, and the GIL is what guards each
// device_context, shared by every runtime and activation swap of the device. Another Python thread
// runs only while a call is back in Python (the update callback inside step()). Releasing the GIL
// around a copy or wait would need a lock on the device_context first (docs/pytorch.md, "Threads";
// tests/python/test_threads.py).
//
// One Runtime per optimizer: the device's shared torch backend and transfer engine, a
// tensor_optimizer and, once configured, an optimizer_swap. Changing the parameters or the settings rebuilds the
// optimizer_swap; the state carries over (optimizer_state).
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <optional>
#include <string>
#include <vector>

#include <pipeswap/torch.hpp>
#include <pipeswap/core/budget.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/schedule/generate.hpp>
#include <pipeswap/schedule/inject.hpp>
#include <pipeswap/schedule/validate.hpp>
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
      : ctx_(device_context::of(device)), b_(ctx_->b), engine_(ctx_->engine), opt_(make_optimizer()),
        update_(std::move(update)) {}

  ~runtime() { rt_.reset(); } // hands the state back before the optimizer goes

  std::size_t add_param(at::Tensor const& p, std::vector<std::string> const& keys) {
    detach();
    return opt_->add_param(p.sizes(), p.strides(), p.scalar_type(), parse_keys(keys));
  }

  /// Forgets every parameter and its state (host stores and device storage released): the
  /// parameters are registered afresh, as when param_groups were rebuilt before the first step.
  void reset_params() {
    detach();
    opt_ = make_optimizer();
  }

  void configure(std::size_t swap_times, bool packed, std::size_t resident_share, bool defer_offload,
                 std::size_t min_swap_numel) {
    pipeswap::swap_config c;
    c.swap_times = swap_times;
    c.packed = packed;
    c.resident_share = resident_share;
    c.defer_offload = defer_offload;
    c.min_swap_numel = min_swap_numel;
    c.validate();
    detach();
    cfg_ = c;
  }

  void set_active(std::vector<std::size_t> const& active) { opt_->set_active(active); }

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
    if (rt_) rt_->synchronize_host_mirrors();
  }

  /// Views of parameter i's slots where the state rests after synchronize(): CPU tensors over the
  /// host mirrors of swapped slots, device tensors over the storage of unswappable ones. `sync`
  /// false skips the synchronization (the caller synchronized and stepped nothing since). The
  /// views do not own their bytes: they are valid until the parameters or the settings change.
  std::vector<at::Tensor> state_views(std::size_t i, bool sync) {
    auto& rt = attach();
    if (sync) rt.synchronize_host_mirrors();
    std::vector<at::Tensor> out;
    for (auto s : opt_->param_slots(i)) {
      if (rt.is_swappable(s)) {
        out.push_back(opt_->view(i, rt.host_mirror(s).data(), c10::Device(c10::kCPU)));
      } else {
        out.push_back(opt_->view(i, rt.unswappable_device(s).get(), b_.device()));
      }
    }
    return out;
  }

  py::dict stats() {
    py::dict d;
    d["device"] = b_.device().str();
    d["params"] = opt_->size();
    d["slots"] = opt_->slots().size();
    if (rt_) {
      d["batches"] = rt_->last_plan().size();
      d["swappable_bytes"] = rt_->swappable_bytes();
      d["unswappable_bytes"] = rt_->unswappable_bytes();
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
  std::unique_ptr<pt::tensor_optimizer> make_optimizer() {
    return std::make_unique<pt::tensor_optimizer>(b_, [this](std::vector<pt::tensor_optimizer::batch_item>& items) {
      py::list l;
      for (auto& it : items) l.append(py::make_tuple(it.param, py::cast(it.states)));
      update_(l);
    });
  }
  pipeswap::optimizer_swap<pt::tensor_optimizer>& attach() {
    if (!rt_) rt_ = std::make_unique<pipeswap::optimizer_swap<pt::tensor_optimizer>>(engine_, *opt_, cfg_);
    return *rt_;
  }
  void detach() { rt_.reset(); }

  std::shared_ptr<device_context> ctx_; // first: outlives the optimizer's state and the runtime
  pt::backend& b_;
  pipeswap::transfer_engine<pt::backend>& engine_;
  std::unique_ptr<pt::tensor_optimizer> opt_;
  py::function update_;
  pipeswap::swap_config cfg_;
  std::unique_ptr<pipeswap::optimizer_swap<pt::tensor_optimizer>> rt_;
};

/// A device budget for Python: one per device at a time, attached to the device's shared engine while
/// the object lives (it holds the engine), so the optimizers' and the activations' device storage on
/// that device is counted in one place, and activation loads take precedence over prefetch.
class device_budget_py {
public:
  device_budget_py(c10::Device device, std::uint64_t capacity, bool strict)
      : ctx_(device_context::of(device)),
        budget_(std::make_unique<pipeswap::device_budget>(capacity, strict ? pipeswap::budget_policy::strict
                                                                           : pipeswap::budget_policy::overshoot)) {
    if (ctx_->engine.budget()) {
      throw pipeswap::state_error("DeviceBudget(" + ctx_->b.device().str() +
                                  "): the device has a budget already; close() it first");
    }
    ctx_->engine.set_budget(budget_.get()); // throws while the swap jobs hold device storage
  }
  ~device_budget_py() {
    try {
      close();
    } catch (...) {}
  }
  /// Detaches the budget; refused while the swap jobs hold device storage counted in it.
  void close() {
    if (!budget_) return;
    if (ctx_->engine.budget() == budget_.get()) ctx_->engine.set_budget(nullptr);
    budget_.reset();
  }
  pipeswap::device_budget& get() {
    if (!budget_) throw pipeswap::state_error("DeviceBudget: closed");
    return *budget_;
  }
  py::dict stats() {
    auto& b = get();
    using pipeswap::budget_client;
    py::dict d;
    d["device"] = ctx_->b.device().str();
    d["capacity"] = b.capacity();
    d["strict"] = b.policy() == pipeswap::budget_policy::strict;
    d["used"] = b.used();
    d["used_activation"] = b.used(budget_client::activation);
    d["used_optimizer"] = b.used(budget_client::optimizer);
    d["high_water"] = b.high_water();
    d["high_water_activation"] = b.high_water(budget_client::activation);
    d["high_water_optimizer"] = b.high_water(budget_client::optimizer);
    d["reload_demand"] = b.reload_demand();
    d["over_budget_count"] = b.over_budget_count();
    d["refused_count"] = b.refused_count();
    return d;
  }

private:
  std::shared_ptr<device_context> ctx_;
  std::unique_ptr<pipeswap::device_budget> budget_;
};

/// The activation swap of one device for Python: saved_tensors over the device's shared engine (the
/// optimizers' copy streams and pinned pool), with the chunk passed as (stage, micro).
class saved_tensors_py {
public:
  saved_tensors_py(c10::Device device, std::int64_t min_bytes)
      : ctx_(device_context::of(device)), st_(ctx_->engine, {.min_bytes = checked_min_bytes(min_bytes)}) {}

  void begin_run() { st_.begin_run(); }
  void end_run() { st_.end_run(); }
  void enter(int stage, int micro) {
    if (scope_) {
      throw pipeswap::state_error("SavedTensors.enter: the forward of (stage " + std::to_string(open_.stage) +
                                  ", micro-batch " + std::to_string(open_.micro) + ") is still open");
    }
    open_ = chunk(stage, micro);
    scope_.reset(new pt::saved_tensors::manager::forward_scope(st_.forward(open_)));
  }
  /// Closes the open forward: its group's storages that others reference stay on the device.
  void exit() {
    if (!scope_) return;
    scope_.reset();
    st_.close(open_);
  }
  void keep(at::Tensor const& t) { st_.keep(t); }
  py::object pack(at::Tensor const& t) {
    auto p = st_.pack(t);
    if (auto* s = std::get_if<pt::saved_tensor>(&p)) return py::cast(std::move(*s));
    return py::cast(std::get<at::Tensor>(std::move(p)));
  }
  at::Tensor unpack(pt::saved_tensor const& s) const { return st_.unpack(s); }
  void launch_offload(int stage, int micro) { st_.launch_offload(chunk(stage, micro)); }
  void wait_offload(int stage, int micro) { st_.wait_offload(chunk(stage, micro)); }
  void launch_load(int stage, int micro) { st_.launch_load(chunk(stage, micro)); }
  void wait_load(int stage, int micro) { st_.wait_load(chunk(stage, micro)); }
  void release(int stage, int micro) { st_.release(chunk(stage, micro)); }
  void abort(int stage, int micro) {
    if (scope_ && open_ == chunk(stage, micro)) scope_.reset();
    st_.abort(chunk(stage, micro));
  }
  bool has_group(int stage, int micro) const { return st_.has_group(chunk(stage, micro)); }
  std::string state(int stage, int micro) const {
    return std::string(pt::saved_tensors::manager::to_string(st_.groups().state(chunk(stage, micro))));
  }
  std::size_t moved_storages(int stage, int micro) const { return st_.moved_storages(chunk(stage, micro)); }
  std::size_t autograd_held(int stage, int micro) const { return st_.autograd_held(chunk(stage, micro)); }

  py::dict stats() const {
    py::dict d;
    d["device"] = ctx_->b.device().str();
    d["min_bytes"] = st_.options().min_bytes;
    d["run"] = st_.groups().run();
    d["groups"] = st_.groups().active_groups();
    auto const saved = st_.saved_bytes();
    d["saved_bytes"] = saved.now;
    d["peak_saved_bytes"] = saved.peak;
    d["offloaded_bytes"] = st_.offloaded_bytes();
    d["moved_alive"] = st_.moved_alive();
    d["max_group_bytes"] = st_.max_group_bytes();
    return d;
  }

private:
  static std::size_t checked_min_bytes(std::int64_t n) {
    if (n < 0) throw pipeswap::invalid_argument("ActivationSwap: min_bytes must be >= 0, got " + std::to_string(n));
    return static_cast<std::size_t>(n);
  }
  static pipeswap::schedule::chunk chunk(int stage, int micro) {
    if (stage < 0 || micro < 0) {
      throw pipeswap::invalid_argument("SavedTensors: stage and micro-batch must be >= 0, got (" +
                                       std::to_string(stage) + ", " + std::to_string(micro) + ")");
    }
    return {stage, micro};
  }

  std::shared_ptr<device_context> ctx_;
  pt::saved_tensors st_;
  pipeswap::schedule::chunk open_;
  std::unique_ptr<pt::saved_tensors::manager::forward_scope> scope_;
};

/// A weak reference to a tensor's storage, taken without touching the storage from Python (a Python
/// storage object, once made, holds a reference of its own while the storage lives, so a storage
/// reached with Tensor.untyped_storage() looks shared to pack()). For tests of storage lifetimes.
struct storage_ref {
  explicit storage_ref(at::Tensor const& t)
      : weak(with_storage(t).storage().getWeakStorageImpl()),
        id(reinterpret_cast<std::uintptr_t>(t.storage().unsafeGetStorageImpl())), nbytes(t.storage().nbytes()) {}
  static at::Tensor const& with_storage(at::Tensor const& t) {
    if (!t.defined() || !t.has_storage()) throw pipeswap::invalid_argument("StorageRef: the tensor has no storage");
    return t;
  }
  c10::weak_intrusive_ptr<c10::StorageImpl> weak;
  std::uintptr_t id = 0;
  std::size_t nbytes = 0;
};

// ----- schedules as Python data: an entry is None (a bubble) or (kind, stage, micro[, leaves]) ------

namespace sch = pipeswap::schedule;

py::object index_or_none(sch::index_type v) { return v == sch::no_index ? py::none() : py::object(py::int_(v)); }

py::object step_to_py(sch::step const& s) {
  auto kind = py::str(std::string(sch::step_kind_name(s.kind)));
  if (s.sub.empty()) return py::make_tuple(kind, index_or_none(s.stage), index_or_none(s.micro));
  py::list leaves;
  for (auto const& l : s.sub) leaves.append(step_to_py(l));
  return py::make_tuple(kind, py::none(), py::none(), leaves);
}

py::list order_to_py(sch::order const& o) {
  py::list out;
  for (auto const& e : o) out.append(e ? step_to_py(*e) : py::none());
  return out;
}

sch::step step_from_py(py::handle h, std::string const& where) {
  auto t = h.cast<py::sequence>();
  if (t.size() != 3 && t.size() != 4) {
    throw pipeswap::invalid_argument(where + ": a step is (kind, stage, micro) or (kind, None, None, leaves)");
  }
  auto const name = t[0].cast<std::string>();
  auto const kind = sch::step_kind_from_name(name);
  if (!kind) throw pipeswap::invalid_argument(where + ": '" + name + "' is not a step kind");
  auto index = [&](py::handle v) { return v.is_none() ? sch::no_index : v.cast<sch::index_type>(); };
  sch::step s{*kind, index(t[1]), index(t[2]), {}};
  if (t.size() == 4) {
    std::size_t i = 0;
    for (auto l : t[3].cast<py::sequence>()) s.sub.push_back(step_from_py(l, where + ": leaf " + std::to_string(i++)));
  }
  return s;
}

sch::order order_from_py(py::sequence const& seq, std::string const& where) {
  sch::order o;
  std::size_t i = 0;
  for (auto e : seq) {
    auto const w = where + "entry " + std::to_string(i++);
    if (e.is_none()) {
      o.emplace_back(std::nullopt);
    } else {
      o.emplace_back(step_from_py(e, w));
    }
  }
  return o;
}

py::list rank_orders_to_py(sch::rank_orders const& r) {
  py::list out;
  for (auto const& o : r) out.append(order_to_py(o));
  return out;
}

/// Every rank's order of a named schedule, with its point-to-point steps.
py::list schedule_orders(std::string const& kind, int ranks, int micro, int stages_per_rank) {
  if ((kind == "gpipe" || kind == "1f1b") && stages_per_rank != 1) {
    throw pipeswap::invalid_argument("schedule: " + kind + " runs one stage per rank; stages_per_rank must be 1, got " +
                                     std::to_string(stages_per_rank));
  }
  if (kind == "gpipe") return rank_orders_to_py(sch::gpipe(ranks, micro));
  if (kind == "1f1b") return rank_orders_to_py(sch::one_f_one_b(ranks, micro));
  if (kind == "interleaved_1f1b")
    return rank_orders_to_py(sch::interleaved_1f1b({ranks, stages_per_rank, micro, false}));
  throw pipeswap::invalid_argument("schedule: unknown kind '" + kind + "' (gpipe, 1f1b, interleaved_1f1b)");
}

/// One order with pipeswap's swap steps injected.
py::list inject_order(py::sequence const& order, std::int64_t load_lookahead, std::int64_t offload_wait_delay) {
  sch::inject_options opts; // validate() states the rule; a negative count breaks it as 0 does
  opts.load_lookahead = static_cast<std::size_t>(std::max<std::int64_t>(load_lookahead, 0));
  opts.offload_wait_delay = static_cast<std::size_t>(std::max<std::int64_t>(offload_wait_delay, 0));
  opts.validate();
  return order_to_py(sch::inject_swap_steps(order_from_py(order, "inject: "), opts));
}

/// One order checked on its own: its shape and each swap life cycle in order. Empty when valid.
std::string check_order(py::sequence const& order) {
  std::string out;
  for (auto const& p : sch::check_order(order_from_py(order, ""))) out += sch::to_string(p) + "\n";
  return out;
}

/// Every rank's order checked: each on its own (the swap life cycle included) and all together
/// (every receive matched, no deadlock). An empty string when valid, else the problems.
std::string check_orders(py::sequence const& orders, int stages_per_rank) {
  sch::rank_orders r;
  std::size_t i = 0;
  for (auto o : orders) {
    r.push_back(order_from_py(o.cast<py::sequence>(), "rank " + std::to_string(i) + ": "));
    ++i;
  }
  std::string out;
  for (std::size_t k = 0; k < r.size(); ++k) {
    auto const ps = sch::check_order(r[k]);
    for (auto const& p : ps) out += "rank " + std::to_string(k) + ", " + sch::to_string(p) + "\n";
  }
  auto const rep = sch::check_schedule(r, sch::stage_layout(static_cast<sch::index_type>(r.size()), stages_per_rank));
  if (!rep.ok()) out += sch::to_string(rep);
  return out;
}

/// Checks that `t` can have optimizer state slots (pipeswap::torch::check_slot_layout: a dtype a slot
/// holds, a dense and non-overlapping layout); the error names `who`. The same rule add_param applies,
/// asked before a parameter joins, so a refused parameter changes nothing.
void check_param(at::Tensor const& t, std::string const& who) {
  (void)pt::check_slot_layout(t.sizes(), t.strides(), t.scalar_type(), who);
}

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

  // pipeswap's errors as standard Python exceptions: invalid_argument → ValueError, budget_exceeded
  // (a strict device budget refused a reservation) → torch.OutOfMemoryError, as torch reports a
  // device allocation that does not fit; any other pipeswap::error → RuntimeError. An error inside
  // an optimizer step carries the batch it failed in; the update's own Python exception passes as
  // itself.
  static py::object const* oom = nullptr; // torch.OutOfMemoryError, kept for the process's life
  if (!oom) oom = new py::object(py::module_::import("torch").attr("OutOfMemoryError"));
  py::register_exception_translator([](std::exception_ptr p) {
    auto type_of = [](std::exception const& e) -> PyObject* {
      if (dynamic_cast<pipeswap::budget_exceeded const*>(&e) || dynamic_cast<c10::OutOfMemoryError const*>(&e))
        return oom->ptr();
      if (dynamic_cast<pipeswap::invalid_argument const*>(&e)) return PyExc_ValueError;
      return PyExc_RuntimeError;
    };
    try {
      if (p) std::rethrow_exception(p);
    } catch (pipeswap::step_error const& e) {
      try {
        rethrow_innermost(e);
      } catch (py::error_already_set& inner) {
        inner.restore();
        return;
      } catch (std::exception const& inner) {
        PyErr_SetString(type_of(inner), (std::string(e.what()) + ": " + inner.what()).c_str());
        return;
      }
      PyErr_SetString(PyExc_RuntimeError, e.what());
    } catch (pipeswap::error const& e) {
      PyErr_SetString(type_of(e), e.what());
    }
  });

  m.def("_backend_selftest", &backend_selftest, py::arg("device"));
  m.def("check_param", &check_param, py::arg("param"), py::arg("who"));
  m.def("schedule_orders", &schedule_orders, py::arg("kind"), py::arg("ranks"), py::arg("micro"),
        py::arg("stages_per_rank") = 1);
  m.def("inject_swap_steps", &inject_order, py::arg("order"), py::arg("load_lookahead") = 1,
        py::arg("offload_wait_delay") = 1);
  m.def("check_orders", &check_orders, py::arg("orders"), py::arg("stages_per_rank") = 1);
  m.def("check_order", &check_order, py::arg("order"));
  m.attr("min_swap_gap") = sch::min_swap_gap;

  py::class_<device_budget_py>(m, "DeviceBudget", R"(One device-memory budget for pipeswap's swap jobs on a device.

DeviceBudget(device, capacity, strict=False) counts, in `capacity` bytes, the device storage that
SwapAdamW/SwapAdam (swapped state, staging arenas, prefetched and resident batches) and ActivationSwap
(the storage a load brings back) hold on `device`, while the object lives (close() detaches it).
Activation loads take precedence: an optimizer prefetch starts only when it leaves room for every
offloaded activation group to come back. Overshoot (default): a required reservation always
proceeds and is counted in stats()["over_budget_count"]; strict: it is refused with
torch.OutOfMemoryError, nothing changed. One budget per device at a time; set it while the swap jobs hold no device storage.)")
      .def(py::init<c10::Device, std::uint64_t, bool>(), py::arg("device"), py::arg("capacity"),
           py::arg("strict") = false)
      .def("close", &device_budget_py::close)
      .def("stats", &device_budget_py::stats)
      .def_property(
          "capacity", [](device_budget_py& b) { return b.get().capacity(); },
          [](device_budget_py& b, std::uint64_t c) { b.get().set_capacity(c); });

  py::class_<pt::saved_tensor>(m, "SavedTensor")
      .def_property_readonly("stage", [](pt::saved_tensor const& s) { return s.handle.chunk.stage; })
      .def_property_readonly("micro", [](pt::saved_tensor const& s) { return s.handle.chunk.micro; })
      .def_property_readonly("index", [](pt::saved_tensor const& s) { return s.handle.index; })
      .def("__repr__", [](pt::saved_tensor const& s) {
        return "<SavedTensor stage " + std::to_string(s.handle.chunk.stage) + " micro " +
               std::to_string(s.handle.chunk.micro) + " #" + std::to_string(s.handle.index) + ">";
      });

  py::class_<storage_ref>(m, "StorageRef")
      .def(py::init<at::Tensor const&>(), py::arg("tensor"))
      .def("expired", [](storage_ref const& r) { return r.weak.expired(); })
      .def_readonly("id", &storage_ref::id)
      .def_readonly("nbytes", &storage_ref::nbytes);

  py::class_<saved_tensors_py>(m, "SavedTensors")
      .def(py::init<c10::Device, std::int64_t>(), py::arg("device"), py::arg("min_bytes") = 0)
      .def("begin_run", &saved_tensors_py::begin_run)
      .def("end_run", &saved_tensors_py::end_run)
      .def("enter", &saved_tensors_py::enter)
      .def("exit", &saved_tensors_py::exit)
      .def("keep", &saved_tensors_py::keep)
      .def("pack", &saved_tensors_py::pack)
      .def("unpack", &saved_tensors_py::unpack)
      .def("launch_offload", &saved_tensors_py::launch_offload)
      .def("wait_offload", &saved_tensors_py::wait_offload)
      .def("launch_load", &saved_tensors_py::launch_load)
      .def("wait_load", &saved_tensors_py::wait_load)
      .def("release", &saved_tensors_py::release)
      .def("abort", &saved_tensors_py::abort)
      .def("has_group", &saved_tensors_py::has_group)
      .def("state", &saved_tensors_py::state)
      .def("moved_storages", &saved_tensors_py::moved_storages)
      .def("autograd_held", &saved_tensors_py::autograd_held)
      .def("stats", &saved_tensors_py::stats);

  py::class_<runtime>(m, "Runtime")
      .def(py::init<c10::Device, py::function>(), py::arg("device"), py::arg("update"))
      .def("add_param", &runtime::add_param, py::arg("param"), py::arg("keys"))
      .def("configure", &runtime::configure, py::arg("swap_times"), py::arg("packed"), py::arg("resident_share"),
           py::arg("defer_offload"), py::arg("min_swap_numel"))
      .def("set_active", &runtime::set_active)
      .def("step", &runtime::step)
      .def("prefetch", &runtime::prefetch, py::arg("max_batches") = py::none())
      .def("finish_offload", &runtime::finish_offload)
      .def_property_readonly("offload_pending", &runtime::offload_pending)
      .def("synchronize", &runtime::synchronize)
      .def("state_views", &runtime::state_views, py::arg("i"), py::arg("sync") = true)
      .def("reset_params", &runtime::reset_params)
      .def("stats", &runtime::stats);
}
