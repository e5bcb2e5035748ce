// pipeswap — the plan of an optimizer step: its batches, the pieces each moves, their staging layout.
//
// A step's update units are partitioned into batches (by the runtime's partition policy); each
// swappable slot is cut into pieces along the batch boundaries that cross it (recut: bookkeeping over
// its host mirror), and every batch lists the unique pieces it moves. A plan is immutable once built
// and shared by every step whose units, their sizes and the slots' piece layout are the same, so a
// steady training loop plans once. Everything here depends on the backend only, not the optimizer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <utility>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/detail/lean_vector.hpp>
#include <pipeswap/core/transfer.hpp>
#include <pipeswap/detail/counted_ref.hpp>
#include <pipeswap/detail/message.hpp>
#include <pipeswap/detail/view.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/optim/state.hpp>
#include <pipeswap/swap/partition.hpp>
#include <pipeswap/swap/detail/step_trace.hpp>
#include <pipeswap/swap/slot.hpp>
#include <pipeswap/swap/swap_config.hpp>

namespace pipeswap::detail {

template <backend B>
struct step_plan {
  using buffer = swap_buffer<B>;

  batch_plan plan;
  lean_vector<buffer*> pieces;          // unique swappable pieces, batch after batch
  lean_vector<std::size_t> batch_begin; // batch n's pieces: [batch_begin[n], batch_begin[n + 1])
  lean_vector<staging_layout> staging;  // per batch (packed pipeline only)
  lean_vector<std::size_t> first_param; // per batch, the lowest and highest parameter (messages)
  lean_vector<std::size_t> last_param;
  std::size_t arena_size = 0;
  std::size_t max_batch_bytes = 0;
  lean_vector<std::size_t> batch_bytes; // per batch: its pieces' bytes
  std::size_t resident = 0;             // batches of the resident share (from the front)
  std::size_t resident_share_bytes = 0; // their device bytes (own arenas, packed)

  [[nodiscard]] std::size_t size() const noexcept { return plan.size(); }
  /// The unique swappable pieces of batch n.
  [[nodiscard]] std::span<buffer* const> batch(std::size_t n) const {
    return detail::view(pieces).subspan(batch_begin[n], batch_begin[n + 1] - batch_begin[n]);
  }
  /// Device bytes batch n occupies in its own storage.
  [[nodiscard]] std::size_t own_bytes(std::size_t n, bool packed) const {
    return packed ? staging[n].bytes : batch_bytes[n];
  }
};

/// Shared ownership of an immutable step plan: the last one is held by the planner, and a step in
/// progress, the staging arenas and the batches kept between steps hold the plan they belong to,
/// which may be an older one.
template <backend B>
using plan_ref = counted_ref<step_plan<B>>;

/// What a plan depends on: the partition's items (elements and swapped bytes per element of each
/// unit), the units' parameters, and the sum of the slots' layout versions.
struct plan_key {
  lean_vector<partition_item> items;
  lean_vector<std::size_t> params;
  std::uint64_t layout = 0;
};

/// Builds plans and keeps the last one.
template <backend B>
class step_planner {
public:
  using buffer = swap_buffer<B>;
  using slot_type = slot_storage<B>;
  using plan_ptr = plan_ref<B>;

  /// The key of a step's units over `slots` (throws invalid_argument for a unit naming no slot).
  static plan_key key(std::span<update_unit const> units, std::span<slot_type const> slots) {
    plan_key k;
    k.items.resize(units.size());
    k.params.resize(units.size());
    for (std::size_t u = 0; u < units.size(); ++u) {
      k.items[u] = item(units[u], slots, k.layout);
      k.params[u] = units[u].param;
    }
    return k;
  }

  /// The last plan, if key(units, slots) is its key: compared unit by unit, without building the key.
  /// Throws as key() does, or returns null before reaching a unit key() would refuse (key() refuses
  /// it then).
  [[nodiscard]] plan_ptr lookup(std::span<update_unit const> units, std::span<slot_type const> slots) const {
    if (!cached_ || units.size() != key_.items.size()) return {};
    std::uint64_t layout = 0;
    for (std::size_t u = 0; u < units.size(); ++u) {
      if (item(units[u], slots, layout) != key_.items[u] || units[u].param != key_.params[u]) return {};
    }
    return layout == key_.layout ? cached_ : plan_ptr{};
  }

