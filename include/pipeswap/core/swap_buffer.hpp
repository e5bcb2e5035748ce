// pipeswap — one swappable piece of device memory, and where its bytes are.
//
// A swap_buffer moves through the life cycle device → d2h → host → h2d → device (core/transfer.hpp);
// only the transfer_engine changes it (its arena copies through core/detail/arena_copy.hpp), and
// everyone else reads it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/budget.hpp>
#include <pipeswap/core/event_handle.hpp>

namespace pipeswap {

/// Where a swap_buffer's bytes are.
enum class residency : std::uint8_t {
  device, ///< on the device; no copy in flight
  d2h,    ///< offload in flight; device storage already released behind the copy (stream-ordered)
  host,   ///< in the host mirror; no device storage
  h2d,    ///< load in flight into device storage
  empty,  ///< no storage yet: no device storage, no bytes of its own in a mirror (a new buffer, or one
          ///< whose storage take_device() took, or discarded without a mirror); the engine treats
          ///< it as `host` (a load needs a mirror first: set_mirror() makes it `host`)
};

/// Not on the device and no copy in flight: `host` or `empty`.
constexpr bool off_device(residency r) noexcept { return r == residency::host || r == residency::empty; }

constexpr std::string_view to_string(residency r) noexcept {
  switch (r) {
  case residency::device: return "device";
  case residency::d2h: return "d2h";
  case residency::host: return "host";
  case residency::h2d: return "h2d";
  case residency::empty: return "empty";
  }
  return "?";
}

template <backend B>
class transfer_engine;
namespace detail {
template <backend B>
struct arena_copy;
} // namespace detail

/// One swappable piece of device memory and its host mirror. Read-only outside the engine.
///
/// Invariants (kept by transfer_engine): device: `device()` set (or bytes 0), no event. d2h: no
/// device storage of its own, `event()` completes the D2H into the mirror. host: no device storage;
/// `event()` is the D2H that filled the mirror until the host synchronized with it or it was reloaded.
/// h2d: `device()` set, `event()` completes the H2D. empty: no device storage.
template <backend B>
class swap_buffer {
public:
  swap_buffer() = default;
  /// A buffer of `bytes` with no storage yet (empty: no device storage, no mirror).
  explicit swap_buffer(std::size_t bytes) noexcept : bytes_(bytes) {}
  swap_buffer(swap_buffer&&) noexcept = default;
  swap_buffer& operator=(swap_buffer&&) noexcept = default;
  swap_buffer(swap_buffer const&) = delete;
  swap_buffer& operator=(swap_buffer const&) = delete;

  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  [[nodiscard]] device_pointer_t<B> device() const noexcept { return device_; }
  /// Host bytes: a pool block when owns_mirror(), else a view into memory owned elsewhere.
  [[nodiscard]] std::byte* mirror() const noexcept { return mirror_; }
  [[nodiscard]] bool owns_mirror() const noexcept { return owns_mirror_; }
  [[nodiscard]] residency state() const noexcept { return state_; }
  [[nodiscard]] event_handle<B> const& event() const noexcept { return event_; }
  /// At rest: no copy in flight (device or host).
  [[nodiscard]] bool at_rest() const noexcept { return state_ == residency::device || off_device(state_); }
  /// The budget client its storage is counted for.
  [[nodiscard]] budget_client client() const noexcept { return client_; }
  /// Whether its current device storage is reserved in the engine's budget.
  [[nodiscard]] bool reserved() const noexcept { return reserved_; }

private:
  friend class transfer_engine<B>;
  friend struct detail::arena_copy<B>; // the engine's arena copies
  std::size_t bytes_ = 0;
  bool reserved_ = false;
  budget_client client_ = budget_client::optimizer;
  device_pointer_t<B> device_{};
  std::byte* mirror_ = nullptr;
  bool owns_mirror_ = false;
  residency state_ = residency::empty;
  event_handle<B> event_;
};

/// Storage policy: every buffer owns its device storage between a load and the next offload.
struct per_buffer_storage {};

} // namespace pipeswap
