// Adam/AdamW math: config validation, per-step scalars, the element update's rules, the checked host
// loop's errors, the mixed-precision paths. Agreement with PyTorch is in adam_torch_test.cpp.
#include <boost/test/unit_test.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <pipeswap/optim/adam_math.hpp>

BOOST_AUTO_TEST_SUITE(optim_adam_math)

namespace ps = pipeswap;

namespace {

std::string message_of(auto&& f) {
  try {
    f();
  } catch (ps::invalid_argument const& e) {
    return e.what();
  }
  return "(no exception)";
}

std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }

// One element, one step, all states starting at zero unless given.
struct element {
  float p, m = 0, v = 0, vmax = 0;
  void step(ps::adam_step_scalars const& s, float g) { ps::adam_element(s, g, p, m, v, vmax); }
};

} // namespace

BOOST_AUTO_TEST_CASE(validate_messages_follow_torch) {
  double const nan = std::numeric_limits<double>::quiet_NaN();
  auto msg = [](ps::adam_config c) { return message_of([&] { c.validate(); }); };
  BOOST_TEST(msg({}) == "(no exception)");
  BOOST_TEST(msg({.lr = -1}) == "Invalid learning rate: -1");
  BOOST_TEST(msg({.lr = nan}) == "Invalid learning rate: nan");
  BOOST_TEST(msg({.eps = -1e-8}) == "Invalid epsilon value: -1e-08");
  BOOST_TEST(msg({.beta1 = 1.5}) == "Invalid beta parameter at index 0: 1.5");
  BOOST_TEST(msg({.beta1 = 1.0}) == "Invalid beta parameter at index 0: 1");
  BOOST_TEST(msg({.beta2 = -0.5}) == "Invalid beta parameter at index 1: -0.5");
  BOOST_TEST(msg({.weight_decay = -0.01}) == "Invalid weight_decay value: -0.01");
  // torch's order: lr, eps, beta1, beta2, weight_decay.
  BOOST_TEST(msg({.lr = -1, .beta1 = 2, .eps = -1}) == "Invalid learning rate: -1");
  BOOST_TEST(msg({.beta1 = 2, .eps = -1}) == "Invalid epsilon value: -1");
  // Edges torch accepts.
  BOOST_TEST(msg({.lr = 0, .beta1 = 0, .beta2 = 0, .eps = 0, .weight_decay = 0}) == "(no exception)");
}

BOOST_AUTO_TEST_CASE(step_scalars) {
  ps::adam_config cfg{.lr = 0.1, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01};
  BOOST_TEST(message_of([&] { (void)ps::make_step_scalars(cfg, 0); }) ==
             "make_step_scalars: step must be >= 1 (the first update is step 1), got 0");
  BOOST_TEST(message_of([&] { (void)ps::make_step_scalars({.lr = -1}, 1); }) == "Invalid learning rate: -1");

  auto const s = ps::make_step_scalars(cfg, 1);
  BOOST_TEST(s.step == 1);
  BOOST_TEST(s.bias_correction1 == 1.0 - 0.9);
  BOOST_TEST(s.step_size == 0.1 / (1.0 - 0.9));
  BOOST_TEST(s.neg_step_size == -static_cast<float>(0.1 / (1.0 - 0.9)));
  BOOST_TEST(s.lerp_weight == static_cast<float>(1.0 - 0.9));
  BOOST_TEST(s.lerp_weight_rev == 1.0f - static_cast<float>(1.0 - 0.9));
  BOOST_TEST(s.lerp_from_start);
  BOOST_TEST(s.coupled_weight_decay);
  BOOST_TEST(!s.decoupled_weight_decay);
  BOOST_TEST(s.decay_factor == static_cast<float>(1.0 - 0.1 * 0.01));

  cfg.decoupled_weight_decay = true;
  auto const w = ps::make_step_scalars(cfg, 7);
  BOOST_TEST(!w.coupled_weight_decay);
  BOOST_TEST(w.decoupled_weight_decay);
  cfg.weight_decay = 0;
  auto const z = ps::make_step_scalars(cfg, 7);
  BOOST_TEST(!z.coupled_weight_decay);
  BOOST_TEST(!z.decoupled_weight_decay);
  BOOST_TEST(!ps::make_step_scalars({.beta1 = 0.3}, 1).lerp_from_start); // weight 0.7
  // Double arithmetic is Python's: 1 - beta**step with C pow, bias_correction2**0.5 with C pow.
  auto const big = ps::make_step_scalars({.beta2 = 0.999}, 1270);
  BOOST_TEST(big.bias_correction2 == 1.0 - std::pow(0.999, 1270.0));
  BOOST_TEST(big.bias_correction2_sqrt == std::pow(big.bias_correction2, 0.5));
}

