// pipeswap — Adam / AdamW over a backend, modelling the Optimizer concept.
//
// pipeswap::adam<B, Kernels> owns the optimizer's bookkeeping: parameters (device memory owned by the
// caller), their gradients, per-parameter step counts (as PyTorch keeps state['step']), and one
// state slot per logical tensor — exp_avg, exp_avg_sq, max_exp_avg_sq (amsgrad), master_param (an
// fp32 master for a bf16/f16 parameter). optimizer_swap decides where the slots live; this class
// only enqueues the math (optim/adam_math.hpp) through a kernel policy:
//
//   Kernels::update(B&, stream, std::span<adam_tensor<B> const>, std::span<adam_step_scalars const>)
//   Kernels::init_master(B&, stream, param, master, numel, dtype)
//
// adam_tensor<B> and the policy's contract (the concept adam_kernel_policy<K, B>, which adam<B, K>
// requires) are in <pipeswap/optim/adam_tensor.hpp>. adam_kernels<B> is
// the default policy, specialised next to each backend: the mock's in
// <pipeswap/optim/mock/adam_kernels.hpp> (host math in mock kernels), CUDA's in
// <pipeswap/optim/cuda/adam_kernels.hpp> (fused kernels; include that header too, and
// <pipeswap/optim/cuda/adam_kernels.cuh> in one .cu file — docs/cuda.md). A user backend specialises
// adam_kernels<B> or passes its own policy; host_adam_kernels<B>
// (<pipeswap/optim/host_adam_kernels.hpp>) is a complete one for backends whose memory the host can
// address.
#pragma once

#include <algorithm>
#include <cstddef>
#include <charconv>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/detail/lean_vector.hpp>
#include <pipeswap/core/dtype.hpp>
#include <pipeswap/detail/message.hpp>
#include <pipeswap/detail/view.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/optim/adam_math.hpp>
#include <pipeswap/optim/adam_tensor.hpp>
#include <pipeswap/optim/concepts.hpp>
#include <pipeswap/optim/host_adam_kernels.hpp>
#include <pipeswap/optim/state.hpp>

namespace pipeswap {

template <backend B, class Kernels = adam_kernels<B>>
requires adam_kernel_policy<Kernels, B>
class adam {
public:
  using optimizer_concept = optimizer_tag;
  using backend_type = B;
  static constexpr bool splittable = true;

  /// A parameter to optimize: device memory owned by the caller.
  struct param_desc {
    device_pointer_t<B> param{};
    device_pointer_t<B> grad{}; ///< null: no gradient yet (the parameter is skipped)
    std::size_t numel = 0;
    dtype type = dtype::f32;      ///< f32, bf16 or f16
    dtype grad_type = dtype::f32; ///< f32, bf16 or f16
    bool master = false;          ///< keep an fp32 master_param slot (needs a bf16/f16 parameter)
  };

  /// What prepare_step() hands to the rest of the step (opaque to everyone but adam).
  class step_context {
    friend class adam;
    detail::lean_vector<adam_step_scalars> scalars; ///< per distinct step count
    detail::lean_vector<std::uint32_t> unit_scalars;
  };

  explicit adam(B& b, adam_config cfg = {}, Kernels kernels = {})
      : b_(b), cfg_(cfg), kernels_(std::move(kernels)), state_(b) {
    cfg_.validate();
  }
  adam(adam const&) = delete;
  adam& operator=(adam const&) = delete;
  ~adam();

  /// Registers a parameter and describes its state slots; returns its index. Refused (state_error)
  /// while an optimizer_swap manages this optimizer: destroy the runtime, add the parameter, build a
  /// new runtime; the state of the other parameters carries over.
  ///
  /// Storage is checked (invalid_argument naming both indices; nothing registered): a parameter
  /// whose bytes overlap a registered parameter's (registered twice, e.g. tied embeddings: register
  /// the shared tensor once) is refused, as is a gradient that overlaps its own parameter or any
  /// registered parameter, and a parameter that overlaps a registered gradient. Each step would
  /// otherwise update those bytes twice, or read a gradient its own update rewrites. Parameters with
  /// numel 0 hold no bytes and overlap nothing. O(number of parameters) per call.
  std::size_t add_param(param_desc d);

