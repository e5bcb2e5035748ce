// Training worlds for the checkpoint tests: Adam/AdamW (amsgrad, bf16 parameters with fp32 masters)
// over any backend of support/backend_list.hpp, CUDA's included (adam_world: over the mock), and a small momentum optimizer whose state slots are bf16, both with
// deterministic parameters and gradients, and helpers that read every parameter and state byte
// independently of the checkpoint code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <span>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include <pipeswap/backend/mock.hpp>
#include <pipeswap/core/half.hpp>
#include <pipeswap/optim/mock/adam_kernels.hpp>
#include <pipeswap/optim/adam.hpp>
#include <pipeswap/optim/concepts.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>
#if defined(PIPESWAP_TEST_CUDA)
#  include <pipeswap/optim/cuda/adam_kernels.hpp> // adam_kernels<cuda::backend>, defined by tests/cuda/adam_cuda.cu
#endif

#include "support/backend_list.hpp" // the test backends, their traits and upload()/download()
#include "support/toy_optimizer.hpp"
#include "support/world.hpp"

namespace pipeswap::test {

using bytes = std::vector<std::byte>;

/// Parameter sizes: swappable ones, ones under min_swap_numel 64 (they stay on the device), one empty.
inline std::vector<std::size_t> const checkpoint_sizes{3000, 1, 0, 65, 2048, 7, 4096, 100, 63};

inline swap_config checkpoint_swap(bool packed, std::size_t swap_times = 3, std::size_t min_swap_numel = 64) {
  swap_config c;
  c.swap_times = swap_times;
  c.packed = packed;
  c.min_swap_numel = min_swap_numel;
  return c;
}

/// Every slot's bytes (after a quiesce: mirrors of swappable slots, device bytes of the others).
template <class Runtime, class B>
std::vector<bytes> state_bytes(Runtime& rt, B& b) {
  rt.synchronize_host_mirrors();
  std::vector<bytes> out;
  auto const slots = rt.optimizer().slots();
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].bytes() == 0) {
      out.emplace_back();
    } else if (rt.is_swappable(i)) {
      auto const m = rt.host_mirror(i);
      detail::note_host_read(b, m.data(), m.size());
      out.emplace_back(m.begin(), m.end());
    } else {
      out.push_back(download(b, rt.unswappable_device(i), slots[i].bytes()));
    }
  }
  return out;
}

/// Mock options that record hazards instead of throwing, for tests that assert PIPESWAP_CHECK_NO_HAZARDS.
inline mock::options recording_hazards() {
  mock::options o{mock::timing_model::unit()};
  o.hazards = mock::hazard_policy::record;
  return o;
}

/// What adam_world trains.
struct adam_spec {
  std::vector<std::size_t> sizes = checkpoint_sizes;
  bool amsgrad = true;
  bool masters = true;
  bool adamw = true;
  double lr = 0.01;
};

/// The options adam_world<B> makes its backend with by default: the mock on unit time, raising
/// hazards; the threaded backend with its default jitter; another backend (CUDA) as its
/// backend_traits make it (std::monostate).
template <class B>
auto default_options() {
  if constexpr (std::is_same_v<B, mock::backend>) {
    return mock::options{mock::timing_model::unit()};
  } else if constexpr (std::is_same_v<B, threaded_backend>) {
    return threaded_backend_options{};
  } else {
    return std::monostate{};
  }
}

template <class B, class O>
B make_world_backend(O const& o) {
  if constexpr (std::is_same_v<O, std::monostate>) {
    return backend_traits<B>::make();
  } else {
    return B(o);
  }
}

/// Adam or AdamW over parameters on a B; even-indexed parameters are bf16 with an fp32 master when
/// `masters` is set.
template <class B>
struct basic_adam_world {
  using opt_t = adam<B>;
  using spec = adam_spec;

  explicit basic_adam_world(spec s = {}, decltype(default_options<B>()) o = default_options<B>())
      : sp(std::move(s)), b(make_world_backend<B>(o)), x(b, {1 << 20, 1 << 18, 512}), opt(b, config(sp)) {
    auto cs = b.current_stream();
    for (std::size_t i = 0; i < sp.sizes.size(); ++i) {
      auto const n = sp.sizes[i];
      bool const half = is_half(i);
      params.push_back(b.allocate_device(n * elem(i), cs));
      grads.push_back(b.allocate_device(n * elem(i), cs));
      upload(params[i], random_floats(n, 11 + i), half);
      opt.add_param({params[i], grads[i], n, half ? dtype::bf16 : dtype::f32, half ? dtype::bf16 : dtype::f32, half});
    }
  }
  basic_adam_world(basic_adam_world const&) = delete;
  ~basic_adam_world() {
    auto cs = b.current_stream();
    for (std::size_t i = 0; i < sp.sizes.size(); ++i) {
      b.deallocate_device(params[i], sp.sizes[i] * elem(i), cs);
      b.deallocate_device(grads[i], sp.sizes[i] * elem(i), cs);
    }
  }