BOOST_AUTO_TEST_CASE(first_step_is_sign_descent) {
  // With zero states, step 1 moves each parameter by about -lr * sign(g) (bias-corrected moments).
  auto const s = ps::make_step_scalars({.lr = 1e-3}, 1);
  for (float g : {1e-3f, 0.5f, 3.0f, 1e4f}) {
    element e{1.0f};
    e.step(s, g);
    BOOST_TEST(std::abs(e.p - (1.0f - 1e-3f)) < 1e-6f);
    element f{1.0f};
    f.step(s, -g);
    BOOST_TEST(std::abs(f.p - (1.0f + 1e-3f)) < 1e-6f);
  }
}

BOOST_AUTO_TEST_CASE(element_rules) {
  using ps::ieee::add_rn, ps::ieee::sub_rn, ps::ieee::mul_rn;
  ps::adam_config cfg{.lr = 0.05, .beta1 = 0.9, .beta2 = 0.99};
  // maximize == minimize with the negated gradient, bit for bit.
  {
    auto cm = cfg;
    cm.maximize = true;
    auto const s = ps::make_step_scalars(cfg, 1), sm = ps::make_step_scalars(cm, 1);
    element a{0.75f}, b{0.75f};
    a.step(s, -0.3f);
    b.step(sm, 0.3f);
    BOOST_TEST(bits(a.p) == bits(b.p));
    BOOST_TEST(bits(a.m) == bits(b.m));
  }
  // Adam with weight decay == Adam on grad + wd*param (two roundings).
  {
    auto cw = cfg;
    cw.weight_decay = 0.1;
    auto const s = ps::make_step_scalars(cfg, 1), sw = ps::make_step_scalars(cw, 1);
    element a{0.75f}, b{0.75f};
    float const g = 0.3f;
    float const g2 = add_rn(g, mul_rn(static_cast<float>(0.1), 0.75f));
    a.step(sw, g);
    b.step(s, g2);
    BOOST_TEST(bits(a.p) == bits(b.p));
  }
  // AdamW: the decay multiplies the parameter before the update; with wd = 0 both variants agree.
  {
    auto c0 = cfg, c1 = cfg;
    c1.decoupled_weight_decay = true;
    element a{0.75f}, b{0.75f};
    a.step(ps::make_step_scalars(c0, 1), 0.3f);
    b.step(ps::make_step_scalars(c1, 1), 0.3f);
    BOOST_TEST(bits(a.p) == bits(b.p));
    c1.weight_decay = 0.5;
    element d{0.75f};
    d.step(ps::make_step_scalars(c1, 1), 0.0f); // zero grad: only the decay acts
    BOOST_TEST(bits(d.p) == bits(mul_rn(0.75f, static_cast<float>(1.0 - 0.05 * 0.5))));
  }
  // lerp, both branches: w < 0.5 interpolates from exp_avg, otherwise from grad.
  {
    auto const s = ps::make_step_scalars({.beta1 = 0.9}, 1);
    element e{0.0f, 2.0f};
    e.step(s, 1.0f);
    float const w = static_cast<float>(1.0 - 0.9);
    BOOST_TEST(bits(e.m) == bits(add_rn(2.0f, mul_rn(w, sub_rn(1.0f, 2.0f)))));
    auto const t = ps::make_step_scalars({.beta1 = 0.2}, 1);
    element f{0.0f, 2.0f};
    f.step(t, 1.0f);
    float const w2 = static_cast<float>(1.0 - 0.2);
    BOOST_TEST(bits(f.m) == bits(sub_rn(1.0f, mul_rn(sub_rn(1.0f, 2.0f), sub_rn(1.0f, w2)))));
  }
}

