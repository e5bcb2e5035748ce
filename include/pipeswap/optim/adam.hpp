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
// adam_tensor<B> and the policy's contract are in <pipeswap/optim/adam_tensor.hpp>. adam_kernels<B> is
// the default policy: specialised for the mock backend here (host math in mock kernels) and for the
// CUDA backend in <pipeswap/optim/cuda/adam_kernels.hpp> (fused kernels; include that header too, and
// <pipeswap/optim/cuda/adam_kernels.cuh> in one .cu file — docs/cuda.md). A user backend passes its
// own policy.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/backend/mock.hpp>
#include <pipeswap/core/dtype.hpp>
#include <pipeswap/core/half.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/optim/adam_math.hpp>
#include <pipeswap/optim/adam_tensor.hpp>
#include <pipeswap/optim/concepts.hpp>
#include <pipeswap/swap/slot.hpp>

namespace pipeswap {

namespace detail {

/// Calls f(P{}) with P the storage type of `t` (float, bf16, f16).
template <class F>
decltype(auto) with_storage_type(dtype t, F&& f) {
  switch (t) {
  case dtype::bf16: return f(bf16{});
  case dtype::f16: return f(f16{});
  default: return f(float{});
  }
}

/// One range in host-addressable memory, no checks: with a master, the update of the fp32 master then
/// its rounding into the parameter; without, the update of the parameter in place. `vmax` may be
/// null unless s.amsgrad. The host-executed kernels (mock, user backends) and the tests call it.
inline void adam_range_unchecked(adam_step_scalars const& s, dtype param_type, dtype grad_type, void* param,
                                 void const* grad, float* exp_avg, float* exp_avg_sq, float* vmax,
                                 float* master, std::size_t n) {
  with_storage_type(grad_type, [&](auto g0) {
    using G = decltype(g0);
    auto const* g = static_cast<G const*>(grad);
    with_storage_type(param_type, [&](auto p0) {
      using P = decltype(p0);
      if (master != nullptr) {
        adam_update_unchecked<float, G>(s, master, g, exp_avg, exp_avg_sq, vmax, n);
        cast_master_to_param_unchecked<P>(master, static_cast<P*>(param), n);
      } else {
        adam_update_unchecked<P, G>(s, static_cast<P*>(param), g, exp_avg, exp_avg_sq, vmax, n);
      }
    });
  });
}

/// The range through a mock kernel's views (declared regions only).
template <class View>
void adam_range_host(View const& k, adam_tensor<mock::backend> const& t, adam_step_scalars const& s) {
  auto const n = t.numel;
  auto f32 = [&](device_ptr p) { return k.template write<float>(p, n).data(); };
  adam_range_unchecked(s, t.param_type, t.grad_type,
                       k.template write<std::byte>(t.param, n * size_of(t.param_type)).data(),
                       k.template read<std::byte>(t.grad, n * size_of(t.grad_type)).data(), f32(t.exp_avg),
                       f32(t.exp_avg_sq), s.amsgrad ? f32(t.max_exp_avg_sq) : nullptr,
                       t.master ? f32(t.master) : nullptr, n);
}

} // namespace detail

/// Mock backend: one mock kernel per batch, declaring every range it reads and writes, running the
/// host math (so results equal the CUDA kernels' bit for bit — they share adam_element). Checks the
/// batch as the CUDA policy does (validate_adam_batch) before launching.
template <>
struct adam_kernels<mock::backend> {
  void update(mock::backend& b, mock::stream s, std::span<adam_tensor<mock::backend> const> ts,
              std::span<adam_step_scalars const> scalars) const {
    validate_adam_batch(ts, scalars);
    std::vector<mock::region> reads, writes;
    for (auto const& t : ts) {
      if (t.numel == 0) continue;
      reads.push_back({t.grad, t.numel * size_of(t.grad_type)});
      writes.push_back({t.param, t.numel * size_of(t.param_type)});
      writes.push_back({t.exp_avg, t.numel * 4});
      writes.push_back({t.exp_avg_sq, t.numel * 4});
      if (t.max_exp_avg_sq) writes.push_back({t.max_exp_avg_sq, t.numel * 4});
      if (t.master) writes.push_back({t.master, t.numel * 4});
    }
    b.launch(s, {"adam", std::move(reads), std::move(writes), std::nullopt},
             [ts = std::vector(ts.begin(), ts.end()),
              sc = std::vector(scalars.begin(), scalars.end())](mock::kernel_context const& k) {
               for (auto const& t : ts) {
                 if (t.numel != 0) detail::adam_range_host(k, t, sc[t.scalars]);
               }
             });
  }

  void init_master(mock::backend& b, mock::stream s, device_ptr param, device_ptr master,
                   std::size_t numel, dtype type) const {
    b.launch(s, {"init master", {{param, numel * size_of(type)}}, {{master, numel * 4}}, std::nullopt},
             [=](mock::kernel_context const& k) {
               auto out = k.write<float>(master, numel);
               detail::with_storage_type(type, [&](auto p0) {
                 using P = decltype(p0);
                 auto in = k.read<P>(param, numel);
                 for (std::size_t i = 0; i < numel; ++i) out[i] = to_float(in[i]);
               });
             });
  }
};

template <backend B, class Kernels = adam_kernels<B>>
class adam {
public:
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

  struct step_context {
    std::vector<adam_step_scalars> scalars; ///< per distinct step count
    std::vector<std::uint32_t> unit_scalars;
  };

  explicit adam(B& b, adam_config cfg = {}, Kernels kernels = {})
      : b_(b), cfg_(cfg), kernels_(std::move(kernels)) {
    cfg_.validate();
  }
  adam(adam const&) = delete;
  adam& operator=(adam const&) = delete;