  static adam_config config(spec const& s) {
    adam_config c;
    c.lr = s.lr;
    c.weight_decay = 0.05;
    c.amsgrad = s.amsgrad;
    c.decoupled_weight_decay = s.adamw;
    return c;
  }
  [[nodiscard]] bool is_half(std::size_t i) const { return sp.masters && i % 2 == 0; }
  [[nodiscard]] std::size_t elem(std::size_t i) const { return is_half(i) ? 2 : 4; }

  void upload(device_ptr d, std::vector<float> const& v, bool half) {
    if (half) {
      std::vector<bf16> h(v.size());
      for (std::size_t k = 0; k < v.size(); ++k) h[k] = to_bf16(v[k]);
      test::upload(b, d, h.data(), h.size() * 2);
    } else {
      test::upload(b, d, v.data(), v.size() * 4);
    }
  }
  void set_grads(int step) {
    for (std::size_t i = 0; i < sp.sizes.size(); ++i) {
      auto v = random_floats(sp.sizes[i], 7919 * static_cast<std::uint64_t>(step + 1) + i);
      upload(grads[i], v, is_half(i));
    }
  }
  template <class Runtime>
  void train(Runtime& rt, int from, int to) {
    for (int k = from; k < to; ++k) {
      set_grads(k);
      rt.step();
    }
  }

  /// The parameters' bytes (what a model checkpoint would hold).
  std::vector<bytes> param_bytes() {
    std::vector<bytes> out;
    for (std::size_t i = 0; i < sp.sizes.size(); ++i) {
      out.push_back(download(b, params[i], sp.sizes[i] * elem(i)));
    }
    return out;
  }
  void set_param_bytes(std::vector<bytes> const& v) {
    for (std::size_t i = 0; i < v.size(); ++i) test::upload(b, params[i], v[i].data(), v[i].size());
  }

  /// Parameters, then every state slot, then the step counts: everything a resumed run must match.
  template <class Runtime>
  std::vector<bytes> everything(Runtime& rt) {
    auto out = param_bytes();
    for (auto& s : state_bytes(rt, b)) out.push_back(std::move(s));
    auto const steps = opt.metadata().at("steps");
    out.emplace_back(reinterpret_cast<std::byte const*>(steps.data()),
                     reinterpret_cast<std::byte const*>(steps.data() + steps.size()));
    return out;
  }

  spec sp;
  B b;
  transfer_engine<B> x;
  opt_t opt;
  std::vector<device_ptr> params, grads;
};

using adam_world = basic_adam_world<mock::backend>;

/// SGD with momentum whose momentum buffer (slot key exp_avg) is stored in bf16: m = bf16(μ·m + g),
/// p -= lr·m. A second optimizer model with a non-fp32 slot dtype.
class momentum_bf16 {
public:
  using optimizer_concept = optimizer_tag;
  using backend_type = mock::backend;
  using B = mock::backend;
  struct step_context {};
  static constexpr bool splittable = true;

  explicit momentum_bf16(B& b, float lr = 0.05f, float mu = 0.75f) : b_(b), lr_(lr), mu_(mu), state_(b) {}
  momentum_bf16(momentum_bf16 const&) = delete;

  std::size_t add_param(device_ptr param, device_ptr grad, std::size_t numel) {
    state_.require_detached("momentum_bf16::add_param");
    auto const i = params_.size();
    params_.push_back({param, grad, numel});
    auto& u = units_.emplace_back();
    u.param = i;
    u.numel = numel;
    u.slots.push_back(slots_.size());
    slots_.push_back({i, state_key::exp_avg, dtype::bf16, numel, slot_init::zeros});
    return i;
  }

