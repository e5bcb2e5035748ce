// pipeswap — tensor_optimizer: the Optimizer concept over torch tensors, with the math left to a
// callback.
//
// pipeswap::torch::tensor_optimizer describes one state slot per (parameter, state key), each with
// the parameter's shape, strides and dtype (as torch keeps Adam's state: zeros_like(param)), and on
// every batch of a step hands the callback torch tensors that view the batch's slots where the
// runtime placed them (device storage, a staging arena). The callback runs the update — in
// pipeswap.torch, torch's own Adam/AdamW — so the results are torch's bits; optimizer_swap moves the
// state. Units are whole parameters (splittable = false): torch's kernels are elementwise, but a
// vectorized kernel's rounding may depend on where a tensor's scalar tail starts, so a parameter is
// never cut.
//
//   tensor_optimizer opt(backend, callback);
//   auto i = opt.add_param(param.sizes(), param.strides(), param.scalar_type(), {exp_avg, exp_avg_sq});
//   opt.set_active({i});              // the parameters that have a gradient this step, in order
//   optimizer_swap<tensor_optimizer> rt(engine, opt, cfg);
//   rt.step();                        // callback(items) once per batch
//
// Rules: add_param is refused while a runtime is attached (swap_state().require_detached); set_active
// names registered parameters, each once. The callback must update the whole batch or throw before
// changing anything it was given; the views are valid only during the call.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <sstream>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/ScalarType.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/ArrayRef.h>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/backend/torch/backend.hpp>
#include <pipeswap/core/dtype.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/optim/concepts.hpp>
#include <pipeswap/optim/state.hpp>

namespace pipeswap::torch {

/// pipeswap's dtype for a torch scalar type; throws invalid_argument naming `who` for the types a
/// state slot cannot hold (anything but float64/32, bfloat16, float16).
inline dtype to_dtype(c10::ScalarType t, std::string const& who) {
  switch (t) {
  case c10::ScalarType::Float: return dtype::f32;
  case c10::ScalarType::Double: return dtype::f64;
  case c10::ScalarType::BFloat16: return dtype::bf16;
  case c10::ScalarType::Half: return dtype::f16;
  default:
    throw invalid_argument(who + " has dtype torch." + std::string(c10::getDtypeNames(t).first) +
                           "; state slots hold float32, float64, bfloat16 or float16");
  }
}

/// The layout rule of a state slot (a slot like the tensor it belongs to), checked for a tensor of
/// `sizes`, `strides` and `type`: a dtype a slot holds (to_dtype), and a dense, non-overlapping
/// layout (every element exactly once, the dimensions in any order; a tensor without elements has
/// any strides). Throws invalid_argument naming `who`; returns the slot's dtype. add_param checks
/// it; pipeswap.torch checks it through pipeswap._C before a parameter joins an optimizer.
inline dtype check_slot_layout(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ScalarType type,
                               std::string const& who) {
  auto const dt = to_dtype(type, who);
  if (sizes.size() != strides.size()) throw invalid_argument(who + ": sizes and strides differ in rank");
  std::vector<std::pair<std::int64_t, std::int64_t>> dims; // (stride, size) of the dimensions longer than 1
  bool empty = false;
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] < 0) throw invalid_argument(who + ": negative size");
    if (sizes[d] == 0) empty = true;
    if (sizes[d] > 1) dims.emplace_back(strides[d], sizes[d]);
  }
  if (empty) return dt;
  std::ranges::sort(dims);
  std::int64_t expect = 1;
  for (auto const& [stride, size] : dims) {
    if (stride != expect) {
      std::ostringstream s;
      s << who << " is not dense and non-overlapping (shape " << sizes << ", stride " << strides
        << "); its state slots need a layout that holds every element exactly once";
      throw invalid_argument(s.str());
    }
    expect *= size;
  }
  return dt;
}

class tensor_optimizer {
public:
  using optimizer_concept = optimizer_tag;
  using backend_type = backend;
  static constexpr bool splittable = false;
  struct step_context {};

  /// One parameter of a batch: its index (add_param's) and views of its slots, in the order of the
  /// keys it was registered with.
  struct batch_item {
    std::size_t param = 0;
    std::vector<at::Tensor> states;
  };
  using update_fn = std::function<void(std::vector<batch_item>&)>;

  tensor_optimizer(backend& b, update_fn fn) : b_(b), fn_(std::move(fn)), state_(b) {}
  tensor_optimizer(tensor_optimizer const&) = delete;
  tensor_optimizer& operator=(tensor_optimizer const&) = delete;

