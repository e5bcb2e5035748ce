// Whether this test program is built with a sanitizer (ASan or TSan). The exhaustive sweeps run a
// documented sample under sanitizers, which make them ten times slower; the normal build runs all.
#pragma once

namespace pipeswap::test {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool sanitized_build = true;
#elif defined(__has_feature)
#  if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool sanitized_build = true;
#  else
inline constexpr bool sanitized_build = false;
#  endif
#else
inline constexpr bool sanitized_build = false;
#endif

} // namespace pipeswap::test
