// Adam/AdamW under optimizer_swap, the same bodies on every backend of support/backend_list.hpp:
// the mock (hazards recorded and checked) and the user-written synchronous backend here, the CUDA
// backend's fused kernels in tests/cuda (cuda_adam_swap, skipped without a GPU). The device update
// equals the host reference math step for step; swapping never changes a bit — both pipelines, many
// swap_times, whole and split partitions, amsgrad on and off, fp32, bf16-with-master and mixed
// f32/bf16/f16 parameters and gradients, tiny and empty tensors; and each backend gives the bytes
// another one gives (CUDA against the mock, the mock against the synchronous backend).
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "support/backend_list.hpp"

#include <pipeswap/optim/mock/adam_kernels.hpp>
#include <pipeswap/optim/adam.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>
#if defined(PIPESWAP_TEST_CUDA)
#  include <pipeswap/optim/cuda/adam_kernels.hpp>
#endif

#include "support/adam_ranges.hpp"
#include "support/sanitized.hpp"
#include "support/world.hpp"
#include "support/no_hazards.hpp"

BOOST_AUTO_TEST_SUITE(optim_adam_swap)

namespace ps = pipeswap;
namespace mock = pipeswap::mock;
using ps::test::backends_under_test;

using gate = ps::test::skip_unless_available<backends_under_test>;
BOOST_TEST_GLOBAL_FIXTURE(gate);

namespace {

/// Parameter and gradient storage of the parameters of a spec.
enum class mix {
  f32,     ///< every parameter and gradient fp32
  masters, ///< even-indexed parameters bf16 with bf16 gradients and an fp32 master
  all,     ///< cycles through f32/f32, bf16/bf16+master, f16/f32+master, bf16/bf16, f16/f16, f32/bf16
};

struct spec {
  std::vector<std::size_t> sizes;
  bool amsgrad = false;
  mix types = mix::f32;
  bool adamw = true;
};

struct param_types {
  ps::dtype param, grad;
  bool master;
};

param_types types_of(spec const& s, std::size_t i) {
  using ps::dtype;
  switch (s.types) {
  case mix::f32: return {dtype::f32, dtype::f32, false};
  case mix::masters:
    return i % 2 == 0 ? param_types{dtype::bf16, dtype::bf16, true} : param_types{dtype::f32, dtype::f32, false};
  case mix::all: break;
  }
  param_types const cycle[] = {{dtype::f32, dtype::f32, false}, {dtype::bf16, dtype::bf16, true},
                               {dtype::f16, dtype::f32, true},  {dtype::bf16, dtype::bf16, false},
                               {dtype::f16, dtype::f16, false}, {dtype::f32, dtype::bf16, false}};
  return cycle[i % 6];
}

/// Host-side copy of the initial parameters and the gradients of each step, as floats.
std::vector<float> init_values(std::size_t n, std::size_t i) { return ps::test::random_floats(n, 11 + i); }
std::vector<float> grad_values(std::size_t n, std::size_t i, int step) {
  auto v = ps::test::random_floats(n, 7919 * (step + 1) + i);
  for (std::size_t k = 0; k < v.size(); k += 97) v[k] = 0.0f; // some zero gradients
  return v;
}

template <class B>
struct world {
  explicit world(spec const& s) : sp(s), x(f.b, {1 << 20, 1 << 18, 512}), opt(f.b, config(s)) {
    // Record hazards, so the check at the end of a run has something to check.
    if constexpr (std::is_same_v<B, mock::backend>) b.set_hazard_policy(mock::hazard_policy::record);
    auto cs = b.current_stream();
    for (std::size_t i = 0; i < sp.sizes.size(); ++i) {
      auto const n = sp.sizes[i];
      auto const t = types_of(sp, i);
      params.push_back(b.allocate_device(n * ps::size_of(t.param), cs));
      grads.push_back(b.allocate_device(n * ps::size_of(t.grad), cs));
      upload(params[i], init_values(n, i), t.param);
      opt.add_param({params[i], grads[i], n, t.param, t.grad, t.master});
    }
  }
  world(world const&) = delete;
  ~world() {
    auto cs = b.current_stream();
    for (std::size_t i = 0; i < sp.sizes.size(); ++i) {
      auto const t = types_of(sp, i);
      b.deallocate_device(params[i], sp.sizes[i] * ps::size_of(t.param), cs);
      b.deallocate_device(grads[i], sp.sizes[i] * ps::size_of(t.grad), cs);
    }
  }
  static ps::adam_config config(spec const& s) {
    ps::adam_config c;
    c.lr = 0.01;
    c.weight_decay = 0.05;
    c.amsgrad = s.amsgrad;
    c.decoupled_weight_decay = s.adamw;
    return c;
  }
  void upload(ps::device_ptr d, std::vector<float> const& v, ps::dtype t) {
    ps::test::host_array h(v.size(), ps::size_of(t), 0);
    h.put(t, v);
    ps::test::upload(b, d, h.data(), v.size() * ps::size_of(t));
  }
  void set_grads(int step) {
    for (std::size_t i = 0; i < sp.sizes.size(); ++i) {
      upload(grads[i], grad_values(sp.sizes[i], i, step), types_of(sp, i).grad);
    }
  }

