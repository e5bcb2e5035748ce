// pipeswap — named ordering points, so tests can prove each one is necessary (internal).
//
// Every wait the runtimes issue for correctness goes through wait_at(site, ...). A test program that
// defines PIPESWAP_MUTATION_TESTING before including pipeswap can switch one site off and check that
// the mock backend's hazard checker catches the broken variant. In normal builds the switch does not
// exist and wait_at is a plain wait.
#pragma once

#ifdef PIPESWAP_MUTATION_TESTING
#  include <atomic>
#endif

#include <cstdint>
#include <string_view>

#include <pipeswap/backend/concepts.hpp>

namespace pipeswap::detail {

enum class wait_site : std::uint8_t {
  offload_after_compute,   ///< the d2h stream waits the compute work that produced the bytes
  gate_after_offload,      ///< the next user of freed memory waits the offload that freed it
  load_after_mirror,       ///< the h2d stream waits the D2H that last filled the mirror
  use_after_load,          ///< the consumer waits the H2D before using the bytes
  arena_reuse,             ///< packed: the H2D into a staging arena waits the D2H out of it
  arena_release,           ///< packed: the release of a staging arena waits the h2d stream that filled it
  prefetch_after_release,  ///< prefetch: the h2d stream waits the releases issued on the d2h stream
  finish_deferred,         ///< deferred offload: the next user of its memory waits its D2Hs
  room_release,            ///< make_room: the d2h stream waits a release enqueued on the asking stream
  exec_send_after_compute, ///< executor: the send stream waits the compute that wrote a boundary
  exec_use_after_receive,  ///< executor: the compute stream waits the H2D of a received boundary
  count
};

constexpr std::string_view to_string(wait_site s) noexcept {
  switch (s) {
  case wait_site::offload_after_compute: return "offload_after_compute";
  case wait_site::gate_after_offload: return "gate_after_offload";
  case wait_site::load_after_mirror: return "load_after_mirror";
  case wait_site::use_after_load: return "use_after_load";
  case wait_site::arena_reuse: return "arena_reuse";
  case wait_site::arena_release: return "arena_release";
  case wait_site::prefetch_after_release: return "prefetch_after_release";
  case wait_site::finish_deferred: return "finish_deferred";
  case wait_site::room_release: return "room_release";
  case wait_site::exec_send_after_compute: return "exec_send_after_compute";
  case wait_site::exec_use_after_receive: return "exec_use_after_receive";
  case wait_site::count: break;
  }
  return "?";
}

#ifdef PIPESWAP_MUTATION_TESTING
// Atomic: the executor's tests issue waits from several rank threads at once.
/// Bit i set: the waits of wait_site i are skipped.
inline std::atomic<unsigned> mutated_sites = 0;
/// How many waits each site issued (skipped ones included), so a test can show it reached them all.
inline std::atomic<unsigned long> site_hits[static_cast<unsigned>(wait_site::count)] = {};
#endif

template <class B>
void wait_at([[maybe_unused]] wait_site site, B& b, typename B::stream_type s, typename B::event_type const& e) {
#ifdef PIPESWAP_MUTATION_TESTING
  ++site_hits[static_cast<unsigned>(site)];
  if (mutated_sites & (1u << static_cast<unsigned>(site))) return;
#endif
  b.wait_event(s, e);
}

} // namespace pipeswap::detail
