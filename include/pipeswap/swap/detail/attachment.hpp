// pipeswap — how the optimizer-swap runtime takes over an optimizer's state and hands it back.
//
// The state belongs to the optimizer (its optimizer_state): while no runtime manages it, each slot
// is parked on the host (in the host store of its dtype), on the device, or not materialized yet. A
// runtime adopts it slot by slot into its own storage: swappable slots get a host mirror in one
// exact-size host store per dtype and live there between steps, the others keep one piece of device
// storage. Parked bytes move where the new settings want them (host to device or back), and what was
// never materialized is created (zeros on the host, or initialized on the device and offloaded).
// Either everything is adopted, or nothing of the parked state changes. On hand-back every slot is
// parked again, so a runtime with other settings continues from the same bytes. Depends on the
// backend only, not on the optimizer.
#pragma once

#include <array>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/detail/lean_vector.hpp>
#include <pipeswap/core/event_handle.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/detail/function_ref.hpp>
#include <pipeswap/detail/message.hpp>
#include <pipeswap/detail/view.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/optim/state.hpp>
#include <pipeswap/swap/slot.hpp>

namespace pipeswap::detail {

template <backend B>
class attachment {
public:
  using buffer = swap_buffer<B>;
  using slot_type = slot_storage<B>;

  /// Which slots are swapped: at least min_swap_numel elements, a key whose bit is set in key_mask.
  struct eligibility {
    std::size_t min_swap_numel = 0;
    unsigned key_mask = 0; ///< bit k: state_key k is eligible
    [[nodiscard]] bool admits(slot_desc const& s) const noexcept {
      return s.numel > 0 && s.numel >= min_swap_numel && (key_mask >> static_cast<unsigned>(s.key) & 1u) != 0;
    }
  };

  /// Writes the initial value of slot i into device memory (the optimizer's initialize()).
  using initializer = function_ref<void(std::size_t, device_pointer_t<B>)>;

  explicit attachment(transfer_engine<B>& engine) : engine_(engine), b_(engine.backend()) {}

  [[nodiscard]] lean_vector<slot_type>& slots() noexcept { return slots_; }
  [[nodiscard]] lean_vector<slot_type> const& slots() const noexcept { return slots_; }
  /// Device bytes of state that never leaves the device.
  [[nodiscard]] std::size_t unswappable_bytes() const noexcept { return unswappable_bytes_; }
  /// Bytes of state that is swapped.
  [[nodiscard]] std::size_t swappable_bytes() const noexcept { return swappable_bytes_; }

  /// Slot i (an index into the optimizer's slots()).
  [[nodiscard]] slot_type const& slot(std::size_t i) const {
    if (i >= slots_.size()) {
      throw invalid_argument(
          message({"optimizer_swap: slot index ", i, " is out of range (", slots_.size(), " slots)"}));
    }
    return slots_[i];
  }
  /// The host mirror of swappable slot i.
  [[nodiscard]] std::span<std::byte> host_mirror(std::size_t i, std::span<slot_desc const> descs) const {
    auto const& s = slot(i);
    if (!s.swappable) {
      throw state_error(
          message({"optimizer_swap: slot '", descs[i].name(), "' is not swapped and has no host mirror"}));
    }
    return {s.mirror, s.bytes()};
  }
  /// The device storage of non-swappable slot i.
  [[nodiscard]] device_pointer_t<B> unswappable_device(std::size_t i, std::span<slot_desc const> descs) const {
    auto const& s = slot(i);
    if (s.swappable) {
      throw state_error(
          message({"optimizer_swap: slot '", descs[i].name(), "' is swapped and has no fixed device storage"}));
    }
    return s.pieces.at(0).device();
  }
  /// The device address of element e of slot i, which must be on the device (the update's views).
  /// Called once per slot and batch: an unsplit slot on the device is answered inline, anything else
  /// (a split slot, an error) by device_address_of.
  [[nodiscard]] device_pointer_t<B> device_address(std::size_t i, std::size_t e,
                                                   std::span<slot_desc const> descs) const {
    if (i < slots_.size()) {
      auto const& s = slots_[i];
      if (s.piece_begin.size() == 1) {
        auto const& p = s.pieces[0];
        if (p.state() == residency::device && (p.device() || p.bytes() == 0)) return p.device() + e * s.element_bytes;
      }
    }
    return device_address_of(i, e, descs);
  }
  /// True when no copy of any piece is in flight.
  [[nodiscard]] bool at_rest() const noexcept {
    for (auto const& s : slots_) {
      for (auto const& p : s.pieces) {
        if (!p.at_rest()) return false;
      }
    }
    return true;
  }

