// pipeswap — exception types.
//
// Every error the library raises derives from pipeswap::error. Messages name the object involved and
// the rule that was broken. After any exception the object that threw is still usable: no state is
// lost (see docs/guarantees.md).
#pragma once

#include <stdexcept>
#include <string>
#include <version>

#include <pipeswap/detail/message.hpp>
#if defined(__cpp_lib_source_location)
#  include <source_location>
#endif

namespace pipeswap {

/// Base of every exception pipeswap throws.
class error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// Bad input from the caller: malformed schedules, unknown state keys, impossible sizes, corrupt files.
class invalid_argument : public error {
public:
  using error::error;
};

/// A call made in a state that does not allow it (e.g. waiting on a transfer that was never launched).
class state_error : public error {
public:
  using error::error;
};

// clang 14 with libstdc++ 12 has no std::source_location (it lacks __builtin_source_location);
// the rest of this header still compiles there, which the clang-built fuzz targets rely on.
#if defined(__cpp_lib_source_location)
namespace detail {
inline std::string where(std::source_location const& loc) {
  return detail::message({loc.file_name(), ":", loc.line()});
}
} // namespace detail
#endif

} // namespace pipeswap
