// pipeswap — the settings of the optimizer-swap runtime, and the error a failed step throws.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <pipeswap/detail/view.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/optim/state.hpp>

namespace pipeswap {

/// Runtime knobs of optimizer_swap.
struct swap_config {
  /// Number of batches a step is split into (clamped to the number of units); must be positive.
  std::size_t swap_times = 16;
  /// State keys eligible for swap, by name, each once; empty optional = every supported key.
  std::optional<std::vector<std::string>> state_keys;
  /// Slots with fewer elements stay on the device.
  std::size_t min_swap_numel = 1024;
  /// Use the packed pipeline (two staging arenas) instead of per-tensor storage.
  bool packed = true;
  /// Bytes of swappable state (whole batches, from the front of the step's batch order) that stay on
  /// the device across steps. Rounded down to whole batches; 0 = none (every batch streams).
  std::size_t resident_share = 0;
  /// step() returns with the D2H of its last batches in flight; finish_offload(),
  /// synchronize_host_mirrors(), the next step(), the destructor, or a prefetch() that needs its room
  /// finish it.
  bool defer_offload = false;

  void validate() const {
    if (swap_times == 0) throw invalid_argument("swap_config::swap_times must be positive.");
    if (state_keys) (void)validate_state_keys(detail::view(*state_keys));
  }
};

/// A step failed: names the batch, its parameters and the operation; the original exception (the
/// backend's, the optimizer's or the listener's) is nested (std::rethrow_if_nested).
class step_error : public error {
public:
  step_error(std::string const& what, std::string op, std::optional<std::size_t> batch)
      : error(what), op_(std::move(op)), batch_(batch) {}
  /// The pipeline operation that failed ("load", "update", "offload", "wait_offload", ...).
  [[nodiscard]] std::string const& operation() const noexcept { return op_; }
  /// The batch it failed in (none for work outside a batch, e.g. the staging arenas).
  [[nodiscard]] std::optional<std::size_t> batch() const noexcept { return batch_; }

private:
  std::string op_;
  std::optional<std::size_t> batch_;
};

} // namespace pipeswap
