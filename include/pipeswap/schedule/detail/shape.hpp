// pipeswap — structural rules every step obeys; shared by the parsers, the validators and injection.
#pragma once

#include <optional>
#include <string>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/schedule/step.hpp>

namespace pipeswap::schedule::detail {

inline std::string describe_index(char const* what, index_type v) {
  return v == no_index ? pipeswap::detail::message({"no ", what})
                       : pipeswap::detail::message({"a negative ", what, " (", v, ")"});
}

inline bool leaf_shape_ok(step const& s) noexcept {
  return s.kind <= step_kind::fsdp_wait_reduce_grad && s.sub.empty() && s.stage >= 0 &&
         (has_micro(s.kind) ? s.micro >= 0 : s.micro == no_index);
}

inline std::optional<std::string> leaf_shape_error(step const& s) {
  if (leaf_shape_ok(s)) return std::nullopt;
  if (s.kind > step_kind::fsdp_wait_reduce_grad) return pipeswap::detail::message({"unknown step kind ", int(s.kind)});
  std::string const name(step_kind_name(s.kind));
  if (!s.sub.empty()) return pipeswap::detail::message({name, " is not a composite but has ", s.sub.size(), " leaves"});
  if (s.stage < 0) return name + " has " + describe_index("stage", s.stage);
  if (has_micro(s.kind)) return name + " has " + describe_index("micro-batch", s.micro);
  return pipeswap::detail::message({name, " carries a micro-batch (", s.micro, "); FSDP steps act on a whole stage"});
}

/// Whether `s` obeys the rules of shape_error (cheap; no message).
inline bool shape_ok(step const& s) noexcept {
  if (!is_composite(s.kind)) return leaf_shape_ok(s);
  if (s.stage != no_index || s.micro != no_index || s.sub.empty() || s.sub.size() > 2) return false;
  for (step const& l : s.sub) {
    if (is_composite(l.kind) || !leaf_shape_ok(l)) return false;
  }
  return true;
}

/// What is structurally wrong with `s`, or nullopt. The rules: a leaf has a stage >= 0 and, unless it
/// is an FSDP step, a micro-batch >= 0 (FSDP steps have none); only composites have leaves; a
/// composite has no stage or micro-batch and holds one or two leaves, none of them composite.
inline std::optional<std::string> shape_error(step const& s) {
  if (shape_ok(s)) return std::nullopt;
  if (!is_composite(s.kind)) return leaf_shape_error(s);
  std::string const name(step_kind_name(s.kind));
  if (s.stage != no_index || s.micro != no_index)
    return name + " carries a stage or micro-batch; a composite's stages and micro-batches belong to its leaves";
  if (s.sub.empty()) return name + " has no leaves";
  if (s.sub.size() > 2)
    return pipeswap::detail::message({name, " has ", s.sub.size(), " leaves; a composite holds one or two"});
  for (std::size_t i = 0; i < s.sub.size(); ++i) {
    if (is_composite(s.sub[i].kind)) return pipeswap::detail::message({name, " leaf ", i, " is itself a composite"});
    if (auto e = leaf_shape_error(s.sub[i])) return pipeswap::detail::message({name, " leaf ", i, ": ", *e});
  }
  return std::nullopt;
}

} // namespace pipeswap::schedule::detail
