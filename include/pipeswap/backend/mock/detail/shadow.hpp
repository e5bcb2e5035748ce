// pipeswap — shadow state of one allocation for the mock's hazard checker (internal).
//
// The bytes of an allocation are tiled by disjoint segments. Each segment remembers its last write and
// the reads since that write. A new access splits segments at its bounds, checks itself against every
// segment it covers, then updates them: a write replaces the whole covered range by one segment (so
// repeated whole-buffer copies keep the map small), a read joins the segment's reader list and drops
// readers that are ordered before it (any later conflict with them is also a conflict with it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <vector>

#include <pipeswap/backend/mock/detail/vector_clock.hpp>

namespace pipeswap::mock::detail {

struct access_ref {
  std::uint32_t agent = 0;
  std::uint64_t seq = 0;
  std::uint64_t op = 0;
  [[nodiscard]] bool ordered_before(vector_clock const& c) const noexcept { return c.covers(agent, seq); }
};

enum class access_mode : std::uint8_t { read, write, read_write, release };

struct conflict {
  access_ref other;
  bool other_wrote = false;
  std::size_t lo = 0, hi = 0;
};

class shadow_map {
public:
  explicit shadow_map(std::size_t size, std::optional<access_ref> definer) : size_(size) {
    segment s;
    s.last_write = definer;
    if (size_ > 0) segs_.emplace(0, s);
  }

  /// First access in [lo, hi) not ordered before an access of `mode` with clock `c`, if any.
  [[nodiscard]] std::optional<conflict> check(std::size_t lo, std::size_t hi, access_mode mode,
                                              vector_clock const& c) const {
    if (lo >= hi) return std::nullopt;
    auto it = segs_.upper_bound(lo);
    --it;
    for (; it != segs_.end() && it->first < hi; ++it) {
      std::size_t const s_lo = std::max(lo, it->first);
      std::size_t const s_hi = std::min(hi, end_of(it));
      auto const& seg = it->second;
      if (seg.last_write && !seg.last_write->ordered_before(c)) {
        return conflict{*seg.last_write, true, s_lo, s_hi};
      }
      if (mode != access_mode::read) {
        for (auto const& r : seg.reads) {
          if (!r.ordered_before(c)) return conflict{r, false, s_lo, s_hi};
        }
      }
    }
    return std::nullopt;
  }

  /// Records an access (after check()).
  void record(std::size_t lo, std::size_t hi, access_mode mode, access_ref a, vector_clock const& c) {
    if (lo >= hi) return;
    split(lo);
    split(hi);
    auto first = segs_.find(lo);
    if (mode == access_mode::write || mode == access_mode::read_write) {
      auto last = segs_.lower_bound(hi);
      segs_.erase(first, last);
      segment s;
      s.last_write = a;
      segs_.emplace(lo, std::move(s));
      return;
    }
    for (auto it = first; it != segs_.end() && it->first < hi; ++it) {
      auto& reads = it->second.reads;
      std::erase_if(reads, [&](access_ref const& r) { return r.ordered_before(c); });
      reads.push_back(a);
    }
  }

  /// Number of segments the bytes are tiled into (diagnostics and tests).
  [[nodiscard]] std::size_t segment_count() const noexcept { return segs_.size(); }

private:
  struct segment {
    std::optional<access_ref> last_write;
    std::vector<access_ref> reads;
  };

  [[nodiscard]] std::size_t end_of(std::map<std::size_t, segment>::const_iterator it) const {
    auto next = std::next(it);
    return next == segs_.end() ? size_ : next->first;
  }

  void split(std::size_t at) {
    if (at == 0 || at >= size_) return;
    auto it = segs_.upper_bound(at);
    --it;
    if (it->first == at) return;
    segs_.emplace_hint(std::next(it), at, it->second);
  }

  std::size_t size_;
  std::map<std::size_t, segment> segs_;
};

} // namespace pipeswap::mock::detail
