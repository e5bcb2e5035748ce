// Adam/AdamW under optimizer_swap on the mock backend (hazard checker raising): the device update
// equals the host reference math step for step, and swapping never changes a bit — both pipelines,
// many swap_times, whole and split partitions, amsgrad on and off, fp32 and bf16-with-master
// parameters, tiny and empty tensors.
#define BOOST_TEST_MODULE adam_swap
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <vector>

#include <pipeswap/optim/adam.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>

#include "support/world.hpp"

namespace ps = pipeswap;
namespace mock = pipeswap::mock;

namespace {

using opt_t = ps::adam<mock::backend>;

struct spec {
  std::vector<std::size_t> sizes;
  bool amsgrad = false;
  bool masters = false; ///< even-indexed parameters are bf16 with an fp32 master
  bool adamw = true;
};

/// Host-side copy of the initial parameters and the gradients of each step, as floats.
std::vector<float> init_values(std::size_t n, std::size_t i) { return ps::test::random_floats(n, 11 + i); }
std::vector<float> grad_values(std::size_t n, std::size_t i, int step) {
  auto v = ps::test::random_floats(n, 7919 * (step + 1) + i);
  for (std::size_t k = 0; k < v.size(); k += 97) v[k] = 0.0f; // some zero gradients
  return v;
}

struct world {
  explicit world(spec const& s)
      : sp(s), b{mock::options{mock::timing_model::unit()}}, x(b, {1 << 20, 1 << 18, 512}),
        opt(b, config(s)) {
    auto cs = b.current_stream();
    for (std::size_t i = 0; i < sp.sizes.size(); ++i) {
      auto const n = sp.sizes[i];
      bool const half = is_half(i);
      auto const es = half ? 2u : 4u;
      params.push_back(b.allocate_device(n * es, cs));
      grads.push_back(b.allocate_device(n * es, cs));
      upload(params[i], init_values(n, i), half);
      opt.add_param({params[i], grads[i], n, half ? ps::dtype::bf16 : ps::dtype::f32,
                     half ? ps::dtype::bf16 : ps::dtype::f32, half});
    }
  }
  ~world() {
    auto cs = b.current_stream();
    for (std::size_t i = 0; i < sp.sizes.size(); ++i) {
      auto const es = is_half(i) ? 2u : 4u;
      b.deallocate_device(params[i], sp.sizes[i] * es, cs);
      b.deallocate_device(grads[i], sp.sizes[i] * es, cs);
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
  bool is_half(std::size_t i) const { return sp.masters && i % 2 == 0; }
  void upload(ps::device_ptr d, std::vector<float> const& v, bool half) {
    if (half) {
      std::vector<ps::bf16> h(v.size());
      for (std::size_t k = 0; k < v.size(); ++k) h[k] = ps::to_bf16(v[k]);
      ps::test::upload(b, d, h.data(), h.size() * 2);
    } else {
      ps::test::upload(b, d, v.data(), v.size() * 4);
    }
  }
  void set_grads(int step) {
    for (std::size_t i = 0; i < sp.sizes.size(); ++i) upload(grads[i], grad_values(sp.sizes[i], i, step), is_half(i));
  }

  spec sp;
  mock::backend b;
  ps::transfer_engine<mock::backend> x;
  opt_t opt;
  std::vector<ps::device_ptr> params, grads;
};

ps::swap_config config(std::size_t k, bool packed, bool swap = true) {
  ps::swap_config c;
  c.swap_times = k;
  c.packed = packed;
  c.min_numel = 64;
  if (!swap) c.state_keys = std::vector<std::string>{};
  return c;
}

/// Every parameter's and every state's bytes after `steps` steps.
template <class P = ps::balanced_partition>
std::vector<std::vector<std::byte>> run(spec const& s, ps::swap_config cfg, int steps, P policy = {}) {
  world w(s);
  ps::optimizer_swap<opt_t, P> rt(w.x, w.opt, cfg, policy);
  for (int k = 0; k < steps; ++k) {
    w.set_grads(k);
    rt.step();
  }
  rt.synchronize_cpu_mirrors();
  std::vector<std::vector<std::byte>> out;
  for (std::size_t i = 0; i < s.sizes.size(); ++i) {
    out.push_back(w.b.read_device(w.params[i], s.sizes[i] * (w.is_half(i) ? 2 : 4)));
  }
  for (auto* slot : w.opt.slots()) {
    if (slot->swappable) {
      w.b.note_host_read(slot->mirror.ptr, slot->mirror.bytes);
      out.emplace_back(slot->mirror.ptr, slot->mirror.ptr + slot->mirror.bytes);
    } else {
      out.push_back(w.b.read_device(slot->device_at(0), slot->bytes()));
    }
  }
  BOOST_TEST(w.b.hazards().empty());
  return out;
}

std::vector<std::size_t> const sizes{3000, 1, 0, 65, 2048, 7, 4096, 100, 5000, 63, 1024};

} // namespace

BOOST_AUTO_TEST_CASE(device_update_equals_the_host_reference_math) {
  // Three steps of the no-swap runtime against adam_update applied on host arrays.
  for (bool masters : {false, true}) {
    for (bool amsgrad : {false, true}) {
      spec const s{{300, 17, 1000}, amsgrad, masters, true};
      auto const got = run(s, config(1, false, false), 3);
      auto const cfg = world::config(s);
      for (std::size_t i = 0; i < s.sizes.size(); ++i) {
        auto const n = s.sizes[i];
        bool const half = masters && i % 2 == 0;
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

BOOST_AUTO_TEST_CASE(swap_never_changes_a_bit) {
  for (bool masters : {false, true}) {
    for (bool amsgrad : {false, true}) {
      spec const s{sizes, amsgrad, masters, true};
      auto const ref = run(s, config(1, false, false), 3);
      for (bool packed : {false, true}) {
        for (std::size_t k : {1u, 2u, 3u, 7u, 16u, 50u}) {
          BOOST_TEST_CONTEXT("masters " << masters << " amsgrad " << amsgrad << " packed " << packed
                                        << " swap_times " << k) {
            auto const whole = run(s, config(k, packed), 3);
            auto const split = run(s, config(k, packed), 3, ps::split_partition{});
            BOOST_TEST_REQUIRE(whole.size() == ref.size());
            for (std::size_t t = 0; t < ref.size(); ++t) {
              BOOST_TEST((whole[t] == ref[t]), "tensor " << t);
              BOOST_TEST((split[t] == ref[t]), "tensor " << t << " (split)");
            }
          }
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(adam_with_coupled_decay_swaps_exactly_too) {
  spec const s{{5000, 3, 2000, 700}, false, true, false};
  auto const ref = run(s, config(1, false, false), 2);
  auto const got = run(s, config(3, true), 2);
  for (std::size_t t = 0; t < ref.size(); ++t) BOOST_TEST((got[t] == ref[t]), "tensor " << t);
}

BOOST_AUTO_TEST_CASE(step_counts_follow_gradients_and_round_trip_through_metadata) {
  world w(spec{{100, 200, 300}, true, false, true});
  ps::optimizer_swap<opt_t> rt(w.x, w.opt, config(2, true));
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

  world other(spec{{100, 200, 300}, true, false, true});
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
  BOOST_CHECK_EXCEPTION(opt_t(b, c), ps::invalid_argument,
                        [](auto const& e) { return std::string(e.what()) == "Invalid learning rate: -1"; });
  opt_t opt(b);
  auto d = b.allocate_device(64, b.current_stream());
  BOOST_CHECK_EXCEPTION(opt.add_param({d, d, 16, ps::dtype::f32, ps::dtype::f32, true}), ps::invalid_argument,
                        [](auto const& e) {
                          return std::string(e.what()) ==
                                 "adam::add_param: parameter 0 is F32 and needs no master_param";
                        });
  BOOST_CHECK_THROW(opt.add_param({d, d, 16, ps::dtype::i64, ps::dtype::f32, false}), ps::invalid_argument);
  BOOST_TEST(opt.size() == 0u);
  b.deallocate_device(d, 64, b.current_stream());
}