  /// The last plan built (null before the first step).
  [[nodiscard]] plan_ptr const& last() const noexcept { return cached_; }
  /// The last plan built, or an empty plan before the first step.
  [[nodiscard]] step_plan<B> const& current() const noexcept { return cached_ ? *cached_ : empty_; }

  /// Builds the plan of `batches` (the partition of `k.items`): cuts the slots to match, lists each
  /// batch's pieces (and their staging layout when `packed`), and takes the resident share from the
  /// front. Becomes the last plan.
  plan_ptr build(plan_key k, batch_plan batches, std::span<update_unit const> units, std::span<slot_desc const> descs,
                 lean_vector<slot_type>& slots, transfer_engine<B>& engine, bool packed, std::size_t resident_share) {
    // Owned by a plan_ptr from the start, built through `d`.
    auto owner = plan_ptr::make();
    auto* const d = owner.get_mut();
    d->plan = std::move(batches);
    segment(units, d->plan, slots, engine);
    auto const N = d->plan.size();
    d->first_param.assign(N, 0);
    d->last_param.assign(N, 0);
    d->batch_begin.assign(1, 0);
    // Dedup by piece identity, never by address values: piece k of slot si is piece number
    // first_piece[si] + k, and seen[] holds the last batch that took it.
    lean_vector<std::size_t> first_piece(slots.size() + 1, 0);
    for (std::size_t si = 0; si < slots.size(); ++si) first_piece[si + 1] = first_piece[si] + slots[si].pieces.size();
    lean_vector<std::size_t> seen(first_piece.back(), N);
    lean_vector<std::size_t> region; // per piece of the batch: its dtype (packed staging regions)
    for (std::size_t n = 0; n < N; ++n) {
      std::size_t bytes = 0;
      region.clear();
      if (!d->plan[n].empty()) {
        d->first_param[n] = units[d->plan[n].front().unit].param;
        d->last_param[n] = units[d->plan[n].back().unit].param;
      }
      for (auto const& r : d->plan[n]) {
        for (auto si : units[r.unit].slots) {
          auto& s = slots[si];
          if (!s.swappable) continue;
          auto const p_k = s.piece_of(r.begin);
          if (seen[first_piece[si] + p_k] == n) continue;
          seen[first_piece[si] + p_k] = n;
          auto* p = &s.pieces[p_k];
          d->pieces.push_back(p);
          region.push_back(static_cast<std::size_t>(descs[si].type));
          bytes += p->bytes();
        }
      }
      d->batch_begin.push_back(d->pieces.size());
      d->max_batch_bytes = std::max(d->max_batch_bytes, bytes);
      d->batch_bytes.push_back(bytes);
      if (packed) {
        d->staging.push_back(make_staging_layout<B>(d->batch(n), detail::view(region)));
        d->arena_size = std::max(d->arena_size, d->staging.back().bytes);
      }
    }
    if (resident_share > 0) {
      for (std::size_t n = 0; n < N; ++n) {
        auto const b = d->own_bytes(n, packed);
        if (d->resident_share_bytes + b > resident_share) break;
        d->resident_share_bytes += b;
        d->resident = n + 1;
      }
    }
    k.layout = 0; // segment() may have re-cut slots
    for (auto const& u : units) {
      for (auto si : u.slots) k.layout += slots[si].layout;
    }
    cached_ = owner;
    key_ = std::move(k);
    return cached_;
  }

private:
  /// Makes every swappable slot's pieces match the cuts of this step's plan. Re-cutting happens only
  /// when the plan changes, on slots at rest on the host (it is bookkeeping over the mirror).
  static void segment(std::span<update_unit const> units, batch_plan const& plan, lean_vector<slot_type>& slots,
                      transfer_engine<B>& engine) {
    // The cuts of unit u, flattened: cut[at[u], at[u + 1]).
    lean_vector<std::size_t> at(units.size() + 1, 0);
    for (auto const& batch : plan) {
      for (auto const& r : batch) ++at[r.unit + 1];
    }
    for (std::size_t u = 0; u < units.size(); ++u) at[u + 1] += at[u];
    lean_vector<std::size_t> cut(at.back());
    {
      auto fill = at;
      for (auto const& batch : plan) {
        for (auto const& r : batch) cut[fill[r.unit]++] = r.begin;
      }
    }
    lean_vector<std::size_t> c;
    for (std::size_t u = 0; u < units.size(); ++u) {
      // The unit's distinct cut points, ascending (a unit has a few: one per batch it spans), by
      // insertion (not std::sort and std::unique: docs/compile-times.md, "Rules").
      c.clear();
      for (auto k = at[u]; k < at[u + 1]; ++k) {
        auto i = c.size();
        while (i > 0 && cut[k] < c[i - 1]) --i;
        if (i == 0 || c[i - 1] != cut[k]) c.insert(c.begin() + i, cut[k]);
      }
      if (c.empty()) c.push_back(0);
      for (auto si : units[u].slots) {
        auto& s = slots.at(si);
        if (!s.swappable || s.piece_begin == c) continue;
        recut(s, c, engine);
      }
    }
  }

