// pipeswap — fault injection of the mock backend: the n-th copy, allocation or kernel launch from now
// throws mock_error, once, and has no effect.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/backend/mock/hazard.hpp>
#include <pipeswap/backend/mock/types.hpp>

namespace pipeswap::mock::detail {

class fault_injector {
public:
  void fail_after(fault_site site, std::size_t n) noexcept { faults_[index(site)] = attempts_[index(site)] + n; }
  void clear() noexcept {
    for (auto& f : faults_) f.reset();
  }
  [[nodiscard]] std::size_t attempts(fault_site site) const noexcept { return attempts_[index(site)]; }
  /// Counts one attempt of class `site`; throws mock_error if it is the one to fail. `what` names
  /// the call: a string, or a callable that gives it (called only for the failing attempt); `n` its
  /// bytes (0: none).
  template <class What>
  void attempt(fault_site site, What const& what, std::size_t n) {
    auto const i = index(site);
    auto const nth = attempts_[i]++;
    if (faults_[i] && *faults_[i] == nth) {
      faults_[i].reset();
      constexpr char const* names[] = {"copy", "allocation", "kernel"};
      std::string name;
      if constexpr (std::is_invocable_v<What const&>)
        name = what();
      else
        name = what;
      if (n == 0)
        throw mock_error(
            pipeswap::detail::message({"mock::backend: injected fault in ", name, " (", names[i], " #", nth, ")"}));
      throw mock_error(pipeswap::detail::message(
          {"mock::backend: injected fault in ", name, " (", names[i], " #", nth, ", ", n, " bytes)"}));
    }
  }

private:
  static constexpr std::size_t index(fault_site s) noexcept { return static_cast<std::size_t>(s); }
  std::size_t attempts_[3] = {0, 0, 0};
  std::optional<std::size_t> faults_[3];
};

} // namespace pipeswap::mock::detail
