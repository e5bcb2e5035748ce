// pipeswap — one device-memory budget per device, shared by the swap jobs of one transfer_engine.
//
// A device_budget counts the device bytes the swap runtimes hold: the storage of swapped optimizer
// pieces and of the packed pipeline's staging arenas, the own storage of prefetched and resident-share
// batches, and the storage activation loads bring back. The engine reserves before every such
// allocation and returns the bytes when it issues the stream-ordered release behind the copy that
// reads the storage (so at every instant of the device timeline the live bytes are at most what the
// budget counted when the later of the two calls was made). State that never swaps (below min_swap_numel,
// keys not swapped), parameters, gradients and the activations a forward allocates are not counted:
// size the capacity as the room left once they are placed.
//
// Two kinds of reservation (docs/guarantees.md, "Device budget"):
//   required  an activation load, a step's streaming batch or staging arena, the resident share. By
//             default (budget_policy::overshoot) it always proceeds (correctness first); when it goes
//             above the capacity it is counted (over_budget_count(), and high_water() above
//             capacity()). A strict budget (budget_policy::strict) refuses it instead: reserve()
//             throws budget_exceeded with nothing changed, and the engine reserves before it
//             allocates, so the refused call has allocated nothing.
//   optional  an optimizer prefetch. It starts only when its bytes fit in optional_room(): the
//             capacity minus what is reserved minus the reload demand, i.e. the bytes of activation
//             groups that are offloaded and will be loaded again. So activation loads take precedence
//             over prefetch: a prefetch never takes the room an offloaded activation needs to come back.
//
// Threading: not thread-safe; one host thread per device drives the engine and its budget.
// Lifetime: a budget outlives the engines that use it. Destroying it under a live engine is detected:
// the engine is detached, and its next reservation throws state_error naming the rule.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <pipeswap/core/detail/lean_vector.hpp>
#include <pipeswap/detail/message.hpp>
#include <pipeswap/error.hpp>

namespace pipeswap {

/// Which swap job a reservation belongs to.
enum class budget_client : std::uint8_t { activation, optimizer };

constexpr std::string_view to_string(budget_client c) noexcept {
  return c == budget_client::activation ? "activation" : "optimizer";
}

class device_budget;

/// What a device_budget does with a required reservation that does not fit.
enum class budget_policy : std::uint8_t {
  overshoot, ///< make it and count it (over_budget_count()): the work goes on, the peak rises
  strict,    ///< refuse it: reserve() throws budget_exceeded and changes nothing
};

/// A strict budget refused a required reservation. The call that needed the memory failed before
/// allocating it; raise the capacity (set_capacity) or free memory and call again.
class budget_exceeded : public state_error {
public:
  budget_exceeded(std::string const& what, budget_client c, std::uint64_t requested, std::uint64_t available)
      : state_error(what), client_(c), requested_(requested), available_(available) {}
  [[nodiscard]] budget_client client() const noexcept { return client_; }
  [[nodiscard]] std::uint64_t requested() const noexcept { return requested_; }
  [[nodiscard]] std::uint64_t available() const noexcept { return available_; }

private:
  budget_client client_;
  std::uint64_t requested_, available_;
};

namespace detail {
/// The engine's end of its link to a budget (non-template, so the budget can detach any engine).
struct budget_link {
  device_budget* budget = nullptr;
  bool orphaned = false; ///< the budget was destroyed while this engine used it
};
} // namespace detail

class device_budget {
public:
  explicit device_budget(std::uint64_t capacity_bytes, budget_policy policy = budget_policy::overshoot) noexcept
      : capacity_(capacity_bytes), policy_(policy) {}
  device_budget(device_budget const&) = delete;
  device_budget& operator=(device_budget const&) = delete;
  /// Detaches every engine still using the budget; their next reservation throws state_error.
  ~device_budget() {
    for (auto* l : links_) {
      l->budget = nullptr;
      l->orphaned = true;
    }
  }

  [[nodiscard]] std::uint64_t capacity() const noexcept { return capacity_; }
  /// Bytes reserved now, both clients.
  [[nodiscard]] std::uint64_t used() const noexcept { return used_[0] + used_[1]; }
  [[nodiscard]] std::uint64_t used(budget_client c) const noexcept { return used_[idx(c)]; }
  /// The maximum of used() over the budget's life (or since reset_high_water()).
  [[nodiscard]] std::uint64_t high_water() const noexcept { return high_water_; }
  /// The maximum of used(c) over the budget's life (or since reset_high_water()).
  [[nodiscard]] std::uint64_t high_water(budget_client c) const noexcept { return client_high_[idx(c)]; }
  /// capacity() - used(), never negative.
  [[nodiscard]] std::uint64_t available() const noexcept { return capacity_ > used() ? capacity_ - used() : 0; }
  /// May shrink below used(): then nothing optional fits until enough is released (and, strict,
  /// nothing required either).
  void set_capacity(std::uint64_t c) noexcept { capacity_ = c; }
  [[nodiscard]] budget_policy policy() const noexcept { return policy_; }
  void set_policy(budget_policy p) noexcept { policy_ = p; }

  // ----- reservations (the engine makes them; tests and custom clients may too) -------------------

