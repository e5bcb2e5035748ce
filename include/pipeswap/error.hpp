// pipeswap — exception types.
//
// Every error the library raises derives from pipeswap::error. Messages name the object involved and
// the rule that was broken. After any exception the object that threw is still usable: no state is
// lost (see docs/guarantees.md).
#pragma once

#include <source_location>
#include <stdexcept>
#include <string>

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

namespace detail {
inline std::string where(std::source_location const& loc) {
  return std::string(loc.file_name()) + ":" + std::to_string(loc.line());
}
} // namespace detail

} // namespace pipeswap
