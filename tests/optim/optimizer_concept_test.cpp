// Conformance of the Optimizer concept (optim/concepts.hpp): the documented minimal model, the
// library's and the tests' optimizers model it, and one near-miss per requirement does not — each
// failing the refinement step that holds the requirement. (Compiled into test_optim_adam_kernels.)
#include <boost/test/unit_test.hpp>

#include <map>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <pipeswap/backend/mock.hpp>
#include <pipeswap/optim/mock/adam_kernels.hpp>
#include <pipeswap/optim/adam.hpp>
#include <pipeswap/optim/concepts.hpp>

#include "support/backends.hpp"
#include "support/toy_optimizer.hpp"

namespace ps = pipeswap;

namespace {

// The minimal model of the header comment, verbatim.
template <pipeswap::backend B>
struct sgd_momentum {
  using optimizer_concept = pipeswap::optimizer_tag;
  using backend_type = B;
  struct step_context {};
  static constexpr bool splittable = true;
  explicit sgd_momentum(B& b) : state(b) {}
  std::vector<pipeswap::slot_desc> descs; // {param, state_key::exp_avg, dtype::f32, numel}
  std::vector<pipeswap::update_unit> units;
  pipeswap::optimizer_state<B> state;
  std::span<pipeswap::slot_desc const> slots() const { return descs; }
  pipeswap::optimizer_state<B>& swap_state() { return state; }
  void validate() {}
  void initialize(std::size_t, pipeswap::device_pointer_t<B>) {}
  step_context prepare_step() { return {}; }
  std::span<pipeswap::update_unit const> update_units(step_context&) { return units; }
  void update(std::span<pipeswap::unit_range const>, step_context&, pipeswap::state_view<B> const&) {}
  void finish_step(step_context&) {}
  std::map<std::string, std::string> metadata() const { return {}; }
  void load_metadata(std::map<std::string, std::string> const&) {}
};
static_assert(pipeswap::swap_optimizer<sgd_momentum<pipeswap::mock::backend>>);
static_assert(pipeswap::swap_optimizer<sgd_momentum<ps::test::archetype_backend>>);

static_assert(ps::swap_optimizer<ps::adam<ps::mock::backend>>);
static_assert(ps::swap_optimizer<ps::adamw<ps::mock::backend>>);
static_assert(ps::swap_optimizer<ps::test::toy_optimizer<ps::mock::backend>>);
static_assert(ps::swap_optimizer<ps::test::toy_optimizer<ps::test::sync_host_backend>>);

// One near-miss per requirement.
enum class miss {
  none,
  opt_in,
  backend,
  splittable_constant,
  splittable_type,
  slots,
  swap_state,
  validate,
  step_context,
  initialize,
  prepare_step,
  update_units,
  update,
  finish_step,
  metadata,
  load_metadata
};

using arch = ps::test::archetype_backend;
struct ctx {};
using meta = std::map<std::string, std::string>;

template <miss M>
struct opt_in_part {
  using optimizer_concept = ps::optimizer_tag;
};
template <>
struct opt_in_part<miss::opt_in> {};
template <miss M>
struct split_part {
  static constexpr bool splittable = true;
};
template <>
struct split_part<miss::splittable_constant> {
  static inline bool splittable = true;
};
template <>
struct split_part<miss::splittable_type> {
  static constexpr int splittable = 1;
};
template <miss M>
struct ctx_part {
  using step_context = ctx;
};
template <>
struct ctx_part<miss::step_context> {};

template <miss M>
struct near : opt_in_part<M>, split_part<M>, ctx_part<M> {
  using backend_type = std::conditional_t<M == miss::backend, int, arch>;
  ps::optimizer_state<arch>* state = nullptr;

