// pipeswap — what an optimizer describes, and the state it keeps across runtimes.
//
//   state_key, slot_init     the logical states a slot can hold and how they start
//   slot_desc                one logical state tensor of one parameter (the optimizer's description)
//   update_unit, unit_range  one parameter's share of a step (by slot index), an element range of it
//   state_view<B>            what update() reads slot bytes through: the runtime's current placement
//   optimizer_state<B>       the optimizer's state while no runtime manages it, and the lock that
//                            admits one runtime at a time (each optimizer owns one)
//
// The optimizer describes; the runtime (optimizer_swap) owns pieces, mirrors and layout while it
// lives, and hands the state back into optimizer_state when it is destroyed, so the next runtime over
// the same optimizer continues from the same bytes. Nothing here depends on the swap runtime.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/detail/function_ref.hpp>
#include <pipeswap/core/detail/lean_vector.hpp>
#include <pipeswap/core/dtype.hpp>
#include <pipeswap/detail/message.hpp>
#include <pipeswap/error.hpp>

namespace pipeswap {

/// The logical optimizer states a slot can hold (Adam/AdamW, plus the fp32 master of a low-precision
/// parameter).
enum class state_key : std::uint8_t { exp_avg, exp_avg_sq, max_exp_avg_sq, master_param };

inline constexpr std::array<state_key, 4> supported_state_keys{state_key::exp_avg, state_key::exp_avg_sq,
                                                               state_key::max_exp_avg_sq, state_key::master_param};

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

/// Validates user-given state key names, keeping their order. Unknown names are rejected (invalid
/// names sorted, as hyper-parallel does); a name given twice is rejected too.
inline std::vector<state_key> validate_state_keys(std::span<std::string const> names) {
  std::vector<std::string> invalid;
  std::vector<state_key> keys;
  for (auto const& n : names) {
    if (auto k = parse_state_key(n)) {
      for (auto const seen : keys) {
        if (seen == *k) {
          throw invalid_argument(
              detail::message({"swap_config::state_keys names '", n, "' twice; give each state key once"}));
        }
      }
      keys.push_back(*k);
      continue;
    }
    // A new invalid name goes where it sorts: the list stays sorted and without repeats (an insertion,
    // not std::sort: every TU that includes this header would instantiate it; docs/compile-times.md).
    auto i = invalid.size();
    while (i > 0 && n < invalid[i - 1]) --i;
    if (i > 0 && invalid[i - 1] == n) continue;
    invalid.push_back(n);
    for (auto j = invalid.size() - 1; j > i; --j) invalid[j].swap(invalid[j - 1]);
  }
  if (!invalid.empty()) {
    std::string what = "swap_config::state_keys only supports Adam/AdamW logical slots ('exp_avg', 'exp_avg_sq', "
                       "'max_exp_avg_sq', 'master_param'), but got [";
    for (std::size_t i = 0; i < invalid.size(); ++i) detail::append(what, {i ? ", '" : "'", invalid[i], "'"});
    what += "].";
    throw invalid_argument(what);
  }
  return keys;
}

/// How a slot's initial contents are produced.
enum class slot_init : std::uint8_t {
  zeros,      ///< all-zero bytes (moments)
  from_param, ///< written on the device by the optimizer's initialize() (an fp32 master copy)
};

/// One logical optimizer state tensor of one parameter, as the optimizer describes it.
struct slot_desc {
  std::size_t param = 0; ///< index of the parameter in its optimizer
  state_key key = state_key::exp_avg;
  dtype type = dtype::f32;
  std::size_t numel = 0;
  slot_init init = slot_init::zeros;

