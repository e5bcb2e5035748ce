// pipeswap — swap slots (logical optimizer state tensors) and update units (one parameter's update).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/dtype.hpp>
#include <pipeswap/core/pinned_pool.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/error.hpp>

namespace pipeswap {

/// The logical optimizer states a slot can hold (Adam/AdamW, plus the fp32 master of a low-precision
/// parameter).
enum class state_key : std::uint8_t { exp_avg, exp_avg_sq, max_exp_avg_sq, master_param };

inline constexpr std::array<state_key, 4> supported_state_keys{
    state_key::exp_avg, state_key::exp_avg_sq, state_key::max_exp_avg_sq, state_key::master_param};

constexpr std::string_view name_of(state_key k) noexcept {
  switch (k) {
  case state_key::exp_avg: return "exp_avg";
  case state_key::exp_avg_sq: return "exp_avg_sq";
  case state_key::max_exp_avg_sq: return "max_exp_avg_sq";
  case state_key::master_param: return "master_param";
  }
  return "?";
}

constexpr std::optional<state_key> parse_state_key(std::string_view s) noexcept {
  for (auto k : supported_state_keys) {
    if (name_of(k) == s) return k;
  }
  return std::nullopt;
}

/// Validates user-given state key names, keeping their order. Unknown names are rejected with the
/// reference implementation's message (invalid names sorted).
inline std::vector<state_key> validate_state_keys(std::span<std::string const> names) {
  std::vector<std::string> invalid;
  std::vector<state_key> keys;
  for (auto const& n : names) {
    if (auto k = parse_state_key(n)) {
      if (std::find(keys.begin(), keys.end(), *k) == keys.end()) keys.push_back(*k);
    } else if (std::find(invalid.begin(), invalid.end(), n) == invalid.end()) {
      invalid.push_back(n);
    }
  }
  if (!invalid.empty()) {
    std::sort(invalid.begin(), invalid.end());
    std::string got = "[";
    for (std::size_t i = 0; i < invalid.size(); ++i) got += (i ? ", '" : "'") + invalid[i] + "'";
    throw invalid_argument(
        "SwapOptimizerConfig.state_keys only supports Adam/AdamW logical slots ('exp_avg', "
        "'exp_avg_sq', 'max_exp_avg_sq', 'master_param'), but got " + got + "].");
  }
  return keys;
}

/// How a slot's initial contents are produced.
enum class slot_init : std::uint8_t {
  zeros,      ///< all-zero bytes (moments)
  from_param, ///< written on the device by the optimizer (an fp32 master copy of the parameter)
};

/// One logical optimizer state tensor of one parameter.
///
/// Its bytes are tiled by pieces (usually one; several when a partition splits the parameter across
/// batches); each piece is a swap_buffer that moves through the life cycle on its own. All pieces of
/// a swappable slot view one host mirror: a pool block owned by the slot, or a range of the packed
/// host arena. A slot that is not swappable keeps one piece on the device for good.
template <backend B>
struct swap_slot {
  std::size_t param = 0; ///< index of the parameter in its optimizer
  state_key key = state_key::exp_avg;
  dtype type = dtype::f32;
  std::size_t numel = 0;
  slot_init init = slot_init::zeros;
  bool swappable = true;

  pinned_block mirror;      ///< whole host mirror (null while the slot never left the device)
  bool owns_mirror = false; ///< a pool block (else a view of the packed host arena)
  bool packed = false;      ///< moves through the packed pipeline
  std::size_t host_offset = 0; ///< byte offset in the packed host arena of its dtype

  std::vector<swap_buffer<B>> pieces;
  std::vector<std::size_t> piece_begin; ///< first element of each piece, ascending, starts at 0
  /// Bumped whenever `pieces` is rebuilt (their addresses change): plans that point at pieces are
  /// rebuilt then.
  std::uint32_t layout = 0;

  [[nodiscard]] std::size_t bytes() const noexcept { return numel * size_of(type); }
  [[nodiscard]] std::size_t element_bytes() const noexcept { return size_of(type); }
  [[nodiscard]] std::string name() const {
    return std::to_string(param) + "." + std::string(name_of(key));
  }

  /// Index of the piece holding element `e`.
  [[nodiscard]] std::size_t piece_of(std::size_t e) const {
    auto it = std::upper_bound(piece_begin.begin(), piece_begin.end(), e);
    return static_cast<std::size_t>(it - piece_begin.begin()) - 1;
  }

  /// Device address of element `e`; its piece must be on the device.
  [[nodiscard]] device_pointer_t<B> device_at(std::size_t e) const {
    if (pieces.empty()) throw state_error("swap slot '" + name() + "' has no storage");
    auto const i = piece_of(e);
    auto const& p = pieces[i];
    if (p.state != residency::device || (!p.device && p.bytes != 0)) {
      throw state_error("swap slot '" + name() + "' is " + std::string(to_string(p.state)) +
                        " at element " + std::to_string(e) + ", not on the device");
    }
    return p.device + (e - piece_begin[i]) * element_bytes();
  }

  /// True when every piece is in `r`.
  [[nodiscard]] bool all(residency r) const noexcept {
    return std::all_of(pieces.begin(), pieces.end(), [r](auto const& p) { return p.state == r; });
  }
};

/// One parameter's share of a step: its index in the optimizer, its size, its state slots.
template <backend B>
struct update_unit {
  std::size_t param = 0;
  std::size_t numel = 0;
  std::vector<swap_slot<B>*> slots;
};

/// Elements [begin, end) of the unit at index `unit` in the step's unit list. A batch is a list of
/// ranges; unsplit partitions use whole units.
struct unit_range {
  std::size_t unit = 0;
  std::size_t begin = 0;
  std::size_t end = 0;
  friend constexpr bool operator==(unit_range, unit_range) = default;
};

} // namespace pipeswap
