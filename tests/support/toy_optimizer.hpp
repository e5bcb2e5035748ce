// A small user-written optimizer that models pipeswap::swap_optimizer, and a kernel runner that
// executes its host-math kernels on the mock backend (declared regions, simulated time) or directly
// on the synchronous host backend, or as work on the threaded backend's compute stream, or on CUDA
// over host copies of the declared bytes in stream order. It shows what an optimizer must provide and lets the runtime be
// tested independently of Adam.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <pipeswap/backend/mock.hpp>
#include <pipeswap/optim/concepts.hpp>
#include <pipeswap/optim/state.hpp>

#include "support/backends.hpp"
#include "support/threaded_backend.hpp"
#if defined(PIPESWAP_TEST_CUDA)
#  include "support/cuda_host_kernel.hpp"
#endif

namespace pipeswap::test {

/// Runs a host-math kernel body on a backend. The body gets an object with read<T>(ptr, n) and
/// write<T>(ptr, n) returning spans, like mock::kernel_context.
template <class B>
struct host_kernel;

template <>
struct host_kernel<mock::backend> {
  template <class F>
  static void run(mock::backend& b, std::string name, std::vector<mock::region> reads, std::vector<mock::region> writes,
                  F body) {
    b.launch(b.current_stream(), {std::move(name), std::move(reads), std::move(writes), std::nullopt},
             [body = std::move(body)](mock::kernel_context const& k) { body(k); });
  }
};

/// Device memory of the synchronous host backend is host memory: the body runs at once.
struct direct_view {
  template <class T>
  std::span<T const> read(device_ptr p, std::size_t n) const {
    return {p.get<T const>(), n};
  }
  template <class T>
  std::span<T> write(device_ptr p, std::size_t n) const {
    return {p.get<T>(), n};
  }
};

/// On the threaded backend the body runs as work on the compute stream, in stream order.
template <>
struct host_kernel<threaded_backend> {
  template <class F>
  static void run(threaded_backend& b, std::string, std::vector<mock::region>, std::vector<mock::region>, F body) {
    b.launch(b.current_stream(), [body = std::make_shared<F>(std::move(body))] { (*body)(direct_view{}); });
  }
};

template <>
struct host_kernel<sync_host_backend> {
  template <class F>
  static void run(sync_host_backend&, std::string, std::vector<mock::region>, std::vector<mock::region>, F body) {
    body(direct_view{});
  }
};

#if defined(PIPESWAP_TEST_CUDA)
/// On CUDA the body runs on pinned copies of the bytes it declares, in order on the compute stream
/// (support/cuda_host_kernel.hpp).
template <>
struct host_kernel<cuda::backend> {
  template <class F>
  static void run(cuda::backend& b, std::string, std::vector<mock::region> reads, std::vector<mock::region> writes,
                  F body) {
    cuda_host_kernels::run(b, b.current_stream(), std::move(reads), std::move(writes), std::move(body));
  }
};
#endif

/// param -= lr · m / (1 + v) with m = m/2 + g, v = v + g·g; fp32 everything; optional "master"
/// slot initialised from the parameter (exercises slot_init::from_param) that is updated in place of
/// the parameter and copied back into it.
template <class B>
class toy_optimizer {
public:
  using optimizer_concept = optimizer_tag;
  using backend_type = B;
  struct step_context {
    float lr;
  };
  static constexpr bool splittable = true;

  toy_optimizer(B& b, float lr = 0.125f) : b_(b), lr_(lr), state_(b) {}

  /// Registers a parameter (device fp32 params and grads of numel elements). Refused while a runtime
  /// manages the state.
  std::size_t add_param(device_ptr param, device_ptr grad, std::size_t numel, bool master = false) {
    state_.require_detached("toy_optimizer::add_param");
    auto const i = params_.size();
    params_.push_back({param, grad, numel, true});
    auto make = [&](state_key k, slot_init init) {
      slots_.push_back({i, k, dtype::f32, numel, init});
      return slots_.size() - 1;
    };
    auto& u = units_all_.emplace_back();
    u.param = i;
    u.numel = numel;
    u.slots.push_back(make(state_key::exp_avg, slot_init::zeros));
    u.slots.push_back(make(state_key::exp_avg_sq, slot_init::zeros));
    if (master) u.slots.push_back(make(state_key::master_param, slot_init::from_param));
    return i;
  }
  void set_has_grad(std::size_t i, bool g) { params_.at(i).has_grad = g; }