  /// Registers a parameter and creates its state slots; returns its index. Register every parameter
  /// before constructing the optimizer_swap that manages them.
  std::size_t add_param(param_desc d) {
    if (!detail::is_adam_storage(d.type) || !detail::is_adam_storage(d.grad_type)) {
      throw invalid_argument("adam::add_param: parameter " + std::to_string(params_.size()) +
                             " has type " + std::string(name_of(d.type)) + "/" +
                             std::string(name_of(d.grad_type)) + "; F32, BF16 and F16 are supported");
    }
    if (d.master && d.type == dtype::f32) {
      throw invalid_argument("adam::add_param: parameter " + std::to_string(params_.size()) +
                             " is F32 and needs no master_param");
    }
    auto const i = params_.size();
    params_.push_back({d, 0});
    auto& u = all_units_.emplace_back();
    u.param = i;
    u.numel = d.numel;
    auto make = [&](state_key k, slot_init init) {
      auto& s = slots_.emplace_back();
      s.param = i;
      s.key = k;
      s.type = dtype::f32;
      s.numel = d.numel;
      s.init = init;
      u.slots.push_back(&s);
      slot_ptrs_.push_back(&s);
    };
    make(state_key::exp_avg, slot_init::zeros);
    make(state_key::exp_avg_sq, slot_init::zeros);
    if (cfg_.amsgrad) make(state_key::max_exp_avg_sq, slot_init::zeros);
    if (d.master) make(state_key::master_param, slot_init::from_param);
    return i;
  }

  /// Sets (or clears, with a null pointer) parameter i's gradient for the coming steps.
  void set_grad(std::size_t i, device_pointer_t<B> grad) { params_.at(i).desc.grad = grad; }

  [[nodiscard]] std::int64_t step_count(std::size_t i) const { return params_.at(i).step; }
  [[nodiscard]] adam_config const& config() const noexcept { return cfg_; }
  [[nodiscard]] std::size_t size() const noexcept { return params_.size(); }
  [[nodiscard]] param_desc const& param(std::size_t i) const { return params_.at(i).desc; }

  // ----- Optimizer concept -------------------------------------------------------------------------

  void validate() { cfg_.validate(); }

  std::span<swap_slot<B>* const> slots() { return slot_ptrs_; }

  void initialize(swap_slot<B>& s) {
    auto const& d = params_.at(s.param).desc;
    kernels_.init_master(b_, b_.current_stream(), d.param, s.device_at(0), d.numel, d.type);
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
    ctx.unit_scalars.reserve(units_.size());
    for (auto const& u : units_) {
      auto const step = ++params_[u.param].step;
      std::uint32_t i = 0; // parameters usually share one step count: a short linear search
      while (i < ctx.scalars.size() && ctx.scalars[i].step != step) ++i;
      if (i == ctx.scalars.size()) ctx.scalars.push_back(make_step_scalars(cfg_, step));
      ctx.unit_scalars.push_back(i);
    }
    return ctx;
  }

  std::span<update_unit<B> const> update_units(step_context&) { return units_; }

  void update(std::span<unit_range const> batch, step_context& ctx) {
    std::vector<adam_tensor<B>> ts;
    ts.reserve(batch.size());
    for (auto const& r : batch) {
      auto const& u = units_.at(r.unit);
      auto const& d = params_[u.param].desc;
      adam_tensor<B> t;
      t.numel = r.end - r.begin;
      t.param = d.param + r.begin * size_of(d.type);
      t.grad = d.grad + r.begin * size_of(d.grad_type);
      t.param_type = d.type;
      t.grad_type = d.grad_type;
      t.scalars = ctx.unit_scalars[r.unit];
      for (auto* s : u.slots) {
        auto const p = s->device_at(r.begin);
        switch (s->key) {
        case state_key::exp_avg: t.exp_avg = p; break;
        case state_key::exp_avg_sq: t.exp_avg_sq = p; break;
        case state_key::max_exp_avg_sq: t.max_exp_avg_sq = p; break;
        case state_key::master_param: t.master = p; break;
        }
      }
      if (t.numel) ts.push_back(t);
    }
    if (!ts.empty()) kernels_.update(b_, b_.current_stream(), ts, ctx.scalars);
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
    for (auto const& k : {"optimizer", "lr", "beta1", "beta2", "eps", "weight_decay", "amsgrad",
                          "maximize", "params"}) {
      if (get(k) != mine.at(k)) {
        throw invalid_argument(std::string("adam: checkpoint metadata '") + k + "' is '" + get(k) +
                               "' but this optimizer has '" + mine.at(k) + "'");
      }
    }
    std::vector<std::int64_t> steps;
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
      throw invalid_argument("adam: checkpoint metadata 'steps' has " + std::to_string(steps.size()) +
                             " entries for " + std::to_string(params_.size()) + " parameters");
    }
    for (std::size_t i = 0; i < params_.size(); ++i) params_[i].step = steps[i];
  }

private:
  struct param_state {
    param_desc desc;
    std::int64_t step = 0;
  };

  B& b_;
  adam_config cfg_;
  Kernels kernels_;
  std::vector<param_state> params_;
  std::deque<swap_slot<B>> slots_;
  std::vector<swap_slot<B>*> slot_ptrs_;
  std::vector<update_unit<B>> all_units_;
  std::vector<update_unit<B>> units_;
};

/// AdamW: Adam with decoupled weight decay (PyTorch's default weight_decay for AdamW is 0.01).
template <backend B, class Kernels = adam_kernels<B>>
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

static_assert(swap_optimizer<adam<mock::backend>>);
static_assert(swap_optimizer<adamw<mock::backend>>);

} // namespace pipeswap
