// pipeswap — the former names of optimizer_swap's calls, kept as deprecated forwarders so programs
// written against them still compile (with a warning naming the new call). optimizer_swap inherits
// them; they go together when the deprecation period ends.
#pragma once

#include <cstddef>

namespace pipeswap::detail {

template <class Runtime>
class optimizer_swap_former_names {
public:
  /// "host" is the word for pinned host memory.
  [[deprecated("use synchronize_host_mirrors()")]] void synchronize_cpu_mirrors() { self().synchronize_host_mirrors(); }
  /// "resident" is the resident share's word; state that never swaps is "unswappable".
  [[nodiscard, deprecated("use unswappable_bytes()")]] std::size_t resident_bytes() const noexcept {
    return self().unswappable_bytes();
  }
  [[nodiscard, deprecated("use unswappable_device(i)")]] auto resident_device(std::size_t i) const {
    return self().unswappable_device(i);
  }
  /// "arena" means device staging memory only.
  [[nodiscard, deprecated("use host_store_bytes()")]] std::size_t host_arena_bytes() const noexcept {
    return self().host_store_bytes();
  }

protected:
  optimizer_swap_former_names() = default;

private:
  Runtime& self() noexcept { return static_cast<Runtime&>(*this); }
  Runtime const& self() const noexcept { return static_cast<Runtime const&>(*this); }
};

} // namespace pipeswap::detail
