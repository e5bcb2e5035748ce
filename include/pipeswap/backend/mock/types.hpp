// pipeswap — the mock backend's vocabulary: its stream and event handles, kernel descriptions, the
// operation log's records and the backend's options.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include <pipeswap/backend/device_ptr.hpp>
#include <pipeswap/backend/mock/detail/vector_clock.hpp>
#include <pipeswap/backend/mock/hazard.hpp>
#include <pipeswap/backend/mock/timing.hpp>

namespace pipeswap::mock {

/// A stream of the mock backend. Stream 0 is the compute stream the backend starts with.
struct stream {
  std::uint32_t id = 0;
  friend constexpr bool operator==(stream, stream) noexcept = default;
};

/// A recorded point on a stream. A default-constructed event was never recorded; waiting on it is an
/// error.
struct event {
  std::uint64_t id = 0;
  std::uint32_t stream = 0;
  sim_time time = 0;
  detail::vector_clock clock;
  [[nodiscard]] bool recorded() const noexcept { return id != 0; }
};

/// A range of device bytes a kernel reads or writes.
struct region {
  device_ptr ptr;
  std::size_t bytes = 0;
};

/// What a kernel launch declares: its name (for traces and reports), the device bytes it only reads,
/// the bytes it writes (possibly reading them first), and an optional explicit duration.
struct kernel_desc {
  std::string name;
  std::vector<region> reads;
  std::vector<region> writes;
  std::optional<sim_time> cost;
};

/// Operation classes that fault injection can target.
enum class fault_site : std::uint8_t { copy, allocation, kernel };

/// Kinds of logged operation.
enum class op_kind : std::uint8_t {
  allocate,
  release,
  h2d,
  d2h,
  kernel,
  record,
  wait,
  host_sync,
  host_read,
  host_write,
  host_allocate,
  host_release
};

constexpr std::string_view to_string(op_kind k) noexcept {
  constexpr std::string_view names[] = {"allocate",  "release",    "h2d",           "d2h",
                                        "kernel",    "record",     "wait",          "host-sync",
                                        "host-read", "host-write", "host-allocate", "host-release"};
  return names[static_cast<int>(k)];
}

inline std::ostream& operator<<(std::ostream& os, op_kind k) { return os << to_string(k); }

/// Execution resources a timed operation occupies.
enum class engine : std::uint8_t { none, h2d, d2h, compute };

/// One entry of the operation log (and of the exported trace).
struct op_record {
  op_kind kind{};
  std::uint32_t agent = 0; ///< 0 = host thread, i + 1 = stream i
  std::uint64_t seq = 0;   ///< index of this op among its agent's ops (1-based)
  sim_time start = 0;
  sim_time end = 0;
  std::size_t bytes = 0;
  engine eng = engine::none;
  std::string name;
};

struct options {
  timing_model timing = timing_model::unit();
  hazard_policy hazards = hazard_policy::raise;
  /// Hold real bytes and run kernel bodies. Off: timing, accounting and hazards only.
  bool materialize = true;
  /// Device allocations that would make live bytes exceed this at their time throw mock_error.
  std::size_t device_capacity = std::numeric_limits<std::size_t>::max();
  /// Number of preceding operations quoted in a hazard report.
  std::size_t trace_context = 12;
  /// Keep a record of every operation (ops(), the traces, the op trace and the names a hazard
  /// report quotes). Off: operations are counted, not recorded, and their names are not formatted;
  /// ops() is empty, the traces hold no operations and a report names operations by number only.
  /// For runs that read only times and bytes (the planner's candidates).
  bool keep_op_log = true;
};

} // namespace pipeswap::mock
