// adam::add_param and set_grad refuse storage that two registrations would share: a parameter
// registered twice (the same storage, or overlapping ranges: tied embeddings registered once per
// use), a gradient that overlaps its own parameter or another one, a parameter that overlaps a
// registered gradient. Each refusal is a pipeswap::invalid_argument naming both indices; nothing is
// registered, and the optimizer then steps to exactly the bytes of one that never saw the call.
#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include <pipeswap/backend/mock.hpp>
#include <pipeswap/optim/mock/adam_kernels.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/optim/adam.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>

#include "support/world.hpp"

BOOST_AUTO_TEST_SUITE(optim_adam_params)

namespace {

namespace ps = pipeswap;
namespace mock = pipeswap::mock;
using adamw = ps::adamw<mock::backend>;

bool says(std::exception const& e, std::vector<std::string> const& parts) {
  std::string const w = e.what();
  for (auto const& p : parts) {
    if (w.find(p) == std::string::npos) {
      BOOST_TEST_MESSAGE("'" << w << "' lacks '" << p << "'");
      return false;
    }
  }
  return true;
}

/// One device block of `n` floats holding parameters and gradients at chosen element offsets.
struct block {
  mock::backend& b;
  std::size_t n;
  ps::device_ptr base;
  block(mock::backend& be, std::size_t elems) : b(be), n(elems), base(b.allocate_device(n * 4, b.current_stream())) {
    auto v = ps::test::random_floats(n, 7);
    ps::test::upload(b, base, v.data(), n * 4);
  }
  ~block() { b.deallocate_device(base, n * 4, b.current_stream()); }
  ps::device_ptr at(std::size_t e) const { return base + e * 4; }
};

} // namespace

BOOST_AUTO_TEST_CASE(shared_storage_is_refused_naming_both_indices) {
  mock::backend b;
  block m(b, 4096);
  adamw opt(b);
  // Parameter 0: elements [0, 1000), gradient [2000, 3000).
  BOOST_TEST(opt.add_param({m.at(0), m.at(2000), 1000}) == 0u);
  struct bad {
    adamw::param_desc d;
    std::vector<std::string> parts;
  };
  std::vector<bad> const cases = {
      // The same storage again (a tied weight registered per use).
      {{m.at(0), m.at(3000), 1000}, {"adam::add_param", "storage of parameter 1", "storage of parameter 0", "once"}},
      // Overlapping ranges: the tail, the head, one element inside, a range that covers it.
      {{m.at(999), m.at(3000), 10}, {"storage of parameter 1", "storage of parameter 0"}},
      {{m.at(1000 - 1), m.at(3000), 1}, {"storage of parameter 1", "storage of parameter 0"}},
      {{m.at(500), m.at(3000), 1}, {"storage of parameter 1", "storage of parameter 0"}},
      // A bf16 parameter counts its own bytes: 2 per element, from element 999.5 on.
      {{m.at(999) + 2, m.at(3000), 1, ps::dtype::bf16, ps::dtype::f32}, {"storage of parameter 1"}},
      // A gradient that aliases its own parameter, or overlaps another parameter's storage.
      {{m.at(3000), m.at(3000), 100}, {"gradient of parameter 1", "its own storage"}},
      {{m.at(3000), m.at(3050), 100}, {"gradient of parameter 1", "its own storage"}},
      {{m.at(3000), m.at(900), 200}, {"gradient of parameter 1", "storage of parameter 0", "gradient must not"}},
      // A parameter placed on a registered gradient.
      {{m.at(2500), m.at(3500), 100}, {"storage of parameter 1", "gradient of parameter 0"}},
  };
  for (auto const& c : cases) {
    BOOST_CHECK_EXCEPTION(opt.add_param(c.d), ps::invalid_argument, [&](auto const& e) { return says(e, c.parts); });
    BOOST_TEST(opt.size() == 1u); // nothing registered
    BOOST_TEST(opt.slots().size() == 2u);
  }
  // Adjacent ranges share no byte: accepted. So are empty parameters anywhere.
  BOOST_TEST(opt.add_param({m.at(1000), m.at(3000), 500}) == 1u);
  BOOST_TEST(opt.add_param({m.at(0), m.at(0), 0}) == 2u);
}

