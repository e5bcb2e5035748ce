// pipeswap — JSON I/O of steps and orders (needs nlohmann-json; not part of the umbrella header).
//
// An order is an array; each entry is null (a bubble) or an object
//
//   {"type": "FWD", "stage": 0, "micro": 3}
//   {"type": "FSDP_UNSHARD", "stage": 1, "micro": null}
//   {"type": "OVERLAP_B_F", "stage": null, "micro": null,
//    "sub": [{"type": "BWD", "stage": 4, "micro": 0}, {"type": "FWD", "stage": 0, "micro": 7}]}
//
// "type" is a step_kind_name; "stage" and "micro" are non-negative integers or null, as the step's
// shape requires (detail/shape.hpp): composites have both null (or absent) and their leaves in "sub";
// FSDP steps have a null (or absent) micro; "sub" is only for composites (an empty "sub" is accepted
// on a leaf). Unknown keys are rejected. Several ranks' orders are an array of orders, rank = index.
//
// Writing produces nlohmann::ordered_json by default so keys read type, stage, micro, sub; reading
// accepts any nlohmann::basic_json. Bad input throws pipeswap::invalid_argument naming the rank (for
// several orders), the entry index, the sub-step index and what is wrong; nothing is returned then.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/schedule/detail/shape.hpp>
#include <pipeswap/schedule/step.hpp>

namespace pipeswap::schedule {

namespace detail {

template <class Json>
Json index_json(index_type v) {
  return v == no_index ? Json(nullptr) : Json(v);
}

template <class Json>
Json step_json(step const& s) {
  Json j = Json::object();
  j["type"] = step_kind_name(s.kind);
  j["stage"] = index_json<Json>(s.stage);
  j["micro"] = index_json<Json>(s.micro);
  if (!s.sub.empty()) {
    Json sub = Json::array();
    for (step const& l : s.sub) sub.push_back(step_json<Json>(l));
    j["sub"] = std::move(sub);
  }
  return j;
}

[[noreturn]] inline void json_fail(std::string const& where, std::string const& what) {
  throw invalid_argument("order JSON: " + where + ": " + what);
}

template <class Json>
index_type index_from_json(Json const& j, char const* key, std::string const& where) {
  auto const it = j.find(key);
  if (it == j.end() || it->is_null()) return no_index;
  std::string const k(key);
  if (it->is_number_unsigned()) {
    auto const v = it->template get<std::uint64_t>();
    if (v > std::uint64_t(INT32_MAX)) json_fail(where, "'" + k + "' is out of range (" + it->dump() + ")");
    return index_type(v);
  }
  if (it->is_number_integer()) {
    auto const v = it->template get<std::int64_t>();
    if (v < 0) json_fail(where, "'" + k + "' must be a non-negative integer, got " + it->dump());
    if (v > INT32_MAX) json_fail(where, "'" + k + "' is out of range (" + it->dump() + ")");
    return index_type(v);
  }
  json_fail(where, "'" + k + "' must be a non-negative integer or null, got " + it->dump());
}

template <class Json>
step step_from_json(Json const& j, std::string const& where, bool is_leaf) {
  if (!j.is_object())
    json_fail(where,
              std::string(is_leaf ? "expected an object" : "expected an object or null") + ", got " + j.type_name());
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() != "type" && it.key() != "stage" && it.key() != "micro" && it.key() != "sub")
      json_fail(where, "unknown key '" + it.key() + "'");
  }
  auto const type = j.find("type");
  if (type == j.end()) json_fail(where, "missing 'type'");
  if (!type->is_string()) json_fail(where, "'type' must be a string, got " + type->dump());
  auto const& name = type->template get_ref<typename Json::string_t const&>();
  auto const kind = step_kind_from_name(name);
  if (!kind) json_fail(where, "unknown step type '" + name + "'");
  if (is_leaf && is_composite(*kind)) json_fail(where, "a composite cannot be a leaf of a composite");
  step s{*kind, index_from_json(j, "stage", where), index_from_json(j, "micro", where), {}};
  if (auto const sub = j.find("sub"); sub != j.end() && !sub->is_null()) {
    if (!sub->is_array()) json_fail(where, "'sub' must be an array, got " + sub->dump());
    for (std::size_t k = 0; k < sub->size(); ++k) {
      std::string const at = pipeswap::detail::message({where, ": sub-step ", k});
      if ((*sub)[k].is_null()) json_fail(at, "a bubble cannot be a leaf of a composite");
      s.sub.push_back(step_from_json((*sub)[k], at, true));
    }
  }
  if (auto e = shape_error(s)) json_fail(where, *e);
  return s;
}

template <class Json>
order order_from_json_at(Json const& j, std::string const& rank) {
  if (!j.is_array())
    json_fail(rank.empty() ? "top level" : rank, std::string("an order must be an array, got ") + j.type_name());
  std::string const prefix = rank.empty() ? "" : rank + ": ";
  order out;
  out.reserve(j.size());
  for (std::size_t i = 0; i < j.size(); ++i) {
    if (j[i].is_null())
      out.emplace_back();
    else
      out.emplace_back(step_from_json(j[i], pipeswap::detail::message({prefix, "entry ", i}), false));
  }
  return out;
}

template <class Json>
Json parse_json_text(std::string_view text) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (typename Json::parse_error const& e) {
    throw invalid_argument(pipeswap::detail::message({"order JSON: malformed at byte ", e.byte, ": ", e.what()}));
  }
}

} // namespace detail

/// JSON of one step (see the header comment for the shape).
template <class Json = nlohmann::ordered_json>
Json to_json(step const& s) {
  return detail::step_json<Json>(s);
}

/// JSON of one order: an array of step objects and nulls.
template <class Json = nlohmann::ordered_json>
Json to_json(order const& o) {
  Json j = Json::array();
  for (entry const& e : o) j.push_back(e ? detail::step_json<Json>(*e) : Json(nullptr));
  return j;
}

/// JSON of several ranks' orders: an array of orders.
template <class Json = nlohmann::ordered_json>
Json to_json(rank_orders const& orders) {
  Json j = Json::array();
  for (order const& o : orders) j.push_back(to_json<Json>(o));
  return j;
}

/// The order a JSON array describes. Throws invalid_argument ("order JSON: entry 3: sub-step 1:
/// 'micro' must be a non-negative integer, got -1") on anything else.
template <class Json>
order order_from_json(Json const& j) {
  return detail::order_from_json_at(j, "");
}

/// The orders of several ranks from an array of orders; errors start with "rank r: entry i".
template <class Json>
rank_orders rank_orders_from_json(Json const& j) {
  if (!j.is_array())
    detail::json_fail("top level", std::string("rank orders must be an array of orders, got ") + j.type_name());
  rank_orders out;
  out.reserve(j.size());
  for (std::size_t r = 0; r < j.size(); ++r)
    out.push_back(detail::order_from_json_at(j[r], pipeswap::detail::message({"rank ", r})));
  return out;
}

/// Parses JSON text into an order; malformed JSON throws invalid_argument with the byte offset.
inline order order_from_json_text(std::string_view text) {
  return order_from_json(detail::parse_json_text<nlohmann::json>(text));
}

/// Parses JSON text into several ranks' orders.
inline rank_orders rank_orders_from_json_text(std::string_view text) {
  return rank_orders_from_json(detail::parse_json_text<nlohmann::json>(text));
}

} // namespace pipeswap::schedule