  spec sp;
  ps::test::backend_fixture<B> f;
  B& b = f.b;
  ps::transfer_engine<B> x;
  ps::adam<B> opt;
  std::vector<ps::device_ptr> params, grads;
};

ps::swap_config config(std::size_t k, bool packed, bool swap = true) {
  ps::swap_config c;
  c.swap_times = k;
  c.packed = packed;
  c.min_swap_numel = 64;
  if (!swap) c.state_keys = std::vector<std::string>{};
  return c;
}

/// Every parameter's and every state's bytes after `steps` steps on backend B.
template <class B, class P = ps::balanced_partition>
std::vector<std::vector<std::byte>> run(spec const& s, ps::swap_config cfg, int steps, P policy = {}) {
  world<B> w(s);
  ps::optimizer_swap<ps::adam<B>, P> rt(w.x, w.opt, cfg, policy);
  for (int k = 0; k < steps; ++k) {
    w.set_grads(k);
    rt.step();
  }
  rt.synchronize_host_mirrors();
  std::vector<std::vector<std::byte>> out;
  for (std::size_t i = 0; i < s.sizes.size(); ++i) {
    out.push_back(ps::test::download(w.b, w.params[i], s.sizes[i] * ps::size_of(types_of(s, i).param)));
  }
  auto const slots = w.opt.slots();
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (rt.is_swappable(i)) {
      auto const m = rt.host_mirror(i);
      ps::detail::note_host_read(w.b, m.data(), m.size());
      out.emplace_back(m.begin(), m.end());
    } else {
      out.push_back(ps::test::download(w.b, rt.unswappable_device(i), slots[i].bytes()));
    }
  }
  PIPESWAP_CHECK_NO_HAZARDS(w.b);
  return out;
}

std::vector<std::size_t> const sizes{3000, 1, 0, 65, 2048, 7, 4096, 100, 5000, 63, 1024};