  /// Sets (or clears, with a null pointer: no gradient, so the parameter is skipped from the next
  /// step on) parameter i's gradient for the coming steps. invalid_argument for an index not below
  /// size() or a gradient that overlaps a registered parameter; nothing changes then.
  void set_grad(std::size_t i, device_pointer_t<B> grad) {
    auto& p = checked(i, "set_grad");
    if (grad) {
      auto const bytes = p.desc.numel * size_of(p.desc.grad_type);
      for (std::size_t j = 0; j < params_.size(); ++j) {
        if (overlaps(grad, bytes, params_[j].desc.param, param_bytes(params_[j].desc))) {
          throw invalid_argument(
              detail::message({"adam::set_grad: the gradient of parameter ", i, " overlaps the storage of parameter ",
                               j, "; a gradient must not share bytes with any parameter"}));
        }
      }
    }
    p.desc.grad = grad;
  }

  /// Parameter i's step count. invalid_argument for an index not below size().
  [[nodiscard]] std::int64_t step_count(std::size_t i) const { return checked(i, "step_count").step; }
  [[nodiscard]] adam_config const& config() const noexcept { return cfg_; }
  [[nodiscard]] std::size_t size() const noexcept { return params_.size(); }
  /// Parameter i as registered. invalid_argument for an index not below size().
  [[nodiscard]] param_desc const& param(std::size_t i) const { return checked(i, "param").desc; }

  // ----- Optimizer concept -------------------------------------------------------------------------

  void validate() { cfg_.validate(); }

  std::span<slot_desc const> slots() const noexcept { return detail::view(slots_); }
  optimizer_state<B>& swap_state() noexcept { return state_; }

  void initialize(std::size_t slot, device_pointer_t<B> dst) {
    if (slot >= slots_.size()) {
      throw invalid_argument(detail::message(
          {"adam::initialize: slot ", slot, " is not below the ", slots_.size(), " slots of this optimizer"}));
    }
    auto const& d = params_[slots_[slot].param].desc;
    kernels_.init_master(b_, b_.current_stream(), d.param, dst, d.numel, d.type);
  }

  step_context prepare_step() {
    step_context ctx;
    // The units change only when the set of parameters with a gradient does.
    std::size_t n = 0;
    bool same = true;
    for (auto const& u : all_units_) {
      if (!params_[u.param].desc.grad) continue;
      same = same && n < units_.size() && units_[n].param == u.param;
      ++n;
    }
    if (!same || n != units_.size()) {
      units_.clear();
      for (auto const& u : all_units_) {
        if (params_[u.param].desc.grad) units_.push_back(u);
      }
    }
    ctx.unit_scalars.resize_for_overwrite(units_.size());
    for (std::size_t k = 0; k < units_.size(); ++k) {
      auto const step = ++params_[units_[k].param].step;
      std::uint32_t i = 0; // parameters usually share one step count: a short linear search
      while (i < ctx.scalars.size() && ctx.scalars[i].step != step) ++i;
      if (i == ctx.scalars.size()) ctx.scalars.push_back(make_step_scalars(cfg_, step));
      ctx.unit_scalars[k] = i;
    }
    return ctx;
  }

  std::span<update_unit const> update_units(step_context&) { return detail::view(units_); }

  void update(std::span<unit_range const> batch, step_context& ctx, state_view<B> const& view) {
    // One tensor per non-empty range, written in place: sized for every range first, trimmed last.
    detail::lean_vector<adam_tensor<B>> ts;
    ts.resize_for_overwrite(batch.size());
    std::size_t n = 0;
    for (std::size_t k = 0; k < batch.size(); ++k) {
      auto const& r = batch[k];
      if (r.unit >= units_.size()) {
        throw invalid_argument(detail::message({"adam::update: batch range ", k, " names unit ", r.unit,
                                                ", not below the step's ", units_.size(), " units"}));
      }
      auto const& u = units_[r.unit];
      if (r.begin > r.end || r.end > u.numel) {
        throw invalid_argument(detail::message({"adam::update: batch range ", k, " covers elements [", r.begin, ", ",
                                                r.end, ") of a unit of ", u.numel, " elements"}));
      }
      auto const& d = params_[u.param].desc;
      auto& t = ts[n]; // every member is written below; kept only when it has elements
      t.numel = r.end - r.begin;
      t.param = d.param + r.begin * size_of(d.type);
      t.grad = d.grad + r.begin * size_of(d.grad_type);
      t.param_type = d.type;
      t.grad_type = d.grad_type;
      t.scalars = ctx.unit_scalars[r.unit];
      // A unit's slots in add_param's order: exp_avg, exp_avg_sq, then max_exp_avg_sq (amsgrad) and
      // master_param (a master), each when present.
      auto const* s = u.slots.data();
      t.exp_avg = view.device_at(s[0], r.begin);
      t.exp_avg_sq = view.device_at(s[1], r.begin);
      std::size_t j = 2;
      t.max_exp_avg_sq = cfg_.amsgrad ? view.device_at(s[j++], r.begin) : device_pointer_t<B>{};
      t.master = d.master ? view.device_at(s[j], r.begin) : device_pointer_t<B>{};
      n += t.numel != 0;
    }
    ts.resize_for_overwrite(n);
    if (!ts.empty()) kernels_.update(b_, b_.current_stream(), detail::view(ts), detail::view(ctx.scalars));
  }

