// pipeswap — the compact text form of steps and orders, for people, docs, tests and error messages.
//
//   F0.3 FS0.3 [B4.0|F0.7] LO0.3 US1 _
//
// Entries are separated by white space. A leaf is its code, its stage and, unless it is an FSDP step,
// `.` and its micro-batch. A bubble is `_`. A composite is `[leaf|leaf]`; its kind is inferred from the
// first leaf (a backward-like first leaf — B, BI, BW — makes OVERLAP_B_F, F makes OVERLAP_F_B); the
// prefix `FB[` or `BF[` states it explicitly and is printed whenever inference would say otherwise.
//
// | code | kind            | code | kind                | code | kind                  |
// |------|-----------------|------|---------------------|------|-----------------------|
// | F    | FWD             | SG   | SWAP_SET_GROUP      | BI   | BWD_INPUT             |
// | B    | BWD             | LO   | SWAP_LAUNCH_OFFLOAD | BW   | BWD_WEIGHT            |
// | FR   | FWD_RECV        | WO   | SWAP_WAIT_OFFLOAD   | US   | FSDP_UNSHARD          |
// | FS   | FWD_SEND        | LL   | SWAP_LAUNCH_LOAD    | RS   | FSDP_RESHARD          |
// | BR   | BWD_RECV        | WL   | SWAP_WAIT_LOAD      | RG   | FSDP_REDUCE_GRAD      |
// | BS   | BWD_SEND        | FB[  | OVERLAP_F_B         | WG   | FSDP_WAIT_REDUCE_GRAD |
// |      |                 | BF[  | OVERLAP_B_F         |      |                       |
//
// Printing never throws and prints malformed steps too (an absent index as `?`), so validators can
// name any step; parsing accepts exactly the well-shaped steps (detail/shape.hpp) and round-trips them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/schedule/detail/shape.hpp>
#include <pipeswap/schedule/step.hpp>

namespace pipeswap::schedule {

/// The text code of `k` (see the table above); composites have "FB" / "BF".
constexpr std::string_view step_kind_code(step_kind k) noexcept {
  switch (k) {
  case step_kind::fwd: return "F";
  case step_kind::bwd: return "B";
  case step_kind::fwd_recv: return "FR";
  case step_kind::fwd_send: return "FS";
  case step_kind::bwd_recv: return "BR";
  case step_kind::bwd_send: return "BS";
  case step_kind::overlap_f_b: return "FB";
  case step_kind::overlap_b_f: return "BF";
  case step_kind::swap_set_group: return "SG";
  case step_kind::swap_launch_offload: return "LO";
  case step_kind::swap_wait_offload: return "WO";
  case step_kind::swap_launch_load: return "LL";
  case step_kind::swap_wait_load: return "WL";
  case step_kind::bwd_input: return "BI";
  case step_kind::bwd_weight: return "BW";
  case step_kind::fsdp_unshard: return "US";
  case step_kind::fsdp_reshard: return "RS";
  case step_kind::fsdp_reduce_grad: return "RG";
  case step_kind::fsdp_wait_reduce_grad: return "WG";
  }
  return "?";
}

namespace detail {

/// The composite kind the text form infers from a first leaf, if any.
constexpr std::optional<step_kind> inferred_composite(step_kind first_leaf) noexcept {
  if (first_leaf == step_kind::fwd) return step_kind::overlap_f_b;
  if (first_leaf == step_kind::bwd || first_leaf == step_kind::bwd_input || first_leaf == step_kind::bwd_weight)
    return step_kind::overlap_b_f;
  return std::nullopt;
}

inline void append_index(std::string& out, index_type v) {
  if (v == no_index)
    out += '?';
  else
    out += std::to_string(v);
}

inline void append_text(std::string& out, step const& s) {
  if (is_composite(s.kind)) {
    if (s.sub.empty() || inferred_composite(s.sub.front().kind) != s.kind) out += step_kind_code(s.kind);
    out += '[';
    for (std::size_t i = 0; i < s.sub.size(); ++i) {
      if (i) out += '|';
      append_text(out, s.sub[i]);
    }
    out += ']';
    return;
  }
  out += step_kind_code(s.kind);
  append_index(out, s.stage);
  if (has_micro(s.kind) || s.micro != no_index) {
    out += '.';
    append_index(out, s.micro);
  }
}

class text_parser {
public:
  explicit text_parser(std::string_view text) : text_(text) {}

  order parse_order() {
    order out;
    skip_space();
    while (pos_ < text_.size()) {
      out.push_back(parse_entry(out.size()));
      if (pos_ < text_.size() && !is_space(text_[pos_]))
        fail(out.size() - 1, "expected white space after the entry, got '" + std::string(1, text_[pos_]) + "'");
      skip_space();
    }
    return out;
  }

