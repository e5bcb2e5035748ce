// pipeswap — Chrome trace export of the mock backend's timeline (Perfetto and chrome://tracing open
// it): one lane per stream, one per copy engine and the compute engine, a host lane, and a
// device-memory counter. The output depends only on the sequence of operations, never on host
// addresses or wall time.
#pragma once

#include <cstdint>
#include <ostream>
#include <string_view>
#include <vector>

#include <pipeswap/backend/mock/detail/op_log.hpp>
#include <pipeswap/backend/mock/detail/storage.hpp>
#include <pipeswap/backend/mock/timing.hpp>
#include <pipeswap/backend/mock/types.hpp>

namespace pipeswap::mock::detail {

inline void json_string(std::ostream& os, std::string_view s) {
  os << '"';
  for (char ch : s) {
    auto const c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\')
      os << '\\' << ch;
    else if (c < 0x20) {
      constexpr char hex[] = "0123456789abcdef";
      os << "\\u00" << hex[c >> 4] << hex[c & 15];
    } else
      os << ch;
  }
  os << '"';
}

/// Nanoseconds as microseconds with exactly three decimals, from integers only.
inline void json_us(std::ostream& os, sim_time ns) {
  auto const neg = ns < 0;
  auto const a = neg ? -ns : ns;
  auto const frac = a % 1000;
  os << (neg ? "-" : "") << a / 1000 << '.' << static_cast<char>('0' + frac / 100)
     << static_cast<char>('0' + frac / 10 % 10) << static_cast<char>('0' + frac % 10);
}

/// Writes one device's trace events (no enclosing object) as process `pid` named `process`. `first`
/// is true until an event was written. `memory` is in simulated-time order.
inline void write_trace_events(std::ostream& os, op_log const& log, std::vector<mem_event> const& memory, bool& first,
                               int pid, std::string_view process) {
  constexpr int engine_tid_base = 1'000'000;
  constexpr char const* engine_names[] = {"", "H2D copy engine", "D2H copy engine", "compute engine"};
  auto sep = [&] {
    os << (first ? "\n" : ",\n");
    first = false;
  };
  auto lane = [&](int tid, std::string_view name, int order) {
    sep();
    os << R"({"name":"thread_name","ph":"M","pid":)" << pid << R"(,"tid":)" << tid << R"(,"args":{"name":)";
    json_string(os, name);
    os << "}}";
    sep();
    os << R"({"name":"thread_sort_index","ph":"M","pid":)" << pid << R"(,"tid":)" << tid << R"(,"args":{"sort_index":)"
       << order << "}}";
  };
  sep();
  os << R"({"name":"process_name","ph":"M","pid":)" << pid << R"(,"tid":0,"args":{"name":)";
  json_string(os, process);
  os << "}}";
  sep();
  os << R"({"name":"process_sort_index","ph":"M","pid":)" << pid << R"(,"tid":0,"args":{"sort_index":)" << pid << "}}";
  lane(0, "host", 0);
  for (std::uint32_t i = 0; i < log.streams(); ++i) {
    lane(static_cast<int>(i + 1), log.stream_lane(i), static_cast<int>(i + 1));
  }
  for (int e = 1; e <= 3; ++e) lane(engine_tid_base + e, engine_names[e], 1000 + e);

  auto event = [&](op_record const& r, std::uint64_t i, int tid) {
    sep();
    os << R"({"name":)";
    json_string(os, r.name);
    os << R"(,"cat":")" << to_string(r.kind) << '"';
    if (r.end > r.start) {
      os << R"(,"ph":"X","ts":)";
      json_us(os, r.start);
      os << R"(,"dur":)";
      json_us(os, r.end - r.start);
    } else {
      os << R"(,"ph":"i","s":"t","ts":)";
      json_us(os, r.start);
    }
    os << R"(,"pid":)" << pid << R"(,"tid":)" << tid << R"(,"args":{"op":)" << i << R"(,"bytes":)" << r.bytes << "}}";
  };
  for (std::uint64_t i = 0; i < log.ops().size(); ++i) { // the recorded operations
    auto const& r = log.ops()[i];
    event(r, i, static_cast<int>(r.agent));
    if (r.eng != engine::none) event(r, i, engine_tid_base + static_cast<int>(r.eng));
  }
  std::int64_t live = 0;
  for (auto const& e : memory) {
    live += e.delta;
    sep();
    os << R"({"name":"device bytes","ph":"C","pid":)" << pid << R"(,"tid":0,"ts":)";
    json_us(os, e.time);
    os << R"(,"args":{"bytes":)" << live << "}}";
  }
}

/// A whole trace file of one device.
inline void write_chrome_trace(std::ostream& os, op_log const& log, std::vector<mem_event> const& memory) {
  bool first = true;
  os << R"({"displayTimeUnit":"ns","traceEvents":[)";
  write_trace_events(os, log, memory, first, 1, "pipeswap mock device");
  os << "\n]}\n";
}

} // namespace pipeswap::mock::detail