  /// Registers a parameter of the given layout whose state has `keys` (each a slot like the
  /// parameter); returns its index. Refused while a runtime is attached.
  std::size_t add_param(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ScalarType type,
                        std::vector<state_key> const& keys) {
    state_.require_detached("pipeswap::torch::tensor_optimizer::add_param");
    auto const i = params_.size();
    auto const who = pipeswap::detail::message({"parameter ", i});
    // Dense and non-overlapping, so a slot of numel elements holds the view.
    auto const dt = check_slot_layout(sizes, strides, type, who);
    std::size_t numel = 1;
    for (auto s : sizes) numel *= static_cast<std::size_t>(s);
    if (keys.empty()) throw invalid_argument(who + ": no state keys");
    param p{{sizes.begin(), sizes.end()}, {strides.begin(), strides.end()}, type, {}};
    update_unit u{i, numel, {}};
    for (auto k : keys) {
      p.slots.push_back(slots_.size());
      u.slots.push_back(slots_.size());
      slots_.push_back({i, k, dt, numel, slot_init::zeros});
    }
    params_.push_back(std::move(p));
    all_units_.push_back(std::move(u));
    return i;
  }

  /// The parameters the next step updates, in this order (each once, all registered).
  void set_active(std::vector<std::size_t> const& active) {
    std::vector<bool> seen(params_.size(), false);
    std::vector<update_unit> units;
    units.reserve(active.size());
    for (auto i : active) {
      if (i >= params_.size()) {
        throw invalid_argument(pipeswap::detail::message(
            {"tensor_optimizer::set_active: parameter ", i, " is not registered (", params_.size(), " are)"}));
      }
      if (seen[i])
        throw invalid_argument(pipeswap::detail::message({"tensor_optimizer::set_active: parameter ", i, " twice"}));
      seen[i] = true;
      units.push_back(all_units_[i]);
    }
    // Keep the same vector when nothing changed: the runtime reuses its plan while units stay equal.
    bool same = units.size() == units_.size();
    for (std::size_t k = 0; same && k < units.size(); ++k) same = units[k].param == units_[k].param;
    if (!same) units_ = std::move(units);
  }

  [[nodiscard]] std::size_t size() const noexcept { return params_.size(); }
  /// Slot indices of parameter i, in the order of its keys.
  [[nodiscard]] std::vector<std::size_t> const& param_slots(std::size_t i) const { return params_.at(i).slots; }
  /// A tensor of parameter i's layout over the bytes at `p` on `device`.
  [[nodiscard]] at::Tensor view(std::size_t i, void* p, c10::Device device) const {
    auto const& d = params_.at(i);
    return at::from_blob(p, d.sizes, d.strides, at::TensorOptions().dtype(d.type).device(device));
  }

  // ----- Optimizer concept -------------------------------------------------------------------------
  void validate() {}
  [[nodiscard]] std::span<slot_desc const> slots() const noexcept { return slots_; }
  optimizer_state<backend>& swap_state() noexcept { return state_; }
  void initialize(std::size_t slot, device_pointer_t<backend>) {
    throw state_error("tensor_optimizer: slot " + slots_.at(slot).name() + " has no from_param initializer");
  }
  step_context prepare_step() { return {}; }
  std::span<update_unit const> update_units(step_context&) { return units_; }
  void update(std::span<unit_range const> batch, step_context&, state_view<backend> const& v) {
    std::vector<batch_item> items;
    items.reserve(batch.size());
    for (auto const& r : batch) {
      auto const& u = units_.at(r.unit);
      batch_item it{u.param, {}};
      it.states.reserve(u.slots.size());
      for (auto const s : u.slots) it.states.push_back(view(u.param, v.device_at(s, 0).get(), b_.device()));
      items.push_back(std::move(it));
    }
    if (!items.empty()) fn_(items);
  }
  void finish_step(step_context&) {}
  [[nodiscard]] std::map<std::string, std::string> metadata() const {
    return {{"optimizer", "tensor_optimizer"}, {"params", std::to_string(params_.size())}};
  }
  void load_metadata(std::map<std::string, std::string> const& m) {
    auto it = m.find("params");
    if (it == m.end() || it->second != std::to_string(params_.size())) {
      throw invalid_argument(pipeswap::detail::message({"tensor_optimizer: checkpoint metadata 'params' is '",
                                                        (it == m.end() ? std::string("(missing)") : it->second),
                                                        "' but this optimizer has ", params_.size()}));
    }
  }

private:
  struct param {
    std::vector<std::int64_t> sizes;
    std::vector<std::int64_t> strides;
    c10::ScalarType type;
    std::vector<std::size_t> slots;
  };
  backend& b_;
  update_fn fn_;
  std::vector<param> params_;
  std::vector<slot_desc> slots_;
  std::vector<update_unit> all_units_;
  std::vector<update_unit> units_;
  optimizer_state<backend> state_; // last: destroyed first, while the backend is still there
};

static_assert(swap_optimizer<tensor_optimizer>);

} // namespace pipeswap::torch
