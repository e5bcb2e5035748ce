// optimizer_swap over a user's backend compiled once (<pipeswap/swap/instantiate.hpp>): this TU sees
// the runtime's classes declared extern only and links against extern_swap_instantiate.cpp. Three
// AdamW steps with the state swapped are bit-exact against the same steps with nothing swapped and
// against the element math (adam_update) on plain host arrays.
#define BOOST_TEST_MODULE extern_swap
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <pipeswap/optim/adam_math.hpp>

#include "support/extern_swap.hpp"

namespace ps = pipeswap;
using B = ps::test::extern_backend;

namespace {

std::size_t const sizes[] = {3000, 70, 1500};

float value(std::size_t i, std::size_t t, int salt) {
  auto x = static_cast<std::uint32_t>(i * 2654435761u + t * 40503u + static_cast<unsigned>(salt) * 97u);
  x ^= x >> 13;
  return static_cast<float>(x % 2001) / 1000.0f - 1.0f;
}

ps::adam_config config() {
  auto c = ps::adamw<B>::with_decay();
  c.lr = 0.01;
  return c;
}

/// Every parameter's bytes after `steps` steps of optimizer_swap<adamw<B>> under `cfg`.
std::vector<std::vector<float>> run(ps::swap_config cfg, int steps) {
  B b;
  ps::transfer_engine<B> x(b);
  ps::adamw<B> opt(b, config());
  std::vector<ps::device_ptr> params, grads;
  for (std::size_t t = 0; t < std::size(sizes); ++t) {
    params.push_back(b.allocate_device(sizes[t] * sizeof(float), 0));
    grads.push_back(b.allocate_device(sizes[t] * sizeof(float), 0));
    auto* p = params[t].get<float>();
    for (std::size_t i = 0; i < sizes[t]; ++i) p[i] = value(i, t, 0);
    opt.add_param({params[t], grads[t], sizes[t], ps::dtype::f32, ps::dtype::f32, false});
  }
  std::vector<std::vector<float>> out;
  {
    ps::optimizer_swap<ps::adamw<B>> rt(x, opt, cfg);
    BOOST_TEST(rt.is_swappable(0) == (!cfg.state_keys || !cfg.state_keys->empty()));
    for (int k = 1; k <= steps; ++k) {
      for (std::size_t t = 0; t < std::size(sizes); ++t) {
        auto* g = grads[t].get<float>();
        for (std::size_t i = 0; i < sizes[t]; ++i) g[i] = value(i, t, k);
      }
      rt.step();
    }
  }
  for (std::size_t t = 0; t < std::size(sizes); ++t) {
    auto const* p = params[t].get<float>();
    out.emplace_back(p, p + sizes[t]);
    b.deallocate_device(grads[t], sizes[t] * sizeof(float), 0);
    b.deallocate_device(params[t], sizes[t] * sizeof(float), 0);
  }
  return out;
}

bool same_bits(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

} // namespace

BOOST_AUTO_TEST_CASE(a_step_of_the_extern_runtime_is_bit_exact_against_no_swap_and_the_element_math) {
  int const steps = 3;
  ps::swap_config swapped;
  swapped.swap_times = 2;
  swapped.min_swap_numel = 64;
  auto resident = swapped;
  resident.state_keys = std::vector<std::string>{};

  auto const a = run(swapped, steps);
  auto const r = run(resident, steps);

  // The element math on host arrays, step by step.
  auto const cfg = config();
  for (std::size_t t = 0; t < std::size(sizes); ++t) {
    std::vector<float> p(sizes[t]), g(sizes[t]), m(sizes[t], 0.0f), v(sizes[t], 0.0f);
    for (std::size_t i = 0; i < sizes[t]; ++i) p[i] = value(i, t, 0);
    for (int k = 1; k <= steps; ++k) {
      for (std::size_t i = 0; i < sizes[t]; ++i) g[i] = value(i, t, k);
      ps::adam_update(ps::make_step_scalars(cfg, k), std::span<float>(p), std::span<float const>(g),
                      std::span<float>(m), std::span<float>(v));
    }
    BOOST_TEST_INFO("parameter " << t);
    BOOST_TEST(same_bits(a[t], r[t]));
    BOOST_TEST(same_bits(a[t], p));
    BOOST_TEST(p[0] != value(0, t, 0)); // the steps moved it
  }
}
