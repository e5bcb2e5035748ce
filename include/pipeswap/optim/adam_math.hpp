// pipeswap — Adam / AdamW element math with PyTorch semantics, shared by the host loop and CUDA kernels.
//
// The update is torch.optim.Adam / AdamW's single-tensor path (foreach=False, fused=False,
// capturable=False, torch >= 2.0), operation by operation and rounding by rounding; docs/optimizer-math.md
// gives the derivation and the agreement measured against PyTorch.
//
// Layers:
// - adam_config            hyper-parameters; validate() throws like torch's constructor (host only).
// - make_step_scalars      per-step scalars, computed in double exactly as torch's Python does, then
//                          narrowed to float as torch narrows a Python scalar meeting a float32 tensor
//                          (host only).
// - adam_element           THE element update (PIPESWAP_HOST_DEVICE). Host loops and kernels call it;
//                          nothing else implements the math.
// - adam_update_unchecked  the host loop over one tensor, no checks (usable in mock kernels).
// - adam_update            the checked host entry point (sizes, overlaps), throws invalid_argument.
// - cast_master_to_param   low-precision param = round-to-nearest-even(fp32 master).
//
// Precision model: states (exp_avg, exp_avg_sq, max_exp_avg_sq) are always float. The parameter the
// update runs on is float: an fp32 parameter, or the fp32 master of a bf16/f16 parameter (then
// cast_master_to_param refreshes the model parameter). A bf16/f16 parameter without a master is
// supported by the adam_update overload on span<bf16>/span<f16>: widen, update in float, round back
// to nearest even. That is NOT torch's behaviour for such parameters (torch keeps bf16 states and
// rounds every intermediate tensor to bf16); it is the deterministic fp32-state variant, documented
// in docs/optimizer-math.md. Gradients are float, bf16 or f16 and are widened exactly.
#pragma once

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include <pipeswap/config.hpp>
#include <pipeswap/core/half.hpp>
#include <pipeswap/core/ieee_ops.hpp>
#include <pipeswap/detail/message.hpp>
#include <pipeswap/error.hpp>

namespace pipeswap {

/// Adam / AdamW hyper-parameters, PyTorch names and defaults.
struct adam_config {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  bool amsgrad = false;
  bool maximize = false;
  /// false: Adam (L2 penalty added to the gradient). true: AdamW (parameter decayed by 1 - lr*wd).
  bool decoupled_weight_decay = false;

  /// Throws invalid_argument with torch's message for the first violated rule, in torch's order:
  /// "Invalid learning rate: {lr}", "Invalid epsilon value: {eps}", "Invalid beta parameter at index
  /// 0: {beta1}", "... index 1: {beta2}", "Invalid weight_decay value: {wd}". Numbers are printed in
  /// shortest round-trip form ("-1", "1.5", "1e-08", "nan"). NaN fails every rule, as in torch. Host only.
  void validate() const;
};

/// Everything adam_element needs for one step, precomputed on the host.
///
/// The double members reproduce torch's Python arithmetic bit for bit (same IEEE double operations,
/// glibc pow as CPython uses it). The float members are the Python scalars torch hands to each tensor
/// op, each narrowed to float once (round to nearest even), as ATen does when a Python float meets a
/// float32 tensor. Trivially copyable: pass it to kernels by value.
struct adam_step_scalars {
  std::int64_t step;            ///< 1-based step number this update performs
  double bias_correction1;      ///< 1 - beta1**step
  double bias_correction2;      ///< 1 - beta2**step
  double step_size;             ///< lr / bias_correction1
  double bias_correction2_sqrt; ///< bias_correction2**0.5: C pow(x, 0.5) as torch, not sqrt()

  float weight_decay;            ///< alpha of grad.add(param, alpha=weight_decay) (Adam)
  float decay_factor;            ///< operand of param.mul_(1 - lr*weight_decay) (AdamW)
  float lerp_weight;             ///< weight of exp_avg.lerp_(grad, 1 - beta1)
  float lerp_weight_rev;         ///< 1.0f - lerp_weight, in float, as ATen's lerp computes it
  float beta2;                   ///< operand of exp_avg_sq.mul_(beta2)
  float one_minus_beta2;         ///< value of addcmul_(grad, grad, value=1 - beta2)
  float bias_correction2_sqrt_f; ///< divisor of exp_avg_sq.sqrt() / bias_correction2_sqrt
  float eps;                     ///< operand of .add_(eps)
  float neg_step_size;           ///< value of param.addcdiv_(exp_avg, denom, value=-step_size)