  void finish_step(step_context&) {}

  /// Hyper-parameters and per-parameter step counts, as strings (checkpoint metadata).
  std::map<std::string, std::string> metadata() const {
    std::map<std::string, std::string> m;
    m["optimizer"] = cfg_.decoupled_weight_decay ? "AdamW" : "Adam";
    m["lr"] = detail::format_double(cfg_.lr);
    m["beta1"] = detail::format_double(cfg_.beta1);
    m["beta2"] = detail::format_double(cfg_.beta2);
    m["eps"] = detail::format_double(cfg_.eps);
    m["weight_decay"] = detail::format_double(cfg_.weight_decay);
    m["amsgrad"] = cfg_.amsgrad ? "true" : "false";
    m["maximize"] = cfg_.maximize ? "true" : "false";
    m["params"] = std::to_string(params_.size());
    std::string steps;
    for (std::size_t i = 0; i < params_.size(); ++i) steps += (i ? "," : "") + std::to_string(params_[i].step);
    m["steps"] = steps;
    return m;
  }

  /// Restores step counts from metadata written by metadata(). The hyper-parameters must match this
  /// optimizer's (a checkpoint of another configuration is rejected, naming the key).
  void load_metadata(std::map<std::string, std::string> const& m) {
    auto get = [&](std::string const& k) -> std::string const& {
      auto it = m.find(k);
      if (it == m.end()) throw invalid_argument("adam: checkpoint metadata lacks '" + k + "'");
      return it->second;
    };
    auto const mine = metadata();
    for (auto const& k :
         {"optimizer", "lr", "beta1", "beta2", "eps", "weight_decay", "amsgrad", "maximize", "params"}) {
      if (get(k) != mine.at(k)) {
        throw invalid_argument(std::string("adam: checkpoint metadata '") + k + "' is '" + get(k) +
                               "' but this optimizer has '" + mine.at(k) + "'");
      }
    }
    detail::lean_vector<std::int64_t> steps;
    std::string const& text = get("steps");
    std::size_t pos = 0;
    while (pos <= text.size() && !text.empty()) {
      auto const comma = text.find(',', pos);
      auto const field = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      std::int64_t v = -1;
      auto const r = std::from_chars(field.data(), field.data() + field.size(), v);
      if (r.ec != std::errc{} || r.ptr != field.data() + field.size() || v < 0) {
        throw invalid_argument("adam: checkpoint metadata 'steps' has a bad entry '" + field + "'");
      }
      steps.push_back(v);
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
    if (steps.size() != params_.size()) {
      throw invalid_argument(detail::message(
          {"adam: checkpoint metadata 'steps' has ", steps.size(), " entries for ", params_.size(), " parameters"}));
    }
    for (std::size_t i = 0; i < params_.size(); ++i) params_[i].step = steps[i];
  }

private:
  struct param_state {
    param_desc desc;
    std::int64_t step = 0;
  };

  param_state& checked(std::size_t i, char const* call) {
    return const_cast<param_state&>(std::as_const(*this).checked(i, call));
  }
  param_state const& checked(std::size_t i, char const* call) const {
    if (i >= params_.size()) {
      throw invalid_argument(detail::message({"adam::", call, ": parameter index ", i, " is not below the ",
                                              params_.size(), " parameters of this optimizer"}));
    }
    return params_[i];
  }
  static std::size_t param_bytes(param_desc const& d) noexcept { return d.numel * size_of(d.type); }
  static std::size_t grad_bytes(param_desc const& d) noexcept { return d.numel * size_of(d.grad_type); }
  /// Whether [a, a + na) and [b, b + nb) share a byte (null or empty ranges share none).
  static bool overlaps(device_pointer_t<B> a, std::size_t na, device_pointer_t<B> b, std::size_t nb) {
    return a && b && na && nb && a < b + nb && b < a + na;
  }

  B& b_;
  adam_config cfg_;
  Kernels kernels_;
  detail::lean_vector<param_state> params_;
  detail::lean_vector<slot_desc> slots_;
  detail::lean_vector<update_unit> all_units_;
  detail::lean_vector<update_unit> units_;
  optimizer_state<B> state_; // last: destroyed first, while the backend is still there
};

// Defined out of the class, so not inline: a translation unit that declares adam<B> extern
// (PIPESWAP_EXTERN_ADAM) neither instantiates nor compiles them.
template <backend B, class Kernels>
requires adam_kernel_policy<Kernels, B> adam<B, Kernels>::~adam() = default;

template <backend B, class Kernels>
requires adam_kernel_policy<Kernels, B> std::size_t adam<B, Kernels>::add_param(param_desc d) {
  state_.require_detached("adam::add_param");
  if (!detail::is_adam_storage(d.type) || !detail::is_adam_storage(d.grad_type)) {
    throw invalid_argument(
        detail::message({"adam::add_param: parameter ", params_.size(), " has type ", name_of(d.type), "/",
                         name_of(d.grad_type), "; F32, BF16 and F16 are supported"}));
  }
  if (d.master && d.type == dtype::f32) {
    throw invalid_argument(
        detail::message({"adam::add_param: parameter ", params_.size(), " is F32 and needs no master_param"}));
  }
  auto const i = params_.size();
  auto refuse = [&](std::string_view what, std::size_t j, std::string_view theirs) {
    throw invalid_argument(detail::message(
        {"adam::add_param: ", what, " of parameter ", i, " overlaps the ", theirs, " of parameter ", j,
         theirs == "storage" && what == "the storage" ? "; register a shared (tied) tensor once"
                                                      : "; a gradient must not share bytes with any parameter"}));
  };
  auto const pb = param_bytes(d), gb = grad_bytes(d);
  if (overlaps(d.grad, gb, d.param, pb)) {
    throw invalid_argument(
        detail::message({"adam::add_param: the gradient of parameter ", i,
                         " overlaps its own storage; a gradient must not share bytes with any parameter"}));
  }
  for (std::size_t j = 0; j < i; ++j) {
    auto const& o = params_[j].desc;
    if (overlaps(d.param, pb, o.param, param_bytes(o))) refuse("the storage", j, "storage");
    if (overlaps(d.grad, gb, o.param, param_bytes(o))) refuse("the gradient", j, "storage");
    if (overlaps(d.param, pb, o.grad, grad_bytes(o))) refuse("the storage", j, "gradient");
  }
  params_.push_back({d, 0});
  auto& u = all_units_.emplace_back();
  u.param = i;
  u.numel = d.numel;
  auto make = [&](state_key k, slot_init init) {
    u.slots.push_back(slots_.size());
    slots_.push_back({i, k, dtype::f32, d.numel, init});
  };
  make(state_key::exp_avg, slot_init::zeros);
  make(state_key::exp_avg_sq, slot_init::zeros);
  if (cfg_.amsgrad) make(state_key::max_exp_avg_sq, slot_init::zeros);
  if (d.master) make(state_key::master_param, slot_init::from_param);
  return i;
}

/// AdamW: Adam with decoupled weight decay (PyTorch's default weight_decay for AdamW is 0.01).
template <backend B, class Kernels = adam_kernels<B>>
requires adam_kernel_policy<Kernels, B>
class adamw : public adam<B, Kernels> {
public:
  explicit adamw(B& b, adam_config cfg = with_decay(), Kernels kernels = {})
      : adam<B, Kernels>(b, decoupled(cfg), std::move(kernels)) {}
  static adam_config with_decay() {
    adam_config c;
    c.weight_decay = 0.01;
    c.decoupled_weight_decay = true;
    return c;
  }

private:
  static adam_config decoupled(adam_config c) {
    c.decoupled_weight_decay = true;
    return c;
  }
};

} // namespace pipeswap