  /// Builds the runtime's storage from the optimizer's descriptions and what an earlier runtime
  /// handed back. Either everything is adopted or nothing of the parked state changes.
  void adopt(optimizer_state<B>& home, std::span<slot_desc const> descs, eligibility rule, initializer init) {
    using rec_t = typename optimizer_state<B>::record;
    using where = typename optimizer_state<B>::where;
    auto& recs = home.records(runtime_access{});
    using stores_t = typename optimizer_state<B>::host_stores_type;
    auto& old_stores = home.host_stores(runtime_access{});
    if (recs.size() > descs.size()) {
      throw state_error(message({"optimizer_swap: the optimizer describes ", descs.size(),
                                 " slots but its parked state holds ", recs.size()}));
    }
    lean_vector<rec_t> parked(recs.begin(), recs.end());
    parked.resize(descs.size());
    for (std::size_t i = 0; i < descs.size(); ++i) {
      if (parked[i].at != where::none && parked[i].bytes != descs[i].bytes()) {
        throw state_error(message({"optimizer_swap: slot ", descs[i].name(), " has ", descs[i].bytes(),
                                   " bytes but its parked state ", parked[i].bytes}));
      }
    }
    // The host layout: one host store per dtype (indexed by its value), eligible slots in order.
    // An eligible slot has bytes, so a dtype has a store exactly when its size is positive.
    std::array<std::size_t, dtype_count> sizes{};
    lean_vector<std::size_t> offset(descs.size(), 0);
    for (std::size_t i = 0; i < descs.size(); ++i) {
      if (!rule.admits(descs[i])) continue;
      auto const t = static_cast<std::size_t>(descs[i].type);
      offset[i] = sizes[t];
      sizes[t] += descs[i].bytes();
    }
    bool reuse = true;
    for (std::size_t t = 0; t < sizes.size(); ++t) reuse = reuse && old_stores[t].bytes == sizes[t];
    for (std::size_t i = 0; i < descs.size() && reuse; ++i) {
      if (parked[i].at != where::host) continue;
      reuse = rule.admits(descs[i]) && parked[i].host_type == descs[i].type && parked[i].host_offset == offset[i];
    }
    auto const bytes_ok = holds_bytes(b_);
    stores_t stores{};
    lean_vector<std::size_t> adopted;     // slots whose parked device storage is now their piece
    lean_vector<std::size_t> copied_back; // slots whose parked device bytes went to the host
    try {
      if (reuse) {
        stores = old_stores;
      } else {
        for (std::size_t t = 0; t < sizes.size(); ++t) {
          if (sizes[t]) stores[t] = {b_.allocate_host(sizes[t]), sizes[t]};
        }
      }
      slots_.clear();
      slots_.reserve(descs.size());
      lean_vector<buffer*> cold;           // device-initialized swappable pieces to offload
      lean_vector<host_copy<B>> to_host;   // parked device bytes of now-swappable slots
      lean_vector<host_copy<B>> to_device; // parked host bytes of now-unswappable slots
      for (std::size_t i = 0; i < descs.size(); ++i) {
        auto const& d = descs[i];
        auto const& r = parked[i];
        auto& s = slots_.emplace_back();
        s.swappable = rule.admits(d);
        s.element_bytes = d.element_bytes();
        s.numel = d.numel;
        s.pieces.emplace_back(d.bytes());
        s.piece_begin.assign(1, 0);
        auto& p = s.pieces[0];
        std::byte* const old_host =
            r.at == where::host ? old_stores[static_cast<std::size_t>(r.host_type)].ptr + r.host_offset : nullptr;
        if (s.swappable) {
          swappable_bytes_ += d.bytes();
          s.mirror = stores[static_cast<std::size_t>(d.type)].ptr + offset[i];
          engine_.set_mirror(p, s.mirror);
          if (r.at == where::host) {
            if (!reuse && bytes_ok && d.bytes()) {
              note_host_read(b_, old_host, d.bytes());
              note_host_write(b_, s.mirror, d.bytes());
              std::memcpy(s.mirror, old_host, d.bytes());
            }
          } else if (r.at == where::device) {
            to_host.push_back({s.mirror, r.device, d.bytes()});
            copied_back.push_back(i);
          } else if (d.init == slot_init::zeros) {
            fill_zero(s.mirror, d.bytes());
          } else {
            engine_.allocate(p, engine_.compute());
            init(i, p.device());
            cold.push_back(&p);
          }
        } else {
          unswappable_bytes_ += d.bytes();
          if (r.at == where::device) {
            engine_.adopt_device(p, r.device);
            adopted.push_back(i);
          } else if (r.at == where::host) {
            auto const fresh = engine_.allocate_device(d.bytes());
            try {
              engine_.adopt_device(p, fresh);
            } catch (...) {
              engine_.deallocate_device(fresh, d.bytes());
              throw;
            }
            to_device.push_back({old_host, fresh, d.bytes()});
          } else if (d.init == slot_init::zeros) {
            zero_on_device(p);
          } else {
            engine_.allocate(p, engine_.compute());
            init(i, p.device());
          }
        }
      }
      event_handle<B> in_flight;
      engine_.copy_to_host(detail::view(to_host), in_flight, "adopt parked state");
      if (!to_device.empty()) {
        engine_.copy_to_device(detail::view(to_device), in_flight, "adopt parked state");
        b_.synchronize(*in_flight); // the old host stores are freed below
      }
      // Cold states leave the device before the first forward (as hyper-parallel's offload_initial_slots does).
      engine_.launch_offload(detail::view(cold), "offload initial");
      engine_.wait_offload(detail::view(cold), engine_.compute());
    } catch (...) {
      rollback(adopted, reuse ? stores_t{} : stores);
      throw;
    }
    // Commit: nothing below throws on a conforming backend.
    auto const cs = engine_.compute();
    try {
      for (auto i : copied_back) b_.deallocate_device(parked[i].device, parked[i].bytes, cs);
      if (!reuse) {
        for (auto& a : old_stores) {
          if (a.ptr) b_.deallocate_host(a.ptr, a.bytes);
        }
      }
    } catch (...) { // left with the backend; the state itself is adopted
    }
    old_stores = stores;
    recs.assign(descs.size(), rec_t{});
  }

