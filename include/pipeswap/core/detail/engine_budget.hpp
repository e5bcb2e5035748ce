// pipeswap — a transfer engine's account with its device budget (core/budget.hpp): which budget it
// counts in, the bytes it holds reserved there per client, and the reload demand it registered.
// Backend-independent, so compiled once whatever the backend; transfer_engine<B> derives from it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include <pipeswap/core/budget.hpp>
#include <pipeswap/detail/message.hpp>
#include <pipeswap/error.hpp>

namespace pipeswap::detail {

class engine_budget {
public:
  engine_budget() = default;
  engine_budget(engine_budget const&) = delete;
  engine_budget& operator=(engine_budget const&) = delete;
  ~engine_budget() {
    if (link_.budget) link_.budget->detach(link_);
  }

  /// Counts the swap jobs' device storage in `b` from now on (nullptr: unlimited, nothing counted).
  /// Throws state_error, changing nothing, while the engine holds bytes reserved in its current
  /// budget or reload demand there: set the budget before the runtimes allocate (before building an
  /// optimizer_swap with a resident share), or after everything went home.
  void set_budget(device_budget* b) {
    if (b == link_.budget && !link_.orphaned) return;
    if (held_[0] + held_[1] + demand_ > 0 && !link_.orphaned) {
      throw state_error(message({"transfer_engine::set_budget: the engine holds ", held_[0] + held_[1],
                                 " reserved bytes and ", demand_,
                                 " bytes of reload demand in its current budget; change budgets only while the swap "
                                 "jobs hold no device storage"}));
    }
    if (link_.budget) link_.budget->detach(link_);
    link_.budget = nullptr;
    link_.orphaned = false;
    held_[0] = held_[1] = 0;
    demand_ = 0;
    if (b) {
      b->attach(link_);
      link_.budget = b;
    }
  }
  [[nodiscard]] device_budget* budget() const noexcept { return link_.budget; }
  /// Throws state_error when the engine's budget was destroyed under it (`op` names the caller).
  void check_budget(std::string_view op) const {
    if (link_.orphaned) {
      throw state_error(message({op, ": the engine's device_budget was destroyed while the engine still used it; a "
                                     "budget must outlive its engines (call set_budget(nullptr) or set_budget(other) "
                                     "first)"}));
    }
  }
  /// Bytes this engine holds reserved in its budget for `c`.
  [[nodiscard]] std::uint64_t reserved_bytes(budget_client c) const noexcept { return held_[static_cast<int>(c)]; }
  /// Whether an optional allocation of `bytes` (an optimizer prefetch) may start now: always without
  /// a budget; with one, when the bytes fit its optional_room() (reload demand left free).
  [[nodiscard]] bool admits_optional(std::uint64_t bytes) {
    check_budget("transfer_engine::admits_optional");
    return !link_.budget || link_.budget->admits(bytes);
  }
  /// Keeps `bytes` reserved for `c` although no allocation of the engine holds them (a required
  /// reservation): storage whose release is issued but not yet ordered before the next allocation (a
  /// deferred offload). Returns whether a budget counted it; give it back with unhold().
  bool hold(budget_client c, std::uint64_t bytes) { return reserve(c, bytes, true); }
  void unhold(budget_client c, std::uint64_t bytes) noexcept { unreserve(c, bytes); }
  /// As admits_optional(), counting nothing.
  [[nodiscard]] bool fits_optional(std::uint64_t bytes) const {
    check_budget("transfer_engine::fits_optional");
    return !link_.budget || link_.budget->fits(bytes);
  }
  /// Whether a required reservation (or an allocation beside the budget) of `bytes` fits now:
  /// always without a budget; with one, when used() + bytes stays within its capacity.
  [[nodiscard]] bool fits_required(std::uint64_t bytes) const {
    check_budget("transfer_engine::fits_required");
    return !link_.budget || bytes <= link_.budget->available();
  }
  /// Reload demand of offloaded activations (device_budget::add_reload_demand), counted per engine.
  void add_reload_demand(std::uint64_t bytes) {
    check_budget("transfer_engine::add_reload_demand");
    if (!link_.budget) return;
    link_.budget->add_reload_demand(bytes);
    demand_ += bytes;
  }
  void drop_reload_demand(std::uint64_t bytes) noexcept {
    bytes = std::min(bytes, demand_);
    if (link_.budget) link_.budget->drop_reload_demand(bytes);
    demand_ -= bytes;
  }

protected:
  /// A required reservation; true when a budget counted it. A strict budget refuses one that does
  /// not fit (budget_exceeded), unless `allocated` (the bytes are already in use).
  bool reserve(budget_client c, std::uint64_t n, bool allocated = false) {
    check_budget("transfer_engine::reserve");
    if (!link_.budget || n == 0) return false;
    if (allocated)
      link_.budget->reserve_unchecked(c, n);
    else
      link_.budget->reserve(c, n);
    held_[static_cast<int>(c)] += n;
    return true;
  }
  void unreserve(budget_client c, std::uint64_t n) noexcept {
    auto& h = held_[static_cast<int>(c)];
    n = std::min<std::uint64_t>(n, h);
    h -= n;
    if (!link_.budget) return; // orphaned: the budget is gone
    try {
      link_.budget->release(c, n);
    } catch (...) { // cannot happen: the engine returns only what it reserved
    }
  }

  budget_link link_;
  std::uint64_t held_[2] = {0, 0};
  std::uint64_t demand_ = 0;
};

} // namespace pipeswap::detail