  static void recut(slot_type& s, lean_vector<std::size_t> const& cuts, transfer_engine<B>& engine) {
    lean_vector<buffer*> ps;
    for (auto& p : s.pieces) ps.push_back(&p);
    if (!s.all(residency::host)) { // bring it home first (rare: after an interrupted offload)
      engine.settle(detail::view(ps));
      engine.launch_offload(detail::view(ps), "recut");
      engine.wait_offload(detail::view(ps), engine.compute());
    }
    engine.host_sync(detail::view(ps));
    auto const eb = s.element_bytes;
    lean_vector<buffer> pieces;
    pieces.reserve(cuts.size());
    for (std::size_t i = 0; i < cuts.size(); ++i) {
      auto const end = i + 1 < cuts.size() ? cuts[i + 1] : s.numel;
      auto& p = pieces.emplace_back((end - cuts[i]) * eb);
      engine.set_mirror(p, s.mirror + cuts[i] * eb);
    }
    s.pieces = std::move(pieces);
    s.piece_begin = cuts;
    ++s.layout;
  }

  /// Unit `u`'s partition item over `slots`; adds its slots' layout versions to `layout`.
  static partition_item item(update_unit const& u, std::span<slot_type const> slots, std::uint64_t& layout) {
    std::uint64_t bpe = 0;
    for (auto si : u.slots) {
      if (si >= slots.size()) {
        throw invalid_argument(
            message({"optimizer_swap: slot index ", si, " is out of range (", slots.size(), " slots)"}));
      }
      auto const& s = slots[si];
      if (s.swappable) bpe += s.element_bytes;
      layout += s.layout;
    }
    return {u.numel, bpe};
  }

  plan_ptr cached_;
  step_plan<B> empty_; ///< current() before the first step
  plan_key key_;
};

/// Rethrows the exception in flight as a step_error that names the phase, the operation `w` and its
/// batch (with the batch's parameters from `d`, when known), and says what became of the state
/// (`outcome`); the original is nested.
template <backend B>
[[noreturn]] void rethrow_as_step_error(step_trace::position w, char const* phase, step_plan<B> const* d,
                                        char const* outcome) {
  std::string what = message({"optimizer_swap::", phase, ": ", w.op});
  if (w.batch) {
    what += message({" of batch ", *w.batch});
    if (d && *w.batch < d->first_param.size()) {
      auto const lo = d->first_param[*w.batch], hi = d->last_param[*w.batch];
      what += lo == hi ? message({" (parameter ", lo, ")"}) : message({" (parameters ", lo, " to ", hi, ")"});
    }
  }
  what += " failed";
  try {
    throw;
  } catch (std::exception const& e) {
    what += ": ";
    what += e.what();
  } catch (...) {}
  what += "; ";
  what += outcome;
  std::throw_with_nested(step_error(what, w.op, w.batch));
}

} // namespace pipeswap::detail
