// pipeswap — the mock backend's operation log and the names of its lanes (internal).
//
// Every operation the backend performs is appended here; hazard reports quote it and the trace
// export writes it. Lane 0 is the host thread, lane i + 1 is stream i.
#pragma once

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <pipeswap/backend/mock/timing.hpp>
#include <pipeswap/backend/mock/types.hpp>

namespace pipeswap::mock::detail {

class op_log {
public:
  op_log() { lanes_.emplace_back("host"); }

  /// Adds a lane for a new stream; returns its index among the streams.
  std::uint32_t add_stream(std::string name) {
    lanes_.push_back(std::move(name));
    return static_cast<std::uint32_t>(lanes_.size() - 2);
  }
  [[nodiscard]] std::size_t streams() const noexcept { return lanes_.size() - 1; }
  [[nodiscard]] std::string const& lane(std::uint32_t agent) const { return lanes_.at(agent); }
  [[nodiscard]] std::string const& stream_lane(std::uint32_t stream) const { return lanes_.at(stream + 1); }

  std::uint64_t push(op_record r) {
    ops_.push_back(std::move(r));
    return ops_.size() - 1;
  }
  [[nodiscard]] std::vector<op_record> const& ops() const noexcept { return ops_; }
  [[nodiscard]] op_record const& at(std::uint64_t i) const { return ops_.at(i); }
  [[nodiscard]] std::uint64_t size() const noexcept { return ops_.size(); }

  /// `kind 'name' (op #i on lane, t=[start,end))`: one operation as a hazard report quotes it.
  [[nodiscard]] std::string op_text(std::uint64_t op, op_kind k, std::string const& name, std::uint32_t agent,
                                    sim_time start, sim_time end) const {
    std::ostringstream os;
    os << to_string(k) << " '" << name << "' (op #" << op << " on " << lane(agent) << ", t=[" << start << "," << end
       << "))";
    return os.str();
  }
  [[nodiscard]] std::string op_text(std::uint64_t op) const {
    auto const& r = at(op);
    return op_text(op, r.kind, r.name, r.agent, r.start, r.end);
  }

  /// `#i kind 'name' on lane t=[start,end)`: one line of an op trace.
  [[nodiscard]] std::string describe(std::uint64_t i) const {
    auto const& r = at(i);
    std::ostringstream os;
    os << "#" << i << " " << to_string(r.kind) << " '" << r.name << "' on " << lane(r.agent) << " t=[" << r.start << ","
       << r.end << ")";
    return os.str();
  }

  /// The op trace that ends at operation `op` (at most `count` entries), one line per operation.
  [[nodiscard]] std::string format_trace(std::uint64_t op, std::size_t count) const {
    std::ostringstream os;
    std::uint64_t const first = op + 1 > count ? op + 1 - count : 0;
    for (std::uint64_t i = first; i <= op && i < ops_.size(); ++i) os << "  " << describe(i) << "\n";
    return os.str();
  }

private:
  std::vector<std::string> lanes_;
  std::vector<op_record> ops_;
};

} // namespace pipeswap::mock::detail
