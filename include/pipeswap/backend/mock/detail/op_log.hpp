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

  /// Whether push() records operations (else it only counts them: options::keep_op_log).
  void keep(bool k) noexcept { keep_ = k; }
  [[nodiscard]] bool keeps() const noexcept { return keep_; }

  std::uint64_t push(op_record r) {
    if (keep_ && ops_.size() == count_) ops_.push_back(std::move(r));
    return count_++;
  }
  /// Counts an operation without a record (what push() does while keep() is off).
  std::uint64_t count() noexcept { return count_++; }
  /// The recorded operations (those pushed while keep() was on and every earlier one was recorded).
  [[nodiscard]] std::vector<op_record> const& ops() const noexcept { return ops_; }
  /// Operation `i`; one that was counted but not recorded reads as a nameless record.
  [[nodiscard]] op_record const& at(std::uint64_t i) const {
    if (i < ops_.size()) return ops_[i];
    if (i < count_) return unrecorded_;
    return ops_.at(i); // out of range
  }
  [[nodiscard]] std::uint64_t size() const noexcept { return count_; }

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
    for (std::uint64_t i = first; i <= op && i < count_; ++i) os << "  " << describe(i) << "\n";
    return os.str();
  }

private:
  std::vector<std::string> lanes_;
  std::vector<op_record> ops_;
  std::uint64_t count_ = 0;
  bool keep_ = true;
  op_record unrecorded_{op_kind{}, 0, 0, 0, 0, 0, engine::none, "(not recorded)"};
};

} // namespace pipeswap::mock::detail