  void validate() {
    if (!(lr_ > 0)) throw invalid_argument("toy_optimizer: lr must be positive");
  }
  std::span<slot_desc const> slots() const noexcept { return slots_; }
  optimizer_state<B>& swap_state() noexcept { return state_; }

  void initialize(std::size_t slot, device_ptr dst) {
    auto const& p = params_.at(slots_.at(slot).param);
    host_kernel<B>::run(b_, "init master", {{p.param, p.numel * 4}}, {{dst, p.numel * 4}}, [=](auto const& k) {
      auto src = k.template read<float>(p.param, p.numel);
      auto out = k.template write<float>(dst, p.numel);
      std::copy(src.begin(), src.end(), out.begin());
    });
  }

  step_context prepare_step() {
    ++steps_;
    units_.clear();
    for (auto const& u : units_all_) {
      if (params_[u.param].has_grad) units_.push_back(u);
    }
    return {lr_};
  }
  std::span<update_unit const> update_units(step_context&) { return units_; }

  void update(std::span<unit_range const> batch, step_context& ctx, state_view<B> const& view) {
    std::vector<mock::region> reads, writes;
    struct job {
      device_ptr p, g, m, v, master;
      std::size_t n;
    };
    std::vector<job> jobs;
    for (auto const& r : batch) {
      auto const& u = units_[r.unit];
      auto const& prm = params_[u.param];
      auto const off = r.begin * 4;
      auto const n = r.end - r.begin;
      job j{prm.param + off,
            prm.grad + off,
            view.device_at(u.slots[0], r.begin),
            view.device_at(u.slots[1], r.begin),
            u.slots.size() > 2 ? view.device_at(u.slots[2], r.begin) : device_ptr{},
            n};
      reads.push_back({j.g, n * 4});
      writes.push_back({j.p, n * 4});
      writes.push_back({j.m, n * 4});
      writes.push_back({j.v, n * 4});
      if (j.master) writes.push_back({j.master, n * 4});
      jobs.push_back(j);
    }
    float const lr = ctx.lr;
    host_kernel<B>::run(b_, "toy update", std::move(reads), std::move(writes), [jobs, lr](auto const& k) {
      for (auto const& j : jobs) {
        auto p = k.template write<float>(j.p, j.n);
        auto g = k.template read<float>(j.g, j.n);
        auto m = k.template write<float>(j.m, j.n);
        auto v = k.template write<float>(j.v, j.n);
        auto w = j.master ? k.template write<float>(j.master, j.n) : p;
        for (std::size_t i = 0; i < j.n; ++i) {
          m[i] = m[i] * 0.5f + g[i];
          v[i] = v[i] + g[i] * g[i];
          w[i] = w[i] - lr * m[i] / (1.0f + v[i]);
          p[i] = w[i];
        }
      }
    });
  }

  void finish_step(step_context&) {}

  std::map<std::string, std::string> metadata() const {
    return {{"lr", std::to_string(lr_)}, {"steps", std::to_string(steps_)}};
  }
  void load_metadata(std::map<std::string, std::string> const& m) {
    auto it = m.find("steps");
    if (it == m.end()) throw invalid_argument("toy_optimizer: metadata lacks 'steps'");
    steps_ = std::stoul(it->second);
  }

  [[nodiscard]] std::size_t steps() const noexcept { return steps_; }

private:
  struct param_info {
    device_ptr param, grad;
    std::size_t numel;
    bool has_grad;
  };
  B& b_;
  float lr_;
  std::size_t steps_ = 0;
  std::vector<param_info> params_;
  std::vector<slot_desc> slots_;
  std::vector<update_unit> units_all_;
  std::vector<update_unit> units_;
  optimizer_state<B> state_;
};

static_assert(swap_optimizer<toy_optimizer<mock::backend>>);
static_assert(swap_optimizer<toy_optimizer<sync_host_backend>>);

} // namespace pipeswap::test
