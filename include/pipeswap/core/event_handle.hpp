// pipeswap — shared, identity-carrying handles to recorded events.
#pragma once

#include <memory>

#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/core/detail/lean_vector.hpp>

namespace pipeswap {

/// A recorded event shared by every buffer it guards. One event is recorded per batch of copies and
/// handed to all of the batch's buffers; the handle's identity lets waits be issued once per event,
/// whatever the backend's event type looks like.
template <backend B>
using event_handle = std::shared_ptr<event_t<B> const>;

/// Records an event on `s` and wraps it.
template <backend B>
event_handle<B> record(B& b, stream_t<B> s) {
  return std::make_shared<event_t<B> const>(b.record_event(s));
}

namespace detail {

/// Appends `e` to `out` unless it is null or already there (events per batch are few: linear is fine).
template <backend B>
void add_unique(lean_vector<event_handle<B>>& out, event_handle<B> const& e) {
  if (!e) return;
  for (auto const& x : out) {
    if (x == e) return;
  }
  out.push_back(e);
}

/// Sets a trace label for the backend's next operations and clears it on scope exit.
template <class B>
class scoped_label {
public:
  scoped_label(B& b, char const* label) : b_(b) { annotate(b_, label); }
  scoped_label(scoped_label const&) = delete;
  scoped_label& operator=(scoped_label const&) = delete;
  ~scoped_label() {
    if constexpr (labelled_backend<B>) {
      try {
        b_.set_label("");
      } catch (...) { // a label is cosmetic; never let it escape a destructor
      }
    }
  }

private:
  B& b_;
};

} // namespace detail
} // namespace pipeswap