BOOST_AUTO_TEST_CASE(amsgrad_keeps_the_maximum) {
  auto const c = ps::adam_config{.beta2 = 0.5, .amsgrad = true};
  element e{1.0f};
  e.step(ps::make_step_scalars(c, 1), 4.0f); // v = 0.5 * 16 = 8
  BOOST_TEST(e.v == 8.0f);
  BOOST_TEST(e.vmax == 8.0f);
  e.step(ps::make_step_scalars(c, 2), 0.0f); // v = 4, max stays 8
  BOOST_TEST(e.v == 4.0f);
  BOOST_TEST(e.vmax == 8.0f);
  // Without amsgrad the slot is untouched.
  element f{1.0f, 0, 0, 123.0f};
  f.step(ps::make_step_scalars({}, 1), 4.0f);
  BOOST_TEST(f.vmax == 123.0f);
}

BOOST_AUTO_TEST_CASE(non_finite_values_propagate) {
  float const nan = std::numeric_limits<float>::quiet_NaN();
  auto const s = ps::make_step_scalars({.amsgrad = true}, 1);
  element a{1.0f};
  a.step(s, nan);
  BOOST_TEST(std::isnan(a.p));
  BOOST_TEST(std::isnan(a.m));
  BOOST_TEST(std::isnan(a.vmax));
  // max_exp_avg_sq keeps a NaN once it has one, like torch.maximum.
  element b{1.0f, 0, 0, nan};
  b.step(s, 1.0f);
  BOOST_TEST(std::isnan(b.vmax));
  // A huge gradient overflows exp_avg_sq to inf; the step then vanishes instead of producing NaN.
  element c{1.0f};
  c.step(ps::make_step_scalars({}, 1), 1e22f);
  BOOST_TEST(std::isinf(c.v));
  BOOST_TEST(c.p == 1.0f);
}

BOOST_AUTO_TEST_CASE(zero_gradient_leaves_parameters) {
  auto const s = ps::make_step_scalars({}, 1);
  for (float p : {0.0f, -0.0f, 1.5f, -2.0f}) {
    element e{p};
    e.step(s, 0.0f);
    BOOST_TEST(bits(e.p) == bits(p)); // p + (-0) keeps p, signed zeros included
  }
}

BOOST_AUTO_TEST_CASE(host_loop_equals_element_function) {
  auto const s = ps::make_step_scalars({.lr = 0.01, .weight_decay = 0.1, .amsgrad = true}, 3);
  std::vector<float> p{0.5f, -1.0f, 2.0f}, m{0.1f, 0.2f, -0.3f}, v{0.01f, 0.02f, 0.03f}, vm{0.05f, 0.0f, 0.04f};
  std::vector<float> const g{0.25f, -0.5f, 1e-3f};
  std::vector<element> ref;
  for (std::size_t i = 0; i < 3; ++i) ref.push_back({p[i], m[i], v[i], vm[i]});
  ps::adam_update(s, std::span(p), std::span(g), m, v, vm);
  for (std::size_t i = 0; i < 3; ++i) {
    ref[i].step(s, g[i]);
    BOOST_TEST(bits(p[i]) == bits(ref[i].p));
    BOOST_TEST(bits(m[i]) == bits(ref[i].m));
    BOOST_TEST(bits(v[i]) == bits(ref[i].v));
    BOOST_TEST(bits(vm[i]) == bits(ref[i].vmax));
  }
}