  [[nodiscard]] std::size_t bytes() const noexcept { return numel * size_of(type); }
  [[nodiscard]] std::size_t element_bytes() const noexcept { return size_of(type); }
  [[nodiscard]] std::string name() const { return detail::message({param, ".", name_of(key)}); }
  friend bool operator==(slot_desc const&, slot_desc const&) = default;
};

/// One parameter's share of a step: its index in the optimizer, its size, and its state slots as
/// indices into the optimizer's slots().
struct update_unit {
  std::size_t param = 0;
  std::size_t numel = 0;
  std::vector<std::size_t> slots;
};

/// Elements [begin, end) of the unit at index `unit` in the step's unit list. A batch is a list of
/// ranges; unsplit partitions use whole units.
struct unit_range {
  std::size_t unit = 0;
  std::size_t begin = 0;
  std::size_t end = 0;
  friend constexpr bool operator==(unit_range, unit_range) = default;
};

/// The device placement of the slots during update(): device_at(slot, e) is the device address of
/// element e of slot `slot` (an index into slots()). Addresses change between batches and steps;
/// read them inside update() only. Throws state_error when the piece holding e is not on the device.
template <backend B>
class state_view {
public:
  /// device_at(slot, element) calls `resolve`, which must outlive the view.
  using resolve_fn = detail::function_ref<device_pointer_t<B>(std::size_t slot, std::size_t element)>;
  explicit state_view(resolve_fn resolve) noexcept : resolve_(resolve) {}
  [[nodiscard]] device_pointer_t<B> device_at(std::size_t slot, std::size_t element) const {
    return resolve_(slot, element);
  }

private:
  resolve_fn resolve_;
};

namespace detail {
/// Number of dtype enumerators (dtype::u8 is the last): the size of tables indexed by dtype.
inline constexpr std::size_t dtype_count = static_cast<std::size_t>(dtype::u8) + 1;
/// Access to optimizer_state's records, for the swap runtime only.
struct runtime_access {
  explicit runtime_access() = default;
};
} // namespace detail

/// An optimizer's state while no runtime manages it, and the lock that admits one runtime at a time.
///
/// An optimizer owns one (the Optimizer concept's swap_state()). optimizer_swap attaches on
/// construction (a second live runtime is refused), adopts what a previous runtime handed back, and on
/// destruction hands the state back: swapped slots stay in this object's pinned host stores, device-
/// unswappable slots keep their device storage here. The next runtime adopts both, whatever its
/// configuration, so rebuilding a runtime (other swap_times, packed or not, state_keys) loses nothing.
/// The destructor releases what is held (device storage on the backend's current stream). It must be
/// destroyed after every runtime over it and before its backend.
template <backend B>
class optimizer_state {
public:
  /// Where a slot's bytes are while parked.
  enum class where : std::uint8_t {
    none,   ///< never materialized: the next runtime initializes it (slot_init)
    host,   ///< in the host store of `host_type` at `host_offset`
    device, ///< in `device` (unswappable storage handed over by a runtime)
  };
  struct record {
    where at = where::none;
    dtype host_type = dtype::f32;
    std::size_t host_offset = 0;
    device_pointer_t<B> device{};
    std::size_t bytes = 0;
  };
  /// The pinned host memory that holds the parked swapped slots of one dtype.
  struct host_store {
    std::byte* ptr = nullptr;
    std::size_t bytes = 0; ///< 0: no store for that dtype
  };
  /// One host store per dtype, indexed by the dtype's value.
  using host_stores_type = std::array<host_store, detail::dtype_count>;

  explicit optimizer_state(B& b) noexcept : b_(b) {}
  optimizer_state(optimizer_state const&) = delete;
  optimizer_state& operator=(optimizer_state const&) = delete;
  ~optimizer_state() { release(); }

  /// True while a runtime manages this state.
  [[nodiscard]] bool attached() const noexcept { return attached_; }
  /// True when a runtime could not hand its state back (its backend failed while it was destroyed):
  /// the values are gone, and building a new runtime is refused.
  [[nodiscard]] bool lost() const noexcept { return lost_; }
  /// Throws state_error naming `who` while a runtime is attached: the slots a runtime manages cannot
  /// change under it.
  void require_detached(std::string_view who) const {
    if (attached_) {
      throw state_error(detail::message({who, ": an optimizer_swap runtime manages this optimizer's state; destroy "
                                              "the runtime first, make the change, and build a new runtime (the state "
                                              "carries over)"}));
    }
  }
  /// Bytes of the pinned host stores held (swapped state at rest).
  [[nodiscard]] std::size_t host_bytes() const noexcept {
    std::size_t n = 0;
    for (auto const& a : stores_) n += a.bytes;
    return n;
  }

  // ----- the runtime's side ------------------------------------------------------------------------
  [[nodiscard]] B& backend(detail::runtime_access) const noexcept { return b_; }
  detail::lean_vector<record>& records(detail::runtime_access) noexcept { return records_; }
  host_stores_type& host_stores(detail::runtime_access) noexcept { return stores_; }
  void set_attached(detail::runtime_access, bool a) noexcept { attached_ = a; }
  void set_lost(detail::runtime_access) noexcept { lost_ = true; }

private:
  void release() noexcept {
    try {
      auto const s = b_.current_stream();
      for (auto& r : records_) {
        if (r.at == where::device && r.device) b_.deallocate_device(r.device, r.bytes, s);
        r = {};
      }
      for (auto& a : stores_) {
        if (a.ptr) b_.deallocate_host(a.ptr, a.bytes);
        a = {};
      }
    } catch (...) { // a destructor never throws; what could not be released stays with the backend
    }
  }

  B& b_;
  detail::lean_vector<record> records_;
  host_stores_type stores_{};
  bool attached_ = false;
  bool lost_ = false;
};

} // namespace pipeswap
