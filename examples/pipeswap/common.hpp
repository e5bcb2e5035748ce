// pipeswap command — what the subcommands share: exit codes, input and output, the progress meter.
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include <pipeswap/sim/model.hpp>

namespace pipeswap_cli {

/// Exit statuses (docs/cli.md).
enum exit_status : int {
  exit_ok = 0,
  exit_failed = 1,    ///< a validation failure: problems found, nothing fits the budget
  exit_bad_input = 2, ///< bad arguments, unreadable or malformed input, invalid scenario
  exit_internal = 3,  ///< an unexpected internal error
};

/// Bad input found by the command itself (reported like pipeswap::invalid_argument: exit 2).
class bad_input : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// The text of `path`, or of standard input when `path` is empty or "-". Throws bad_input.
std::string read_input(std::string const& path);

/// Parses JSON text; `what` names the input in messages. Throws bad_input with the byte offset.
nlohmann::json parse_json(std::string const& text, std::string const& what);

/// Writes `text` to `path` (replacing it). Throws bad_input when the file cannot be written.
void write_file(std::string const& path, std::string const& text);

/// The scenario of `path` (empty: the built-in default). Throws pipeswap::invalid_argument or bad_input.
pipeswap::sim::scenario load_scenario(std::string const& path);

/// When to show progress on standard error.
enum class progress_mode { automatic, always, never };

/// A one-line progress indicator on standard error. `automatic` shows it only when standard error is a
/// terminal and the run has lasted a second; `always` shows it from the start (on a terminal as one
/// updating line, elsewhere as a line per tenth); `never` shows nothing. Never writes to stdout.
class progress_meter {
public:
  progress_meter(std::string label, progress_mode mode);
  progress_meter(progress_meter const&) = delete;
  progress_meter& operator=(progress_meter const&) = delete;
  ~progress_meter();

  /// Reports the fraction done (0..1) and, optionally, what is running.
  void update(double fraction, std::string const& what = {});
  /// Clears the line (on a terminal) or prints the last line.
  void finish();

private:
  std::string label_;
  bool enabled_ = false;
  bool tty_ = false;
  bool shown_ = false;
  bool finished_ = false;
  bool delay_ = true;
  int last_tenth_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

} // namespace pipeswap_cli