BOOST_AUTO_TEST_CASE(set_grad_checks_the_index_and_the_gradient) {
  mock::backend b;
  block m(b, 4096);
  adamw opt(b);
  opt.add_param({m.at(0), m.at(2000), 1000});
  opt.add_param({m.at(1000), m.at(3000), 1000});
  BOOST_CHECK_EXCEPTION(opt.set_grad(1, m.at(500)), ps::invalid_argument, [](auto const& e) {
    return says(e, {"adam::set_grad", "gradient of parameter 1", "storage of parameter 0"});
  });
  BOOST_CHECK_EXCEPTION(opt.set_grad(1, m.at(1999)), ps::invalid_argument, [](auto const& e) {
    return says(e, {"adam::set_grad", "gradient of parameter 1", "storage of parameter 1"});
  });
  BOOST_TEST((opt.param(1).grad == m.at(3000))); // unchanged
  BOOST_CHECK_EXCEPTION(opt.set_grad(2, m.at(3000)), ps::invalid_argument, [](auto const& e) {
    return says(e, {"adam::set_grad", "parameter index 2", "not below the 2 parameters"});
  });
  opt.set_grad(1, {}); // no gradient this step: always allowed
  BOOST_TEST(!opt.param(1).grad);
  opt.set_grad(1, m.at(2000) + 4000); // [3000, 4000) again, through another spelling
  BOOST_TEST((opt.param(1).grad == m.at(3000)));
}

BOOST_AUTO_TEST_CASE(refused_calls_lose_nothing) {
  // Two optimizers over identical data; one sees refused calls between its registrations. After
  // three steps every parameter and state byte is equal.
  mock::backend b;
  ps::transfer_engine<mock::backend> x(b), y(b);
  std::vector<std::size_t> const sizes = {3000, 1500, 2500};
  using world = ps::test::model<mock::backend, adamw>;
  world clean(b, sizes, 11, false), tried(b, {}, 11, false);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    tried.add(sizes[i], 11 + i);
    // A tied second registration, a gradient that aliases its parameter, a bad index: refused.
    BOOST_CHECK_THROW(tried.opt.add_param({tried.params[i], tried.grads[i], sizes[i]}), ps::invalid_argument);
    BOOST_CHECK_THROW(tried.opt.set_grad(i, tried.params[i]), ps::invalid_argument);
    BOOST_CHECK_THROW(tried.opt.set_grad(i + 10, tried.grads[i]), ps::invalid_argument);
  }
  ps::swap_config cfg;
  cfg.swap_times = 2;
  cfg.min_swap_numel = 1;
  std::vector<std::vector<std::byte>> a, c;
  {
    ps::optimizer_swap<adamw> rc(x, clean.opt, cfg);
    ps::optimizer_swap<adamw> rt(y, tried.opt, cfg);
    for (std::uint64_t s = 0; s < 3; ++s) {
      clean.set_grads(s);
      tried.set_grads(s);
      rc.step();
      rt.step();
    }
    a = clean.snapshot(rc);
    c = tried.snapshot(rt);
  }
  BOOST_TEST(a.size() == sizes.size() * 3);
  BOOST_TEST((a == c));
  auto const p0 = ps::test::random_floats(sizes[0], 11);
  BOOST_TEST(std::memcmp(a[0].data(), p0.data(), a[0].size()) != 0); // the steps changed parameter 0
  for (std::size_t i = 0; i < sizes.size(); ++i) BOOST_TEST(tried.opt.step_count(i) == 3);
}

BOOST_AUTO_TEST_SUITE_END()
