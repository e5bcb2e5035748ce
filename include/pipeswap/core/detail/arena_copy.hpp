// pipeswap — the transfer engine's copies through a staging arena (core/transfer.hpp, arena_storage):
// a batch's buffers at the offsets of its staging_layout (core/staging.hpp), one copy per run of
// buffers adjacent in host memory and in the arena. It writes the buffers' states on the engine's
// behalf. Not public API.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/detail/lean_vector.hpp>
#include <pipeswap/core/staging.hpp>
#include <pipeswap/core/swap_buffer.hpp>
#include <pipeswap/detail/message.hpp>
#include <pipeswap/error.hpp>

namespace pipeswap::detail {

template <backend B>
struct arena_copy {
  using buffer = swap_buffer<B>;

  /// Arena copies (a load when `load`, else an offload): when every buffer of the layout is a
  /// target, one copy per run; otherwise (after an interrupted step) one per target. Each buffer
  /// changes state once its copy is enqueued; loads set the views, offloads drop them (the arena is
  /// released as a whole).
  static void runs(B& b, stream_t<B> h2d, stream_t<B> d2h, std::span<buffer* const> bufs,
                   lean_vector<buffer*> const& targets, staging_arena<B>& arena, staging_layout const& lay, bool load) {
    if (lay.size() != bufs.size()) {
      throw state_error(message({"staging layout of ", lay.size(), " buffers used for a batch of ", bufs.size()}));
    }
    if (lay.bytes > arena.bytes) {
      throw state_error(message(
          {"staging arena of ", arena.bytes, " bytes is smaller than the ", lay.bytes, " bytes its batch needs"}));
    }
    auto const base = arena.base;
    auto const in_from = [load](residency r) { return load ? off_device(r) : r == residency::device; };
    auto const copy = [&](std::byte* h, device_pointer_t<B> d, std::size_t n) {
      if (load) {
        b.copy_h2d(d, h, n, h2d);
      } else {
        b.copy_d2h(h, d, n, d2h);
      }
    };
    auto const moved = [&](buffer& x) {
      x.state_ = load ? residency::h2d : residency::d2h;
      x.event_ = nullptr;
      if (!load) x.device_ = {};
    };
    for (auto* x : targets) {
      if (x->mirror_ == nullptr) throw state_error("swap buffer staged in an arena has no host mirror");
    }
    bool whole = true;
    for (std::size_t i = 0; i < bufs.size(); ++i) {
      auto* x = bufs[i];
      bool const from = in_from(x->state_);
      whole = whole && (from || x->bytes_ == 0);
      if (load && from) x->device_ = base + lay.offset(i);
    }
    if (whole) {
      std::size_t k = 0;
      for (std::size_t n = 0; n < lay.run_count(); ++n) {
        auto const& r = lay.run_at(n);
        copy(bufs[r.first]->mirror_, base + r.offset, r.bytes);
        while (k < lay.size() && lay.offset(lay.buffer_at(k)) < r.offset + r.bytes) {
          auto* x = bufs[lay.buffer_at(k)];
          if (in_from(x->state_) && x->bytes_ > 0) moved(*x);
          ++k;
        }
      }
      return;
    }
    for (std::size_t i = 0; i < bufs.size(); ++i) {
      auto* x = bufs[i];
      if (!in_from(x->state_) || x->bytes_ == 0) continue;
      bool target = false;
      for (auto* t : targets) target = target || t == x;
      if (!target) continue;
      copy(x->mirror_, base + lay.offset(i), x->bytes_);
      moved(*x);
    }
  }
};

} // namespace pipeswap::detail
