// pipeswap — where the optimizer-swap runtime is, and what it tells its listener.
//
// Every pipeline operation is noted (so a failure names the operation and its batch) and, when a
// listener is set, announced as a string "op[:batch[:...]]" in the order the operations are issued.
// Backend-independent: compiled once, whatever the backend or optimizer.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <pipeswap/error.hpp>

namespace pipeswap::detail {

class step_trace {
public:
  using listener = std::function<void(std::string_view)>;

  /// The operation in progress and its batch (none outside a batch).
  struct position {
    char const* op = "step";
    std::optional<std::size_t> batch;
  };

  void set_listener(listener l) { listener_ = std::move(l); }
  void clear_listener() noexcept { listener_ = {}; }

  [[nodiscard]] position where() const noexcept { return where_; }
  void restore(position p) noexcept { where_ = p; }

  /// Notes an operation without announcing it.
  void note(char const* op, std::optional<std::size_t> n = std::nullopt) noexcept { where_ = {op, n}; }

  /// "op"
  void emit(char const* op) {
    note(op);
    if (listener_) listener_(op);
  }
  /// "op:batch"
  void emit(char const* op, std::size_t n) {
    note(op, n);
    if (listener_) listener_(std::string(op) + ":" + std::to_string(n));
  }
  /// "op:batch:arena" (a staging arena, 0 or 1)
  void emit(char const* op, std::size_t n, std::size_t arena) {
    note(op, n);
    if (listener_) listener_(std::string(op) + ":" + std::to_string(n) + ":" + std::to_string(arena));
  }
  /// "chain:batch:next:arena", next "None" when no load follows the offload.
  void emit(char const* op, std::size_t n, std::optional<std::size_t> next, std::size_t arena) {
    note(op, n);
    if (listener_) {
      listener_(std::string(op) + ":" + std::to_string(n) + ":" + (next ? std::to_string(*next) : "None") + ":" +
                std::to_string(arena));
    }
  }
  /// "op:batch:tag" for a batch outside the staging arenas: "own" (its own storage), "early".
  void emit(char const* op, std::size_t n, char const* tag) {
    note(op, n);
    if (listener_) listener_(std::string(op) + ":" + std::to_string(n) + ":" + tag);
  }

  /// Announces without noting, and swallows what the listener throws (clean-up after a failure).
  void emit_quietly(char const* op) noexcept {
    try {
      if (listener_) listener_(op);
    } catch (...) {
    }
  }

private:
  listener listener_;
  position where_;
};

/// Refuses a call of the runtime from inside another (a listener calling back into it): `busy`
/// names the public call in progress.
class call_guard {
public:
  call_guard(char const*& busy, char const* op) : busy_(busy) {
    if (busy_) {
      throw state_error(std::string("optimizer_swap::") + op + ": called from inside " + busy_ +
                        " (a listener); the runtime is not reentrant");
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