  bool maximize;               ///< negate the gradient first
  bool amsgrad;                ///< keep and use max_exp_avg_sq
  bool coupled_weight_decay;   ///< Adam and weight_decay != 0
  bool decoupled_weight_decay; ///< AdamW and weight_decay != 0
  bool lerp_from_start;        ///< |lerp_weight| < 0.5: ATen's lerp interpolates from exp_avg
};

static_assert(std::is_trivially_copyable_v<adam_step_scalars>);

/// Scalars for update number `step` (>= 1) of `cfg`. Validates cfg; throws invalid_argument for a
/// bad config or step < 1. Host only.
inline adam_step_scalars make_step_scalars(adam_config const& cfg, std::int64_t step);

/// One Adam/AdamW update of one element, in torch's operation order. Every arithmetic operation is a
/// single IEEE float operation rounded to nearest even (the ieee::*_rn functions: no fma contraction
/// on host or device). With g the gradient, p the parameter (or fp32 master), m, v, vmax the states:
///
///   1. maximize:      g = -g                                             exact
///   2. Adam, wd != 0: g = g + (wd * p)                 grad.add(param, alpha=wd)      mul, add
///      AdamW, wd != 0: p = p * decay_factor            param.mul_(1 - lr*wd)          mul
///   3. m = lerp(m, g, w), w = 1 - beta1                exp_avg.lerp_(grad, w)
///        |w| < 0.5:  m + w * (g - m)                                     sub, mul, add
///        otherwise:  g - (g - m) * (1 - w)                               sub, mul, sub
///   4. v = (v * beta2) + ((1 - beta2) * g) * g        exp_avg_sq.mul_(beta2).addcmul_(g, g, 1-beta2)
///                                                                        mul, mul, mul, add
///   5. amsgrad: vmax = max(vmax, v)                    torch.maximum (NaN-propagating)   exact
///   6. d = sqrt(amsgrad ? vmax : v) / bc2_sqrt + eps   (x.sqrt() / bc2_sqrt).add_(eps)   sqrt, div, add
///   7. p = p + ((-step_size) * m) / d                  param.addcdiv_(m, d, value=-step_size)
///                                                                        mul, div, add
///
/// `max_exp_avg_sq` is read and written only when s.amsgrad. No allocation, no exception.
PIPESWAP_HOST_DEVICE inline void adam_element(adam_step_scalars const& s, float grad, float& param, float& exp_avg,
                                              float& exp_avg_sq, float& max_exp_avg_sq) noexcept {
  using ieee::add_rn, ieee::sub_rn, ieee::mul_rn, ieee::div_rn, ieee::sqrt_rn;
  float g = s.maximize ? ieee::neg(grad) : grad;
  float p = param;
  if (s.coupled_weight_decay) g = add_rn(g, mul_rn(s.weight_decay, p));
  if (s.decoupled_weight_decay) p = mul_rn(p, s.decay_factor);

  float const diff = sub_rn(g, exp_avg);
  float const m =
      s.lerp_from_start ? add_rn(exp_avg, mul_rn(s.lerp_weight, diff)) : sub_rn(g, mul_rn(diff, s.lerp_weight_rev));
  float const v = add_rn(mul_rn(exp_avg_sq, s.beta2), mul_rn(mul_rn(s.one_minus_beta2, g), g));

  float second = v;
  if (s.amsgrad) {
    second = ieee::max_nan(max_exp_avg_sq, v);
    max_exp_avg_sq = second;
  }
  float const denom = add_rn(div_rn(sqrt_rn(second), s.bias_correction2_sqrt_f), s.eps);
  param = add_rn(p, div_rn(mul_rn(s.neg_step_size, m), denom));
  exp_avg = m;
  exp_avg_sq = v;
}

/// The update loop over one tensor of n elements, no checks. `param` is the fp32 parameter or master
/// (P = float), or a bf16/f16 parameter without master (widened, updated, rounded to nearest even).
/// `max_exp_avg_sq` may be null unless s.amsgrad. Pointers must not overlap.
template <storage_float P, storage_float G>
PIPESWAP_HOST_DEVICE inline void adam_update_unchecked(adam_step_scalars const& s, P* param, G const* grad,
                                                       float* exp_avg, float* exp_avg_sq, float* max_exp_avg_sq,
                                                       std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    float p = to_float(param[i]);
    float unused = 0;
    adam_element(s, to_float(grad[i]), p, exp_avg[i], exp_avg_sq[i], s.amsgrad ? max_exp_avg_sq[i] : unused);
    param[i] = from_float<P>(p);
  }
}

