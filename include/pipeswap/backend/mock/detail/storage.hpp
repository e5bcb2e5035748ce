// pipeswap — the mock backend's allocations and its queue of pending data effects (internal).
//
// An allocation holds real bytes (when materialized) and the shadow map the hazard checker reads.
// Data effects (a copy's memcpy, a kernel body, a release's free) are queued at their simulated end
// time and applied in (end, op) order when the host's clock passes it, so a missing wait shows up as
// stale data, as on hardware.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <queue>
#include <utility>
#include <vector>

#include <pipeswap/backend/mock/detail/shadow.hpp>
#include <pipeswap/backend/mock/detail/vector_clock.hpp>
#include <pipeswap/backend/mock/timing.hpp>

namespace pipeswap::mock::detail {

/// Device allocations are aligned (and spaced) to this many bytes.
inline constexpr std::size_t allocation_alignment = 256;

struct allocation {
  std::uint64_t id = 0;
  bool device = true;
  std::uintptr_t base = 0;
  std::size_t size = 0;
  std::byte* data = nullptr;
  bool released = false;
  bool storage_gone = false;
  std::uint64_t release_op = 0;
  std::optional<shadow_map> shadow;

  void fill_poison() {
    data = static_cast<std::byte*>(::operator new (size, std::align_val_t{allocation_alignment}));
    std::memset(data, 0xCD, size);
  }
  void free_storage() noexcept {
    storage_gone = true;
    if (data != nullptr) ::operator delete (data, std::align_val_t{allocation_alignment});
    data = nullptr;
  }
  allocation() = default;
  allocation(allocation const&) = delete;
  allocation& operator=(allocation const&) = delete;
  ~allocation() { free_storage(); }
};
using alloc_ptr = std::shared_ptr<allocation>;

/// Where and when an operation about to be committed runs, and the clock it runs with.
struct planned {
  std::uint32_t agent = 0;
  std::uint64_t seq = 0;
  sim_time start = 0, end = 0;
  vector_clock clock;
};

/// The byte ranges one operation touches, with how.
struct touches {
  struct one {
    alloc_ptr a;
    std::size_t lo, hi;
    access_mode mode;
  };
  std::vector<one> list;
  void add(alloc_ptr a, std::size_t lo, std::size_t hi, access_mode m) { list.push_back({std::move(a), lo, hi, m}); }
  [[nodiscard]] std::vector<alloc_ptr> allocations() const {
    std::vector<alloc_ptr> out;
    for (auto const& t : list) out.push_back(t.a);
    return out;
  }
};

/// A change of live device bytes at a simulated time.
struct mem_event {
  sim_time time;
  std::int64_t delta;
  std::uint64_t op;
};

/// Pending data effects, applied in (end time, op) order. Released host allocations whose bytes a
/// pending effect still refers to are kept alive until it ran.
class effect_queue {
public:
  void push(sim_time end, std::uint64_t op, std::function<void()> fn) { effects_.push(effect{end, op, std::move(fn)}); }
  void keep_until_drained(alloc_ptr a) {
    if (a.use_count() > 1) graveyard_.push_back(std::move(a));
  }
  /// Applies every pending effect whose end time is at most `t`.
  void drain(sim_time t) {
    while (!effects_.empty() && effects_.top().end <= t) {
      auto fn = std::move(const_cast<effect&>(effects_.top()).fn);
      effects_.pop();
      fn();
    }
    std::erase_if(graveyard_, [](alloc_ptr const& a) { return a.use_count() == 1; });
  }

private:
  struct effect {
    sim_time end;
    std::uint64_t op;
    std::function<void()> fn;
  };
  struct effect_later {
    bool operator()(effect const& a, effect const& b) const noexcept {
      return a.end != b.end ? a.end > b.end : a.op > b.op;
    }
  };
  std::priority_queue<effect, std::vector<effect>, effect_later> effects_;
  std::vector<alloc_ptr> graveyard_;
};

} // namespace pipeswap::mock::detail