  std::span<ps::slot_desc const> slots() const requires(M != miss::slots) { return {}; }
  std::vector<ps::slot_desc> slots() const requires(M == miss::slots) { return {}; } // wrong type
  ps::optimizer_state<arch>& swap_state() requires(M != miss::swap_state) { return *state; }
  void validate() requires(M != miss::validate) {}
  void initialize(std::size_t, ps::device_ptr) requires(M != miss::initialize) {}
  void initialize(ps::slot_desc&) requires(M == miss::initialize) {} // the slot instead of its index
  ctx prepare_step() requires(M != miss::prepare_step) { return {}; }
  bool prepare_step() requires(M == miss::prepare_step) { return true; }
  std::span<ps::update_unit const> update_units(ctx&) requires(M != miss::update_units) { return {}; }
  std::vector<ps::update_unit> update_units(ctx&) requires(M == miss::update_units) { return {}; }
  void update(std::span<ps::unit_range const>, ctx&, ps::state_view<arch> const&) requires(M != miss::update) {}
  void update(std::span<ps::unit_range const>, ctx&) requires(M == miss::update) {} // no state view
  void finish_step(ctx&) requires(M != miss::finish_step) {}
  meta metadata() const requires(M != miss::metadata) { return {}; }
  meta metadata() requires(M == miss::metadata) { return {}; } // not const
  void load_metadata(meta const&) requires(M != miss::load_metadata) {}
};

static_assert(ps::swap_optimizer<near<miss::none>>);
// The opt-in: a look-alike with every member is not an optimizer.
static_assert(!ps::enable_optimizer<near<miss::opt_in>> && ps::steppable_optimizer<near<miss::opt_in>>);
static_assert(!ps::swap_optimizer<near<miss::opt_in>>);
// optimizer_description
static_assert(!ps::optimizer_description<near<miss::backend>>);
static_assert(!ps::optimizer_description<near<miss::splittable_constant>>);
static_assert(!ps::optimizer_description<near<miss::splittable_type>>);
static_assert(!ps::optimizer_description<near<miss::slots>>);
static_assert(!ps::optimizer_description<near<miss::swap_state>>);
static_assert(!ps::optimizer_description<near<miss::validate>>);
// steppable_optimizer (the description holds)
static_assert(ps::optimizer_description<near<miss::step_context>> &&
              !ps::steppable_optimizer<near<miss::step_context>>);
static_assert(ps::optimizer_description<near<miss::initialize>> && !ps::steppable_optimizer<near<miss::initialize>>);
static_assert(ps::optimizer_description<near<miss::prepare_step>> &&
              !ps::steppable_optimizer<near<miss::prepare_step>>);
static_assert(ps::optimizer_description<near<miss::update_units>> &&
              !ps::steppable_optimizer<near<miss::update_units>>);
static_assert(ps::optimizer_description<near<miss::update>> && !ps::steppable_optimizer<near<miss::update>>);
static_assert(ps::optimizer_description<near<miss::finish_step>> && !ps::steppable_optimizer<near<miss::finish_step>>);
// checkpointable_optimizer (stepping holds)
static_assert(ps::steppable_optimizer<near<miss::metadata>> && !ps::checkpointable_optimizer<near<miss::metadata>>);
static_assert(ps::steppable_optimizer<near<miss::load_metadata>> &&
              !ps::checkpointable_optimizer<near<miss::load_metadata>>);
// Each near-miss fails the whole concept.
static_assert(!ps::swap_optimizer<near<miss::backend>> && !ps::swap_optimizer<near<miss::splittable_constant>> &&
              !ps::swap_optimizer<near<miss::splittable_type>> && !ps::swap_optimizer<near<miss::slots>> &&
              !ps::swap_optimizer<near<miss::swap_state>> && !ps::swap_optimizer<near<miss::validate>> &&
              !ps::swap_optimizer<near<miss::step_context>> && !ps::swap_optimizer<near<miss::initialize>> &&
              !ps::swap_optimizer<near<miss::prepare_step>> && !ps::swap_optimizer<near<miss::update_units>> &&
              !ps::swap_optimizer<near<miss::update>> && !ps::swap_optimizer<near<miss::finish_step>> &&
              !ps::swap_optimizer<near<miss::metadata>> && !ps::swap_optimizer<near<miss::load_metadata>>);

// Types that cannot be edited opt in by specialising enable_optimizer.
struct foreign : near<miss::opt_in> {};

} // namespace

template <>
inline constexpr bool pipeswap::enable_optimizer<foreign> = true;
static_assert(pipeswap::swap_optimizer<foreign>);

BOOST_AUTO_TEST_SUITE(optim_optimizer_concept)

BOOST_AUTO_TEST_CASE(the_optimizer_concept_is_checked_at_compile_time) {
  // Everything above is a static_assert; this case records that the translation unit was built.
  BOOST_TEST(ps::swap_optimizer<ps::adamw<ps::mock::backend>>);
}

BOOST_AUTO_TEST_SUITE_END() // optim_optimizer_concept