/// The backend another backend's bytes are compared with: the mock for CUDA, the user-written
/// synchronous backend for the mock, the mock for that one.
template <class B>
using other_backend = std::conditional_t<std::is_same_v<B, mock::backend>, ps::test::sync_host_backend, mock::backend>;

} // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(device_update_equals_the_host_reference_math, B, backends_under_test) {
  // Three steps of the no-swap runtime against adam_update applied on host arrays.
  for (bool masters : {false, true}) {
    for (bool amsgrad : {false, true}) {
      spec const s{{300, 17, 1000}, amsgrad, masters ? mix::masters : mix::f32, true};
      auto const got = run<B>(s, config(1, false, false), 3);
      auto const cfg = world<B>::config(s);
      for (std::size_t i = 0; i < s.sizes.size(); ++i) {
        auto const n = s.sizes[i];
        bool const half = types_of(s, i).master;
        auto master = init_values(n, i);
        if (half) {
          for (auto& v : master) v = ps::to_float(ps::to_bf16(v)); // the master starts from the bf16 param
        }
        std::vector<float> m(n, 0), v(n, 0), vmax(amsgrad ? n : 0, 0);
        std::vector<ps::bf16> param_h(n);
        for (int step = 1; step <= 3; ++step) {
          auto g = grad_values(n, i, step - 1);
          auto const sc = ps::make_step_scalars(cfg, step);
          if (half) {
            std::vector<ps::bf16> gh(n);
            for (std::size_t k = 0; k < n; ++k) gh[k] = ps::to_bf16(g[k]);
            ps::adam_update(sc, std::span<float>(master), std::span<ps::bf16 const>(gh), std::span<float>(m),
                            std::span<float>(v), std::span<float>(vmax));
            ps::cast_master_to_param(std::span<float const>(master), std::span<ps::bf16>(param_h));
          } else {
            ps::adam_update(sc, std::span<float>(master), std::span<float const>(g), std::span<float>(m),
                            std::span<float>(v), std::span<float>(vmax));
          }
        }
        BOOST_TEST_CONTEXT("param " << i << " masters " << masters << " amsgrad " << amsgrad) {
          if (half) {
            BOOST_TEST(std::memcmp(got[i].data(), param_h.data(), n * 2) == 0);
          } else {
            BOOST_TEST(std::memcmp(got[i].data(), master.data(), n * 4) == 0);
          }
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(swap_never_changes_a_bit, B, backends_under_test) {
  std::size_t const swap_times[] = {1, 2, 3, 7, 16, 50};
  std::size_t combo = 0; // the index of (types, amsgrad, packed)
  for (mix types : {mix::f32, mix::masters, mix::all}) {
    for (bool amsgrad : {false, true}) {
      spec const s{sizes, amsgrad, types, true};
      auto const ref = run<B>(s, config(1, false, false), 3);
      for (bool packed : {false, true}) {
        for (std::size_t j = 0; j < std::size(swap_times); ++j) {
          // Under sanitizers each combination runs two of the swap_times, in turn: every one is
          // still run with every type mix.
          if (ps::test::sanitized_build && j % 3 != combo % 3) continue;
          auto const k = swap_times[j];
          BOOST_TEST_CONTEXT("types " << static_cast<int>(types) << " amsgrad " << amsgrad << " packed " << packed
                                      << " swap_times " << k) {
            auto const whole = run<B>(s, config(k, packed), 3);
            auto const split = run<B>(s, config(k, packed), 3, ps::split_partition{});
            BOOST_TEST_REQUIRE(whole.size() == ref.size());
            for (std::size_t t = 0; t < ref.size(); ++t) {
              BOOST_TEST((whole[t] == ref[t]), "tensor " << t);
              BOOST_TEST((split[t] == ref[t]), "tensor " << t << " (split)");
            }
          }
        }
        ++combo;
      }
    }
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(adam_with_coupled_decay_swaps_exactly_too, B, backends_under_test) {
  spec const s{{5000, 3, 2000, 700}, false, mix::masters, false};
  auto const ref = run<B>(s, config(1, false, false), 2);
  auto const got = run<B>(s, config(3, true), 2);
  for (std::size_t t = 0; t < ref.size(); ++t) BOOST_TEST((got[t] == ref[t]), "tensor " << t);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(same_bytes_as_another_backend, B, backends_under_test) {
  using O = other_backend<B>;
  // Mixed types; and 600 small parameters, so that one batch carries hundreds of ranges (the CUDA
  // kernel's table then lives in device memory).
  std::vector<std::size_t> small(600);
  for (std::size_t i = 0; i < small.size(); ++i) small[i] = 64 + i % 37;
  for (spec const& s :
       {spec{sizes, true, mix::all, true}, spec{sizes, false, mix::all, false}, spec{small, true, mix::all, true}}) {
    for (bool packed : {false, true}) {
      // Under sanitizers the batches of hundreds of ranges run with the packed pipeline only.
      if (ps::test::sanitized_build && s.sizes.size() == small.size() && !packed) continue;
      BOOST_TEST_CONTEXT(s.sizes.size() << " parameters, amsgrad " << s.amsgrad << " packed " << packed) {
        auto const mine = run<B>(s, config(2, packed), 3, ps::split_partition{});
        auto const theirs = run<O>(s, config(2, packed), 3, ps::split_partition{});
        BOOST_TEST_REQUIRE(mine.size() == theirs.size());
        for (std::size_t t = 0; t < mine.size(); ++t) BOOST_TEST((mine[t] == theirs[t]), "tensor " << t);
      }
    }
  }
}

#if !defined(PIPESWAP_TEST_CUDA) // backend-independent bookkeeping: the mock build checks it once

BOOST_AUTO_TEST_CASE(step_counts_follow_gradients_and_round_trip_through_metadata) {
  world<mock::backend> w(spec{{100, 200, 300}, true, mix::f32, true});
  ps::optimizer_swap<ps::adam<mock::backend>> rt(w.x, w.opt, config(2, true));
  w.set_grads(0);
  rt.step();
  w.opt.set_grad(1, {});
  rt.step();
  BOOST_TEST(w.opt.step_count(0) == 2);
  BOOST_TEST(w.opt.step_count(1) == 1); // no gradient, no step (PyTorch keeps per-parameter steps)
  auto const meta = w.opt.metadata();
  BOOST_TEST(meta.at("steps") == "2,1,2");
  BOOST_TEST(meta.at("optimizer") == "AdamW");
  BOOST_TEST(meta.at("amsgrad") == "true");

  world<mock::backend> other(spec{{100, 200, 300}, true, mix::f32, true});
  other.opt.load_metadata(meta);
  BOOST_TEST(other.opt.step_count(1) == 1);
  auto bad = meta;
  bad["lr"] = "0.5";
  BOOST_CHECK_EXCEPTION(other.opt.load_metadata(bad), ps::invalid_argument, [](auto const& e) {
    return std::string(e.what()) == "adam: checkpoint metadata 'lr' is '0.5' but this optimizer has '0.01'";
  });
  bad = meta;
  bad["steps"] = "2,x,2";
  BOOST_CHECK_THROW(other.opt.load_metadata(bad), ps::invalid_argument);
  bad["steps"] = "2,1";
  BOOST_CHECK_THROW(other.opt.load_metadata(bad), ps::invalid_argument);
  BOOST_TEST(other.opt.step_count(1) == 1); // a rejected load changed nothing
}

BOOST_AUTO_TEST_CASE(bad_parameters_and_configs_are_rejected) {
  mock::backend b;
  ps::adam_config c;
  c.lr = -1;
  BOOST_CHECK_EXCEPTION(ps::adam<mock::backend>(b, c), ps::invalid_argument,
                        [](auto const& e) { return std::string(e.what()) == "Invalid learning rate: -1"; });
  ps::adam<mock::backend> opt(b);
  auto d = b.allocate_device(64, b.current_stream());
  BOOST_CHECK_EXCEPTION(
      opt.add_param({d, d, 16, ps::dtype::f32, ps::dtype::f32, true}), ps::invalid_argument, [](auto const& e) {
        return std::string(e.what()) == "adam::add_param: parameter 0 is F32 and needs no master_param";
      });
  BOOST_CHECK_THROW(opt.add_param({d, d, 16, ps::dtype::i64, ps::dtype::f32, false}), ps::invalid_argument);
  BOOST_TEST(opt.size() == 0u);
  b.deallocate_device(d, 64, b.current_stream());
}

#endif

BOOST_AUTO_TEST_SUITE_END() // optim_adam_swap