  /// Parks every slot in `home` again (the success path of a hand-back): transfers settle, swapped
  /// slots' mirrors are synchronized and recorded in their host store, the others keep their device
  /// storage. The slots are gone afterwards.
  void park(optimizer_state<B>& home, std::span<slot_desc const> descs) {
    using where = typename optimizer_state<B>::where;
    auto& recs = home.records(runtime_access{});
    auto all = pieces_of(slots_, false);
    engine_.settle(detail::view(all));
    auto swapped = pieces_of(slots_, true);
    engine_.synchronize_to_host(detail::view(swapped), "hand back");
    auto& stores = home.host_stores(runtime_access{});
    recs.assign(slots_.size(), {});
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      auto& s = slots_[i];
      auto& r = recs[i];
      r.bytes = s.bytes();
      if (s.swappable) {
        r.at = where::host;
        r.host_type = descs[i].type;
        r.host_offset = static_cast<std::size_t>(s.mirror - stores[static_cast<std::size_t>(descs[i].type)].ptr);
      } else {
        r.at = where::device;
        r.device = engine_.take_device(s.pieces.at(0));
      }
    }
    slots_.clear();
  }

  /// A hand-back that failed: transfers settle and every piece's device storage is released.
  void discard() {
    auto all = pieces_of(slots_, false);
    engine_.settle(detail::view(all));
    for (auto& s : slots_) {
      for (auto& p : s.pieces) engine_.discard_device(p, engine_.compute());
    }
  }