  /// A required reservation. Overshoot (the default): always made; counted in over_budget_count()
  /// when used() exceeds the capacity afterwards. Strict: when `bytes` do not fit in available(),
  /// throws budget_exceeded naming the client, the bytes and the room, and changes nothing (the
  /// refusal is counted in refused_count()).
  void reserve(budget_client c, std::uint64_t bytes) {
    if (bytes == 0) return;
    require_room(c, bytes);
    reserve_unchecked(c, bytes);
  }
  /// Throws budget_exceeded, exactly as reserve(c, bytes) would, when the budget is strict and
  /// `bytes` do not fit; changes nothing otherwise (a caller about to reserve several pieces checks
  /// their sum first).
  void require_room(budget_client c, std::uint64_t bytes) {
    if (policy_ != budget_policy::strict || bytes <= available()) return;
    ++refused_;
    throw_exceeded(c, bytes);
  }
  /// Counts bytes whatever the policy (overshoot counted as in reserve()): for memory that is
  /// already allocated, such as storage kept after its release was issued. Never throws.
  void reserve_unchecked(budget_client c, std::uint64_t bytes) noexcept {
    if (bytes == 0) return;
    used_[idx(c)] += bytes;
    if (used() > capacity_) ++over_budget_;
    note_high();
  }
  /// An optional reservation: made only when `bytes` fit in optional_room(); otherwise nothing
  /// changes, the refusal is counted and false returned.
  [[nodiscard]] bool try_reserve(budget_client c, std::uint64_t bytes) noexcept {
    if (!admits(bytes)) return false;
    reserve(c, bytes);
    return true;
  }
  /// Whether an optional reservation of `bytes` would fit now (nothing counted).
  [[nodiscard]] bool fits(std::uint64_t bytes) const noexcept { return bytes <= optional_room(); }
  /// Whether an optional reservation of `bytes` would be made now (a refusal is counted).
  [[nodiscard]] bool admits(std::uint64_t bytes) noexcept {
    if (bytes <= optional_room()) return true;
    ++refused_;
    return false;
  }
  /// Returns bytes reserved by `c`. Throws state_error, changing nothing, when `c` holds fewer.
  void release(budget_client c, std::uint64_t bytes) {
    if (bytes > used_[idx(c)]) {
      throw state_error(detail::message({"device_budget::release: the ", to_string(c), " client returns ", bytes,
                                         " bytes but holds ", used_[idx(c)], "; release only what was reserved"}));
    }
    used_[idx(c)] -= bytes;
  }

  // ----- activation precedence ---------------------------------------------------------------------

  /// Bytes of offloaded activation groups that will be loaded again (activation_swap reports them
  /// from launch_offload until the group's load or release). Optional reservations leave them free.
  [[nodiscard]] std::uint64_t reload_demand() const noexcept { return demand_; }
  void add_reload_demand(std::uint64_t bytes) noexcept { demand_ += bytes; }
  void drop_reload_demand(std::uint64_t bytes) noexcept { demand_ -= std::min(bytes, demand_); }
  /// Room for an optional reservation: capacity - used - reload_demand, never negative.
  [[nodiscard]] std::uint64_t optional_room() const noexcept {
    auto const taken = used() + demand_;
    return capacity_ > taken ? capacity_ - taken : 0;
  }

  // ----- reports -----------------------------------------------------------------------------------

  /// Required reservations that left used() above the capacity.
  [[nodiscard]] std::uint64_t over_budget_count() const noexcept { return over_budget_; }
  /// Optional reservations refused for lack of room (and, strict, required ones).
  [[nodiscard]] std::uint64_t refused_count() const noexcept { return refused_; }
  /// Restarts the high-water marks at the bytes reserved now.
  void reset_high_water() noexcept {
    high_water_ = used();
    client_high_[0] = used_[0];
    client_high_[1] = used_[1];
  }
  /// Engines using this budget now.
  [[nodiscard]] std::size_t engines() const noexcept { return links_.size(); }

  /// Engine side (transfer_engine::set_budget).
  void attach(detail::budget_link& l) {
    for (auto* x : links_) {
      if (x == &l) return;
    }
    links_.push_back(&l);
  }
  void detach(detail::budget_link& l) noexcept {
    for (std::size_t i = links_.size(); i-- > 0;) {
      if (links_[i] == &l) links_.erase(links_.begin() + i);
    }
  }

private:
  [[noreturn]] void throw_exceeded(budget_client c, std::uint64_t bytes) const {
    throw budget_exceeded(
        detail::message({"device_budget::reserve: the ", to_string(c), " client needs ", bytes,
                         " bytes but the strict budget has ", available(), " of ", capacity_,
                         " bytes left; nothing was allocated (raise the capacity or free memory, then retry)"}),
        c, bytes, available());
  }
  static constexpr std::size_t idx(budget_client c) noexcept { return static_cast<std::size_t>(c); }
  void note_high() noexcept {
    high_water_ = std::max(high_water_, used());
    for (std::size_t i = 0; i < 2; ++i) client_high_[i] = std::max(client_high_[i], used_[i]);
  }

  std::uint64_t capacity_;
  budget_policy policy_ = budget_policy::overshoot;
  std::uint64_t used_[2] = {0, 0};
  std::uint64_t high_water_ = 0;
  std::uint64_t client_high_[2] = {0, 0};
  std::uint64_t demand_ = 0;
  std::uint64_t over_budget_ = 0;
  std::uint64_t refused_ = 0;
  detail::lean_vector<detail::budget_link*> links_;
};

} // namespace pipeswap
