// pipeswap — vector clocks for the mock backend's happens-before relation (internal).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace pipeswap::mock::detail {

/// One counter per agent (agent 0 is the host thread, agent i+1 is stream i). Operation (a, n) — the
/// n-th operation of agent a — happens before everything whose clock has entry a >= n.
///
/// Every operation copies a clock: up to `inline_agents` agents the counters live in the object (no
/// allocation per copy), beyond that on the heap.
class vector_clock {
public:
  vector_clock() = default;
  /// Every operation copies a clock: inline, the counters are copied and nothing else.
  vector_clock(vector_clock const& o) : inline_(o.inline_), n_(o.n_) {
    if (!o.heap_.empty()) heap_ = o.heap_;
  }
  /// Every operation assigns a clock: with both inline, the counters are copied and nothing else.
  vector_clock& operator=(vector_clock const& o) {
    inline_ = o.inline_; // past o.n_ they are 0, as this clock's must be
    if (!o.heap_.empty() || !heap_.empty()) heap_ = o.heap_;
    n_ = o.n_;
    return *this;
  }
  vector_clock(vector_clock&&) = default;
  vector_clock& operator=(vector_clock&&) = default;

  [[nodiscard]] std::uint64_t get(std::uint32_t agent) const noexcept { return agent < n_ ? data()[agent] : 0; }
  void set(std::uint32_t agent, std::uint64_t value) {
    if (agent >= n_) grow(agent + std::size_t{1});
    data()[agent] = value;
  }
  void join(vector_clock const& o) {
    if (o.n_ > n_) grow(o.n_);
    auto* v = data();
    auto const* w = o.data();
    for (std::size_t i = 0; i < o.n_; ++i) v[i] = std::max(v[i], w[i]);
  }
  [[nodiscard]] bool covers(std::uint32_t agent, std::uint64_t seq) const noexcept { return get(agent) >= seq; }

private:
  static constexpr std::size_t inline_agents = 16;

  [[nodiscard]] std::uint64_t* data() noexcept { return heap_.empty() ? inline_.data() : heap_.data(); }
  [[nodiscard]] std::uint64_t const* data() const noexcept { return heap_.empty() ? inline_.data() : heap_.data(); }

  /// n > n_ agents; the new counters are 0 (inline ones past n_ never left 0).
  void grow(std::size_t n) {
    if (heap_.empty() && n > inline_agents)
      heap_.assign(inline_.begin(), inline_.begin() + static_cast<std::ptrdiff_t>(n_));
    if (!heap_.empty() || n > inline_agents) heap_.resize(n, 0);
    n_ = n;
  }

  std::array<std::uint64_t, inline_agents> inline_{};
  std::vector<std::uint64_t> heap_; ///< the counters, once more than inline_agents
  std::size_t n_ = 0;               ///< agents counted
};

} // namespace pipeswap::mock::detail
