// split_partition cuts parameters into element ranges: an optimizer whose update is not elementwise
// (splittable = false) is refused with a message that says so.
#include <map>
#include <span>
#include <string>

#include <pipeswap/backend/mock.hpp>
#include <pipeswap/optim/concepts.hpp>
#include <pipeswap/swap/optimizer_swap.hpp>

struct whole_tensor_optimizer {
  using optimizer_concept = pipeswap::optimizer_tag;
  using backend_type = pipeswap::mock::backend;
  struct step_context {};
#ifdef PIPESWAP_COMPILING_TWIN
  static constexpr bool splittable = true;
#else
  static constexpr bool splittable = false; // e.g. a norm over the whole tensor
#endif
  explicit whole_tensor_optimizer(backend_type& b) : state(b) {}
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
  whole_tensor_optimizer opt(b);
  pipeswap::optimizer_swap<whole_tensor_optimizer, pipeswap::split_partition> rt(x, opt);
  return 0; // expect: split_partition needs an optimizer whose update is elementwise
}
