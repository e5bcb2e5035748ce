// pipeswap — a map from chunk (stage, micro) to a small value, for the linear passes over orders.
//
// Pipeline orders use a dense box of stages x micro-batches, so most tables are plain arrays indexed
// by `stage * micros + micro`, sized from the order itself; when the box is much larger than the order
// (sparse or huge indices from user input) the table falls back to a hash map. Either way every
// operation is O(1) (expected for the hash map) and the table is O(n) in size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include <pipeswap/schedule/step.hpp>

namespace pipeswap::schedule::detail {

/// The box of non-negative chunk keys a pass will use, and how many keys it expects.
struct chunk_box {
  index_type stages = 0; // one past the largest stage
  index_type micros = 0; // one past the largest micro-batch
  std::size_t keys = 0;

  void add(index_type stage, index_type micro) noexcept {
    ++keys;
    if (stage >= stages) stages = stage + 1;
    if (micro >= micros) micros = micro + 1;
  }
};

template <class T>
class chunk_table {
public:
  /// A table whose absent entries read as `empty`.
  chunk_table(chunk_box box, T empty) : empty_(empty) {
    std::uint64_t const cells = std::uint64_t(box.stages) * std::uint64_t(box.micros);
    if (cells <= 4 * std::uint64_t(box.keys) + 1024) {
      micros_ = box.micros;
      stages_ = box.stages;
      dense_.assign(std::size_t(cells), empty);
    } else {
      sparse_.reserve(box.keys);
    }
  }

  /// The entry for `c`, created as `empty` if absent.
  T& operator[](chunk c) {
    if (in_box(c)) return dense_[index(c)];
    return sparse_.try_emplace(c, empty_).first->second;
  }

  /// The entry for `c`, or `empty`.
  T get(chunk c) const {
    if (in_box(c)) return dense_[index(c)];
    auto const it = sparse_.find(c);
    return it == sparse_.end() ? empty_ : it->second;
  }

private:
  bool in_box(chunk c) const noexcept { return c.stage >= 0 && c.micro >= 0 && c.stage < stages_ && c.micro < micros_; }
  std::size_t index(chunk c) const noexcept {
    return std::size_t(c.stage) * std::size_t(micros_) + std::size_t(c.micro);
  }

  T empty_;
  index_type stages_ = 0;
  index_type micros_ = 0;
  std::vector<T> dense_;
  std::unordered_map<chunk, T, chunk_hash> sparse_;
};

} // namespace pipeswap::schedule::detail
