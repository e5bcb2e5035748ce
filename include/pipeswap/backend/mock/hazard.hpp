// pipeswap — hazard reports and errors of the mock backend.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

#include <pipeswap/error.hpp>

namespace pipeswap::mock {

/// What the mock backend throws: invalid calls, injected faults and (under hazard_policy::raise)
/// hazards. The backend stays usable after it is thrown.
class mock_error : public pipeswap::error {
public:
  using pipeswap::error::error;
};

/// The kinds of ordering bug the hazard checker reports.
enum class hazard_kind : std::uint8_t {
  /// An operation reads bytes whose last write (copy, kernel, allocation) is not ordered before it.
  read_before_write,
  /// An operation writes bytes that an earlier, unordered copy or kernel still reads or writes.
  write_while_in_use,
  /// Device or pinned storage is released while an operation that uses it is not ordered before the
  /// release.
  release_while_in_use,
  /// The host reads pinned bytes written by a D2H copy that the host has not synchronized with.
  unsynchronized_host_read,
  /// An operation uses storage that was already released.
  use_after_release,
};

constexpr std::string_view to_string(hazard_kind k) noexcept {
  switch (k) {
  case hazard_kind::read_before_write: return "read-before-write";
  case hazard_kind::write_while_in_use: return "write-while-in-use";
  case hazard_kind::release_while_in_use: return "release-while-in-use";
  case hazard_kind::unsynchronized_host_read: return "unsynchronized-host-read";
  case hazard_kind::use_after_release: return "use-after-release";
  }
  return "?";
}

inline std::ostream& operator<<(std::ostream& os, hazard_kind k) { return os << to_string(k); }

/// One reported hazard. `op` and `conflicting_op` index the backend's operation log; `message` reads on
/// its own: the rule, both operations with their streams and times, the storage, and the op trace
/// leading to the offending operation.
struct hazard {
  hazard_kind kind{};
  std::uint64_t op = 0;
  std::uint64_t conflicting_op = 0;
  std::uint64_t allocation = 0;
  std::size_t offset = 0;
  std::size_t size = 0;
  std::string message;
};

/// Thrown under hazard_policy::raise; carries the report. The offending operation was not performed.
class hazard_error : public mock_error {
public:
  explicit hazard_error(hazard h) : mock_error(h.message), report_(std::move(h)) {}
  [[nodiscard]] hazard const& report() const noexcept { return report_; }

private:
  hazard report_;
};

/// What the checker does when it finds a hazard.
enum class hazard_policy : std::uint8_t {
  raise,  ///< throw hazard_error from the offending call, before the operation takes effect
  record, ///< append to hazards() and carry on (the data then shows what the race did)
  ignore, ///< do not check, nor record accesses for later checks (pure timing runs)
};

} // namespace pipeswap::mock