  entry parse_single() {
    skip_space();
    if (pos_ == text_.size()) fail(0, "no step");
    entry e = parse_entry(0);
    skip_space();
    if (pos_ != text_.size()) fail(0, "unexpected text after the step");
    return e;
  }

private:
  static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
  static bool is_upper(char c) { return c >= 'A' && c <= 'Z'; }
  static bool is_digit(char c) { return c >= '0' && c <= '9'; }

  void skip_space() {
    while (pos_ < text_.size() && is_space(text_[pos_])) ++pos_;
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }

  [[noreturn]] void fail(std::size_t entry_index, std::string const& what) const {
    throw invalid_argument(
        pipeswap::detail::message({"order text: entry ", entry_index, " (column ", pos_ + 1, "): ", what}));
  }

  std::string_view word() {
    std::size_t const begin = pos_;
    while (is_upper(peek())) ++pos_;
    return text_.substr(begin, pos_ - begin);
  }

  index_type number(std::size_t entry_index, char const* what) {
    if (!is_digit(peek())) fail(entry_index, std::string("expected the ") + what + " (digits)");
    std::int64_t v = 0;
    while (is_digit(peek())) {
      v = v * 10 + (text_[pos_++] - '0');
      if (v > INT32_MAX) fail(entry_index, std::string("the ") + what + " is out of range");
    }
    return index_type(v);
  }

  step parse_leaf(std::size_t entry_index, std::string_view code) {
    std::optional<step_kind> kind;
    for (step_kind k : all_step_kinds) {
      if (!is_composite(k) && step_kind_code(k) == code) kind = k;
    }
    if (!kind) {
      if (code.empty()) fail(entry_index, "expected a step code");
      fail(entry_index, "unknown step code '" + std::string(code) + "'");
    }
    step s = leaf(*kind, number(entry_index, "stage"));
    if (has_micro(*kind)) {
      if (peek() != '.') fail(entry_index, "expected '.' and the micro-batch after the stage");
      ++pos_;
      s.micro = number(entry_index, "micro-batch");
    } else if (peek() == '.') {
      fail(entry_index, std::string(step_kind_name(*kind)) + " takes no micro-batch");
    }
    return s;
  }

  entry parse_entry(std::size_t entry_index) {
    if (peek() == '_') {
      ++pos_;
      return std::nullopt;
    }
    std::string_view const code = word();
    if (peek() != '[') return checked(entry_index, parse_leaf(entry_index, code));
    std::optional<step_kind> kind;
    if (code == "FB")
      kind = step_kind::overlap_f_b;
    else if (code == "BF")
      kind = step_kind::overlap_b_f;
    else if (!code.empty())
      fail(entry_index, "unknown composite prefix '" + std::string(code) + "' (FB or BF)");
    ++pos_; // '['
    std::vector<step> leaves;
    skip_space();
    while (peek() != ']') {
      if (peek() == '\0') fail(entry_index, "unterminated composite");
      if (!leaves.empty()) {
        if (peek() != '|') fail(entry_index, "expected '|' or ']' in the composite");
        ++pos_;
        skip_space();
      }
      if (peek() == '[') fail(entry_index, "a composite cannot hold a composite");
      leaves.push_back(parse_leaf(entry_index, word()));
      skip_space();
    }
    ++pos_; // ']'
    if (!kind) {
      if (leaves.empty()) fail(entry_index, "a composite needs leaves");
      kind = inferred_composite(leaves.front().kind);
      if (!kind) fail(entry_index, "cannot tell the composite's kind from its first leaf; write FB[...] or BF[...]");
    }
    return checked(entry_index, composite(*kind, std::move(leaves)));
  }

  step checked(std::size_t entry_index, step s) const {
    if (auto e = shape_error(s)) fail(entry_index, *e);
    return s;
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

} // namespace detail

/// The text form of one step ("F0.3", "[B4.0|F0.7]", "US1"). Never throws on malformed steps.
inline std::string to_text(step const& s) {
  std::string out;
  detail::append_text(out, s);
  return out;
}

/// The text form of one entry: a step, or "_" for a bubble.
inline std::string to_text(entry const& e) { return e ? to_text(*e) : std::string("_"); }

/// The text form of an order: its entries separated by single spaces.
inline std::string to_text(order const& o) {
  std::string out;
  out.reserve(o.size() * 6);
  for (std::size_t i = 0; i < o.size(); ++i) {
    if (i) out += ' ';
    if (o[i])
      detail::append_text(out, *o[i]);
    else
      out += '_';
  }
  return out;
}

/// Parses the text form of an order. Throws invalid_argument naming the entry index, the column and
/// what is wrong (an unknown code, a missing micro-batch, a composite without leaves, ...).
inline order order_from_text(std::string_view text) { return detail::text_parser(text).parse_order(); }

/// Parses exactly one entry (a step or "_").
inline entry entry_from_text(std::string_view text) { return detail::text_parser(text).parse_single(); }

} // namespace pipeswap::schedule
