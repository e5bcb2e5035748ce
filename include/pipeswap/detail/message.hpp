// pipeswap — error messages composed in one call (internal).
//
//   throw invalid_argument(detail::message({"adam::update: batch range ", k, " names unit ", r.unit}));
//
// concatenates text and integers (printed as std::to_string prints them). It is how the runtime's
// headers compose the messages of their exceptions. A chain of std::string operator+ and
// std::to_string costs, per piece, a call, a temporary string and its clean-up on the exception
// path; at -O0 every one of those is code the compiler emits at the throw site, in every
// translation unit. Here each piece is a trivially destructible record, and the string is built in
// one non-template function (docs/compile-times.md).
#pragma once

#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace pipeswap::detail {

/// The integers a message prints as numbers (bool and char are not numbers here).
template <class I>
concept message_integer = std::integral<I> && !std::same_as<I, bool> && !std::same_as<I, char>;

/// One piece of a message: a text (referenced, not copied: it must outlive the message() call) or
/// an integer.
class message_part {
public:
  message_part(char const* text) noexcept : text_(text) {}
  message_part(std::string_view text) noexcept : text_(text) {}
  message_part(std::string const& text) noexcept : text_(text) {}
  template <message_integer I>
  message_part(I value) noexcept
      : number_(static_cast<std::uint64_t>(value)), kind_(negative(value) ? kind::negative : kind::number) {}

  void append_to(std::string& s) const {
    switch (kind_) {
    case kind::text: s.append(text_); break;
    case kind::number: s += std::to_string(number_); break;
    case kind::negative: s += std::to_string(static_cast<std::int64_t>(number_)); break;
    }
  }

private:
  template <std::integral I>
  static constexpr bool negative(I value) noexcept {
    if constexpr (std::signed_integral<I>) {
      return value < 0;
    } else {
      return false;
    }
  }

  enum class kind : unsigned char { text, number, negative };
  std::string_view text_;
  std::uint64_t number_ = 0;
  kind kind_ = kind::text;
};

/// Appends the pieces to `s`.
inline void append(std::string& s, std::initializer_list<message_part> parts) {
  for (auto const& p : parts) p.append_to(s);
}

/// The pieces, concatenated.
inline std::string message(std::initializer_list<message_part> parts) {
  std::string s;
  append(s, parts);
  return s;
}

} // namespace pipeswap::detail
