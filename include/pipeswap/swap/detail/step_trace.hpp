// pipeswap — where the optimizer-swap runtime is, and what it tells its listener.
//
// Every pipeline operation is noted (so a failure names the operation and its batch) and, when a
// listener is set, announced as a swap_event, or its string form "op[:batch[:...]]", in the order the
// operations are issued.
// Backend-independent: compiled once, whatever the backend or optimizer.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/swap/swap_event.hpp>

namespace pipeswap::detail {

class step_trace {
public:
  using listener = std::function<void(std::string_view)>;
  using event_listener = std::function<void(swap_event const&)>;

  /// The operation in progress and its batch (none outside a batch).
  struct position {
    char const* op = "step";
    std::optional<std::size_t> batch;
  };

  /// The string listener, as an event listener that formats each event (string_listener()).
  void set_listener(event_listener l) { strings_ = std::move(l); }
  void set_event_listener(event_listener l) { events_ = std::move(l); }
  void clear_listener() noexcept {
    strings_ = {};
    events_ = {};
  }

  [[nodiscard]] position where() const noexcept { return where_; }
  void restore(position p) noexcept { where_ = p; }

  /// Notes an operation without announcing it.
  void note(char const* op, std::optional<std::size_t> n = std::nullopt) noexcept { where_ = {op, n}; }

  /// "op"
  void emit(swap_event::kind op) { announce({.op = op}); }
  /// "op:batch"
  void emit(swap_event::kind op, std::size_t n) { announce({.op = op, .batch = n}); }
  /// "op:batch:arena" (a staging arena, 0 or 1)
  void emit(swap_event::kind op, std::size_t n, std::size_t arena) {
    announce({.op = op, .batch = n, .where = swap_event::storage::staging, .arena = arena});
  }
  /// "chain:batch:next:arena": the offload of batch n out of its arena, and the load that follows.
  void emit(swap_event::kind op, std::size_t n, std::optional<std::size_t> next, std::size_t arena) {
    announce(
        {.op = op, .batch = n, .next = next, .where = swap_event::storage::staging, .arena = arena, .chained = true});
  }
  /// "op:batch:own" or "op:batch:early" for a batch in its own storage.
  void emit(swap_event::kind op, std::size_t n, swap_event::storage where) {
    announce({.op = op, .batch = n, .where = where});
  }

  /// Announces without noting, and swallows what the listener throws (clean-up after a failure).
  void emit_quietly(swap_event::kind op) noexcept {
    try {
      send({.op = op});
    } catch (...) {}
  }

private:
  void announce(swap_event const& e) {
    where_ = {to_string(e.op).data(), e.batch};
    send(e);
  }
  void send(swap_event const& e) {
    if (events_) events_(e);
    if (strings_) strings_(e);
  }

  event_listener strings_; ///< the string listener, formatting each event
  event_listener events_;
  position where_;
};

/// `l` as an event listener: each event formatted by to_string() (none for an empty `l`). A template,
/// so that only a program that sets a string listener compiles the formatting.
template <class Listener = step_trace::listener>
step_trace::event_listener string_listener(Listener l) {
  if (!l) return {};
  return [l = std::move(l)](swap_event const& e) { l(to_string(e)); };
}

/// Refuses a call of the runtime from inside another (a listener calling back into it): `busy`
/// names the public call in progress.
class call_guard {
public:
  call_guard(char const*& busy, char const* op) : busy_(busy) {
    if (busy_) {
      throw state_error(message(
          {"optimizer_swap::", op, ": called from inside ", busy_, " (a listener); the runtime is not reentrant"}));
    }
    busy_ = op;
  }
  ~call_guard() { busy_ = nullptr; }
  call_guard(call_guard const&) = delete;
  call_guard& operator=(call_guard const&) = delete;

private:
  char const*& busy_;
};

} // namespace pipeswap::detail
