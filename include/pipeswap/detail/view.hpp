// pipeswap — detail::view(c): a contiguous container's elements as a std::span (internal).
//
// Where a span parameter is given a std::vector or a lean_vector, the conversion goes through
// span's range constructor, whose range concepts g++ checks per container type and value category;
// at -O0 that costs about as much as a short function in every translation unit
// (docs/compile-times.md). view(v) builds the span from data() and size() instead.
#pragma once

#include <span>

namespace pipeswap::detail {

template <class Container>
[[nodiscard]] std::span<typename Container::value_type const> view(Container const& c) noexcept {
  return {c.data(), c.size()};
}

} // namespace pipeswap::detail
