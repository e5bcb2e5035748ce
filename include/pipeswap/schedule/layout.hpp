// pipeswap — which rank runs which pipeline stage.
#pragma once

#include <cstdint>
#include <string>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/schedule/step.hpp>

namespace pipeswap::schedule {

/// How stages map to ranks (generate_stage_to_rank_mapping).
enum class placement : std::uint8_t {
  /// Stage s runs on rank s % R: rank r owns r, r+R, r+2R, ...
  loop,
  /// Zig-zag: stages go 0..R-1 across the ranks, then back R-1..0, then forward again. With two stages per rank
  /// rank r owns r and 2R-1-r (the DualPipe-V shape).
  v,
};

/// `ranks` ranks running `ranks * stages_per_rank` stages, placed by `style`: each rank runs `stages_per_rank` of them
/// (stages_per_rank(); what the interleaved schedules call "model chunks"). A schedule::chunk is something
/// else: one micro-batch of one stage.
///
/// An older generate_operations mapped a 'v' stage s >= R to `stages - 1 - s`, which is
/// the zig-zag for two stages per rank and out of range beyond; this class uses the zig-zag for any number of stages per rank.
class stage_layout {
public:
  /// Throws invalid_argument unless ranks >= 1, stages_per_rank >= 1 and ranks * stages_per_rank fits in index_type.
  stage_layout(index_type ranks, index_type stages_per_rank = 1, placement style = placement::loop)
      : ranks_(ranks), stages_per_rank_(stages_per_rank), style_(style) {
    if (ranks < 1) throw invalid_argument(pipeswap::detail::message({"stage layout: ranks must be >= 1, got ", ranks}));
    if (stages_per_rank < 1)
      throw invalid_argument(
          pipeswap::detail::message({"stage layout: stages_per_rank must be >= 1, got ", stages_per_rank}));
    if (std::int64_t(ranks) * stages_per_rank > INT32_MAX)
      throw invalid_argument(
          pipeswap::detail::message({"stage layout: ranks * stages_per_rank (", std::int64_t(ranks) * stages_per_rank,
                                     ") exceeds the stage index range"}));
  }

  index_type ranks() const noexcept { return ranks_; }
  index_type stages_per_rank() const noexcept { return stages_per_rank_; }
  index_type stages() const noexcept { return ranks_ * stages_per_rank_; }
  placement style() const noexcept { return style_; }
  bool has_stage(index_type stage) const noexcept { return stage >= 0 && stage < stages(); }

  /// The rank that runs `stage`; requires has_stage(stage).
  index_type rank_of(index_type stage) const noexcept {
    index_type const within = stage % ranks_;
    if (style_ == placement::loop || (stage / ranks_) % 2 == 0) return within;
    return ranks_ - 1 - within;
  }

private:
  index_type ranks_;
  index_type stages_per_rank_;
  placement style_;
};

} // namespace pipeswap::schedule