BOOST_AUTO_TEST_CASE(size_and_overlap_errors_name_the_span) {
  auto const s = ps::make_step_scalars({}, 1);
  auto const sa = ps::make_step_scalars({.amsgrad = true}, 1);
  std::vector<float> p(4, 1.0f), g(4, 0.5f), m(4), v(4), vm(4), short3(3);
  auto call = [&](auto const& sc, std::span<float> pp, std::span<float const> gg, std::span<float> mm,
                  std::span<float> vv,
                  std::span<float> vmax) { return message_of([&] { ps::adam_update(sc, pp, gg, mm, vv, vmax); }); };
  BOOST_TEST(call(s, p, short3, m, v, {}) == "adam_update: grad has 3 elements but param has 4");
  BOOST_TEST(call(s, p, g, short3, v, {}) == "adam_update: exp_avg has 3 elements but param has 4");
  BOOST_TEST(call(s, p, g, m, short3, {}) == "adam_update: exp_avg_sq has 3 elements but param has 4");
  BOOST_TEST(call(sa, p, g, m, v, short3) == "adam_update: max_exp_avg_sq has 3 elements but param has 4");
  BOOST_TEST(call(sa, p, g, m, v, {}) == "adam_update: max_exp_avg_sq has 0 elements but param has 4");
  BOOST_TEST(call(s, p, g, m, v, vm) ==
             "adam_update: max_exp_avg_sq must be empty when amsgrad is off, got 4 elements");
  BOOST_TEST(call(s, p, g, m, m, {}) == "adam_update: exp_avg and exp_avg_sq overlap in memory");
  BOOST_TEST(call(s, p, p, m, v, {}) == "adam_update: param and grad overlap in memory");
  std::vector<float> big(8);
  BOOST_TEST(call(s, std::span(big).first(4), g, std::span(big).subspan(3, 4), v, {}) ==
             "adam_update: param and exp_avg overlap in memory");
  // Nothing was written by the failed calls.
  for (float x : p) BOOST_TEST(x == 1.0f);
  for (float x : m) BOOST_TEST(x == 0.0f);
  // Adjacent, non-overlapping spans of one buffer are fine; empty tensors are fine.
  BOOST_TEST(call(s, std::span(big).first(4), g, std::span(big).subspan(4, 4), v, {}) == "(no exception)");
  BOOST_TEST(call(s, {}, {}, {}, {}, {}) == "(no exception)");

  std::vector<ps::bf16> model(3);
  BOOST_TEST(message_of([&] { ps::cast_master_to_param(p, std::span(model)); }) ==
             "cast_master_to_param: master has 4 elements but param has 3");
}

BOOST_AUTO_TEST_CASE(master_weights_round_to_nearest_even) {
  // bf16 model param with an fp32 master: the update runs on the master, the model param is the
  // rounded master. Gradients arrive in bf16 and are widened exactly.
  auto const s = ps::make_step_scalars({.lr = 1e-3}, 1);
  std::vector<float> master{1.0f, -3.0f, 0.1f};
  std::vector<ps::bf16> grad{ps::to_bf16(0.5f), ps::to_bf16(-0.25f), ps::to_bf16(1e-5f)};
  std::vector<float> m(3), v(3);
  std::vector<ps::bf16> model(3);
  ps::adam_update(s, std::span(master), std::span(grad), m, v);
  ps::cast_master_to_param(master, std::span(model));
  for (std::size_t i = 0; i < 3; ++i) {
    BOOST_TEST(model[i].bits == ps::to_bf16(master[i]).bits);
    element e{i == 0 ? 1.0f : i == 1 ? -3.0f : 0.1f};
    e.step(s, ps::to_float(grad[i]));
    BOOST_TEST(bits(master[i]) == bits(e.p));
  }
  // The model param lags the master: 1 - 1e-3 rounds back to 1.0 in bf16 (8 bits of precision).
  BOOST_TEST(ps::to_float(model[0]) == 1.0f);
  BOOST_TEST(master[0] < 1.0f);
}

BOOST_AUTO_TEST_CASE(low_precision_param_without_master) {
  // Defined as: widen, update in float with fp32 states, round to nearest even. One step from the
  // same start therefore equals the master path's model param; later steps diverge because the
  // rounded value, not the master, is carried (small updates can be lost entirely).
  auto const s = ps::make_step_scalars({.lr = 1e-3}, 1);
  std::vector<ps::f16> param{ps::to_f16(1.0f), ps::to_f16(0.01f)};
  std::vector<ps::f16> const grad{ps::to_f16(0.5f), ps::to_f16(-2.0f)};
  std::vector<float> m(2), v(2);
  std::vector<float> master{ps::to_float(param[0]), ps::to_float(param[1])};
  std::vector<float> m2(2), v2(2);
  ps::adam_update(s, std::span(param), std::span(grad), m, v);
  ps::adam_update(s, std::span(master), std::span(grad), m2, v2);
  for (std::size_t i = 0; i < 2; ++i) {
    BOOST_TEST(param[i].bits == ps::to_f16(master[i]).bits);
    BOOST_TEST(bits(m[i]) == bits(m2[i]));
  }
  BOOST_TEST(ps::to_float(param[0]) == 0.99902344f); // 1 - 1e-3 rounded to f16: 1 - 2^-10
}

BOOST_AUTO_TEST_SUITE_END() // optim_adam_math
