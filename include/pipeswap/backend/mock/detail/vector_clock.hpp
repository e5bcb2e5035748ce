// pipeswap — vector clocks for the mock backend's happens-before relation (internal).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace pipeswap::mock::detail {

/// One counter per agent (agent 0 is the host thread, agent i+1 is stream i). Operation (a, n) — the
/// n-th operation of agent a — happens before everything whose clock has entry a >= n.
class vector_clock {
public:
  [[nodiscard]] std::uint64_t get(std::uint32_t agent) const noexcept {
    return agent < v_.size() ? v_[agent] : 0;
  }
  void set(std::uint32_t agent, std::uint64_t value) {
    if (agent >= v_.size()) v_.resize(agent + 1, 0);
    v_[agent] = value;
  }
  void join(vector_clock const& o) {
    if (o.v_.size() > v_.size()) v_.resize(o.v_.size(), 0);
    for (std::size_t i = 0; i < o.v_.size(); ++i) v_[i] = std::max(v_[i], o.v_[i]);
  }
  [[nodiscard]] bool covers(std::uint32_t agent, std::uint64_t seq) const noexcept {
    return get(agent) >= seq;
  }

private:
  std::vector<std::uint64_t> v_;
};

} // namespace pipeswap::mock::detail
