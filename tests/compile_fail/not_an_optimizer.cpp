// A type with every member an optimizer needs but no opt-in is not an optimizer: optimizer_swap
// refuses it, so a look-alike is never accepted by accident.
#include <map>
#include <span>
#include <string>

#include <pipeswap/backend/mock.hpp>
#include <pipeswap/optim/concepts.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>

struct look_alike {
#ifdef PIPESWAP_COMPILING_TWIN
  using optimizer_concept = pipeswap::optimizer_tag;
#endif
  using backend_type = pipeswap::mock::backend;
  struct step_context {};
  static constexpr bool splittable = true;
  explicit look_alike(backend_type& b) : state(b) {}
  pipeswap::optimizer_state<backend_type> state;
  std::span<pipeswap::slot_desc const> slots() const { return {}; }
  pipeswap::optimizer_state<backend_type>& swap_state() { return state; }
  void validate() {}
  void initialize(std::size_t, pipeswap::device_ptr) {}
  step_context prepare_step() { return {}; }
  std::span<pipeswap::update_unit const> update_units(step_context&) { return {}; }
  void update(std::span<pipeswap::unit_range const>, step_context&, pipeswap::state_view<backend_type> const&) {}
  void finish_step(step_context&) {}
  std::map<std::string, std::string> metadata() const { return {}; }
  void load_metadata(std::map<std::string, std::string> const&) {}
};

int main() {
  pipeswap::mock::backend b;
  pipeswap::transfer_engine<pipeswap::mock::backend> x(b);
  look_alike opt(b);
  pipeswap::optimizer_swap<look_alike> rt(x, opt); // expect: enable_optimizer
  return 0;
}