  void validate() {}
  std::span<slot_desc const> slots() const noexcept { return slots_; }
  optimizer_state<B>& swap_state() noexcept { return state_; }
  void initialize(std::size_t, device_ptr) {}
  step_context prepare_step() {
    ++steps_;
    return {};
  }
  std::span<update_unit const> update_units(step_context&) { return units_; }
  void update(std::span<unit_range const> batch, step_context&, state_view<B> const& view) {
    std::vector<mock::region> reads, writes;
    struct job {
      device_ptr p, g, m;
      std::size_t n;
    };
    std::vector<job> jobs;
    for (auto const& r : batch) {
      auto const& u = units_[r.unit];
      auto const& prm = params_[u.param];
      auto const n = r.end - r.begin;
      if (n == 0) continue;
      job j{prm.param + r.begin * 4, prm.grad + r.begin * 4, view.device_at(u.slots[0], r.begin), n};
      reads.push_back({j.g, n * 4});
      writes.push_back({j.p, n * 4});
      writes.push_back({j.m, n * 2});
      jobs.push_back(j);
    }
    if (jobs.empty()) return;
    float const lr = lr_, mu = mu_;
    host_kernel<B>::run(b_, "momentum", std::move(reads), std::move(writes), [jobs, lr, mu](auto const& k) {
      for (auto const& j : jobs) {
        auto p = k.template write<float>(j.p, j.n);
        auto g = k.template read<float>(j.g, j.n);
        auto m = k.template write<bf16>(j.m, j.n);
        for (std::size_t i = 0; i < j.n; ++i) {
          m[i] = to_bf16(mu * to_float(m[i]) + g[i]);
          p[i] -= lr * to_float(m[i]);
        }
      }
    });
  }
  void finish_step(step_context&) {}
  std::map<std::string, std::string> metadata() const {
    return {{"optimizer", "momentum_bf16"}, {"lr", std::to_string(lr_)}, {"steps", std::to_string(steps_)}};
  }
  void load_metadata(std::map<std::string, std::string> const& m) {
    auto const it = m.find("steps");
    if (it == m.end()) throw invalid_argument("momentum_bf16: metadata lacks 'steps'");
    if (m.count("lr") == 0 || m.at("lr") != std::to_string(lr_)) {
      throw invalid_argument("momentum_bf16: metadata 'lr' does not match");
    }
    steps_ = std::stoul(it->second);
  }

private:
  struct param_info {
    device_ptr param, grad;
    std::size_t numel;
  };
  B& b_;
  float lr_, mu_;
  std::size_t steps_ = 0;
  std::vector<param_info> params_;
  std::vector<slot_desc> slots_;
  std::vector<update_unit> units_;
  optimizer_state<B> state_;
};

static_assert(swap_optimizer<momentum_bf16>);

/// fp32 parameters trained by momentum_bf16.
struct momentum_world {
  explicit momentum_world(std::vector<std::size_t> sz = checkpoint_sizes)
      : sizes(std::move(sz)), b{mock::options{mock::timing_model::unit()}}, x(b, {1 << 20, 1 << 18, 512}), opt(b) {
    auto cs = b.current_stream();
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      params.push_back(b.allocate_device(sizes[i] * 4, cs));
      grads.push_back(b.allocate_device(sizes[i] * 4, cs));
      auto v = random_floats(sizes[i], 31 + i);
      test::upload(b, params[i], v.data(), v.size() * 4);
      opt.add_param(params[i], grads[i], sizes[i]);
    }
  }
  momentum_world(momentum_world const&) = delete;
  ~momentum_world() {
    auto cs = b.current_stream();
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      b.deallocate_device(params[i], sizes[i] * 4, cs);
      b.deallocate_device(grads[i], sizes[i] * 4, cs);
    }
  }
  template <class Runtime>
  void train(Runtime& rt, int from, int to) {
    for (int k = from; k < to; ++k) {
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        auto v = random_floats(sizes[i], 104729 * static_cast<std::uint64_t>(k + 1) + i);
        test::upload(b, grads[i], v.data(), v.size() * 4);
      }
      rt.step();
    }
  }
  std::vector<bytes> param_bytes() {
    std::vector<bytes> out;
    for (std::size_t i = 0; i < sizes.size(); ++i) out.push_back(b.read_device(params[i], sizes[i] * 4));
    return out;
  }
  void set_param_bytes(std::vector<bytes> const& v) {
    for (std::size_t i = 0; i < v.size(); ++i) test::upload(b, params[i], v[i].data(), v[i].size());
  }

  std::vector<std::size_t> sizes;
  mock::backend b;
  transfer_engine<mock::backend> x;
  momentum_bf16 opt;
  std::vector<device_ptr> params, grads;
};

} // namespace pipeswap::test