  /// Drops the slots and every parked record (the state is lost).
  void forget(optimizer_state<B>& home) noexcept {
    slots_.clear();
    auto& recs = home.records(runtime_access{});
    recs.assign(recs.size(), {});
  }

private:
  /// device_address() for a split slot, or the error that names why slot i has no address.
  [[nodiscard]] device_pointer_t<B> device_address_of(std::size_t i, std::size_t e,
                                                      std::span<slot_desc const> descs) const {
    auto const& s = slot(i);
    if (s.pieces.empty()) throw state_error(message({"optimizer_swap: slot '", descs[i].name(), "' has no storage"}));
    auto const k = s.piece_of(e);
    auto const& p = s.pieces[k];
    if (p.state() != residency::device || (!p.device() && p.bytes() != 0)) {
      throw state_error(message({"optimizer_swap: slot '", descs[i].name(), "' is ", to_string(p.state()),
                                 " at element ", e, ", not on the device"}));
    }
    return p.device() + (e - s.piece_begin[k]) * s.element_bytes;
  }

  /// Undoes a failed adopt(): new storage is released, parked device storage is left where it was.
  void rollback(lean_vector<std::size_t> const& adopted,
                typename optimizer_state<B>::host_stores_type const& fresh_stores) noexcept {
    try {
      auto all = pieces_of(slots_, false);
      engine_.settle(detail::view(all));
      engine_.host_sync(detail::view(all));
      for (std::size_t i = 0; i < slots_.size(); ++i) {
        bool parked = false;
        for (auto a : adopted) parked = parked || a == i;
        for (auto& p : slots_[i].pieces) {
          if (parked && p.state() == residency::device) {
            (void)engine_.take_device(p); // parked storage: stays with the optimizer's state
          } else {
            engine_.discard_device(p, engine_.compute());
          }
        }
      }
      slots_.clear();
      for (auto const& a : fresh_stores) {
        if (a.ptr) b_.deallocate_host(a.ptr, a.bytes);
      }
    } catch (...) { // what could not be released stays with the backend
    }
    unswappable_bytes_ = swappable_bytes_ = 0;
  }

  void fill_zero(std::byte* p, std::size_t n) {
    if (n == 0 || !holds_bytes(b_)) return;
    note_host_write(b_, p, n);
    std::memset(p, 0, n);
  }

  /// A non-swappable zero state: device storage filled from a zeroed pinned block.
  void zero_on_device(buffer& p) {
    if (p.bytes() == 0) {
      engine_.adopt_device(p, {});
      return;
    }
    auto blk = engine_.pool().allocate_for_host(p.bytes());
    fill_zero(blk.ptr, blk.bytes);
    buffer tmp(p.bytes());
    engine_.set_mirror(tmp, blk.ptr);
    buffer* one[] = {&tmp};
    event_handle<B> used;
    try {
      engine_.launch_load(one, "zero state");
      used = tmp.event();
      engine_.wait_load(one, engine_.compute());
      engine_.adopt_device(p, engine_.take_device(tmp));
    } catch (...) {
      engine_.pool().deallocate(blk, used);
      if (tmp.state() == residency::device) engine_.discard_device(tmp, engine_.compute());
      throw;
    }
    engine_.pool().deallocate(blk, used);
  }

  transfer_engine<B>& engine_;
  B& b_;
  lean_vector<slot_type> slots_;
  std::size_t unswappable_bytes_ = 0, swappable_bytes_ = 0;
};

} // namespace pipeswap::detail