/// model param[i] = round-to-nearest-even(master[i]) for n elements (a copy when P is float).
template <storage_float P>
PIPESWAP_HOST_DEVICE inline void cast_master_to_param_unchecked(float const* master, P* param, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) param[i] = from_float<P>(master[i]);
}

namespace detail {

inline std::string format_double(double x) {
  char buf[64];
  auto const r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

template <class A, class B>
bool spans_overlap(std::span<A> a, std::span<B> b) noexcept {
  if (a.empty() || b.empty()) return false;
  auto const* a0 = reinterpret_cast<unsigned char const*>(a.data());
  auto const* b0 = reinterpret_cast<unsigned char const*>(b.data());
  std::less<unsigned char const*> const lt;
  return lt(a0, b0 + b.size_bytes()) && lt(b0, a0 + a.size_bytes());
}

} // namespace detail

inline void adam_config::validate() const {
  auto fail = [](std::string_view what, double x) {
    throw invalid_argument(std::string(what) + detail::format_double(x));
  };
  if (!(0.0 <= lr)) fail("Invalid learning rate: ", lr);
  if (!(0.0 <= eps)) fail("Invalid epsilon value: ", eps);
  if (!(0.0 <= beta1 && beta1 < 1.0)) fail("Invalid beta parameter at index 0: ", beta1);
  if (!(0.0 <= beta2 && beta2 < 1.0)) fail("Invalid beta parameter at index 1: ", beta2);
  if (!(0.0 <= weight_decay)) fail("Invalid weight_decay value: ", weight_decay);
}

inline adam_step_scalars make_step_scalars(adam_config const& cfg, std::int64_t step) {
  using ieee::sub_rn, ieee::mul_rn, ieee::div_rn;
  cfg.validate();
  if (step < 1)
    throw invalid_argument(
        detail::message({"make_step_scalars: step must be >= 1 (the first update is step 1), got ", step}));
  adam_step_scalars s{};
  s.step = step;
  // Python: step = step_t.item() (a float), beta1 ** step -> C pow(), both exact in the step range.
  double const fstep = static_cast<double>(step);
  s.bias_correction1 = sub_rn(1.0, std::pow(cfg.beta1, fstep));
  s.bias_correction2 = sub_rn(1.0, std::pow(cfg.beta2, fstep));
  s.step_size = div_rn(cfg.lr, s.bias_correction1);
  // torch >= 2.1 writes `bias_correction2**0.5`: C pow(x, 0.5), which is not always the correctly
  // rounded sqrt(x) (e.g. beta2 = 0.999, step 1270 differs in the last bit). Follow torch.
  s.bias_correction2_sqrt = std::pow(s.bias_correction2, 0.5);

  s.weight_decay = static_cast<float>(cfg.weight_decay);
  s.decay_factor = static_cast<float>(sub_rn(1.0, mul_rn(cfg.lr, cfg.weight_decay)));
  s.lerp_weight = static_cast<float>(sub_rn(1.0, cfg.beta1));
  s.lerp_weight_rev = ieee::sub_rn(1.0f, s.lerp_weight);
  s.beta2 = static_cast<float>(cfg.beta2);
  s.one_minus_beta2 = static_cast<float>(sub_rn(1.0, cfg.beta2));
  s.bias_correction2_sqrt_f = static_cast<float>(s.bias_correction2_sqrt);
  s.eps = static_cast<float>(cfg.eps);
  s.neg_step_size = static_cast<float>(-s.step_size);

  s.maximize = cfg.maximize;
  s.amsgrad = cfg.amsgrad;
  s.coupled_weight_decay = cfg.weight_decay != 0 && !cfg.decoupled_weight_decay;
  s.decoupled_weight_decay = cfg.weight_decay != 0 && cfg.decoupled_weight_decay;
  s.lerp_from_start = s.lerp_weight < 0.5f && s.lerp_weight > -0.5f;
  return s;
}

/// Checked host update of one tensor: `param` is the fp32 parameter or master (P = float), or a
/// bf16/f16 parameter without master (see the file comment); `grad` holds float, bf16 or f16 values.
/// Throws invalid_argument, before touching any element, when a span's size differs from param's
/// (naming the span), when max_exp_avg_sq is non-empty without amsgrad, or when two spans overlap.
template <storage_float P, class G>
requires storage_float<std::remove_const_t<G>>
void adam_update(adam_step_scalars const& s, std::span<P> param, std::span<G> grad, std::span<float> exp_avg,
                 std::span<float> exp_avg_sq, std::span<float> max_exp_avg_sq = {}) {
  std::size_t const n = param.size();
  auto check_size = [n](std::string_view name, std::size_t got) {
    if (got != n)
      throw invalid_argument(detail::message({"adam_update: ", name, " has ", got, " elements but param has ", n}));
  };
  check_size("grad", grad.size());
  check_size("exp_avg", exp_avg.size());
  check_size("exp_avg_sq", exp_avg_sq.size());
  if (s.amsgrad) {
    check_size("max_exp_avg_sq", max_exp_avg_sq.size());
  } else if (!max_exp_avg_sq.empty()) {
    throw invalid_argument(detail::message(
        {"adam_update: max_exp_avg_sq must be empty when amsgrad is off, got ", max_exp_avg_sq.size(), " elements"}));
  }
  auto check_disjoint = [](std::string_view an, auto a, std::string_view bn, auto b) {
    if (detail::spans_overlap(a, b))
      throw invalid_argument(detail::message({"adam_update: ", an, " and ", bn, " overlap in memory"}));
  };
  check_disjoint("param", param, "grad", grad);
  check_disjoint("param", param, "exp_avg", exp_avg);
  check_disjoint("param", param, "exp_avg_sq", exp_avg_sq);
  check_disjoint("param", param, "max_exp_avg_sq", max_exp_avg_sq);
  check_disjoint("grad", grad, "exp_avg", exp_avg);
  check_disjoint("grad", grad, "exp_avg_sq", exp_avg_sq);
  check_disjoint("grad", grad, "max_exp_avg_sq", max_exp_avg_sq);
  check_disjoint("exp_avg", exp_avg, "exp_avg_sq", exp_avg_sq);
  check_disjoint("exp_avg", exp_avg, "max_exp_avg_sq", max_exp_avg_sq);
  check_disjoint("exp_avg_sq", exp_avg_sq, "max_exp_avg_sq", max_exp_avg_sq);
  adam_update_unchecked(s, param.data(), static_cast<std::remove_const_t<G> const*>(grad.data()), exp_avg.data(),
                        exp_avg_sq.data(), s.amsgrad ? max_exp_avg_sq.data() : nullptr, n);
}

/// Checked: model param = round-to-nearest-even(master), element-wise. Throws invalid_argument when
/// the sizes differ or the spans overlap.
template <storage_float P>
void cast_master_to_param(std::span<float const> master, std::span<P> param) {
  if (master.size() != param.size())
    throw invalid_argument(detail::message(
        {"cast_master_to_param: master has ", master.size(), " elements but param has ", param.size()}));
  if (detail::spans_overlap(master, param))
    throw invalid_argument("cast_master_to_param: master and param overlap in memory");
  cast_master_to_param_unchecked(master.data(), param.data(), param.size());
}

} // namespace pipeswap
