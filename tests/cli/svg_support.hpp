// A small strict XML reader for the SVG tests: elements, attributes, text, the XML declaration and
// comments; the five predefined entities and numeric character references. Throws std::runtime_error
// on anything not well-formed (mismatched or unclosed tags, duplicate attributes, a bare '&' or '<').
#pragma once

#include <cctype>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace svg_test {

struct element {
  std::string name;
  std::map<std::string, std::string> attrs;
  std::vector<std::unique_ptr<element>> children;
  std::string text; ///< the character data directly inside, concatenated

  [[nodiscard]] std::string attr(std::string const& k) const {
    auto const it = attrs.find(k);
    if (it == attrs.end()) throw std::runtime_error("<" + name + "> has no attribute '" + k + "'");
    return it->second;
  }
  [[nodiscard]] bool has(std::string const& k) const { return attrs.count(k) != 0; }

  /// Every descendant (depth first, document order) for which `pred` holds.
  void find_all(std::function<bool(element const&)> const& pred, std::vector<element const*>& out) const {
    for (auto const& c : children) {
      if (pred(*c)) out.push_back(c.get());
      c->find_all(pred, out);
    }
  }
  [[nodiscard]] std::vector<element const*> all(std::string const& tag) const {
    std::vector<element const*> out;
    find_all([&](element const& e) { return e.name == tag; }, out);
    return out;
  }
  /// The first direct child named `tag`, or null.
  [[nodiscard]] element const* child(std::string const& tag) const {
    for (auto const& c : children)
      if (c->name == tag) return c.get();
    return nullptr;
  }
};

class parser {
public:
  explicit parser(std::string_view s) : s_(s) {}

  std::unique_ptr<element> document() {
    skip_ws();
    if (starts("<?xml")) {
      auto const end = s_.find("?>", i_);
      if (end == std::string_view::npos) fail("unterminated XML declaration");
      i_ = end + 2;
    }
    skip_misc();
    if (!starts("<")) fail("no root element");
    auto root = parse_element();
    skip_misc();
    if (i_ != s_.size()) fail("content after the root element");
    return root;
  }

private:
  [[noreturn]] void fail(std::string const& what) const {
    throw std::runtime_error("XML: " + what + " at byte " + std::to_string(i_));
  }
  bool starts(std::string_view p) const { return s_.substr(i_, p.size()) == p; }
  void skip_ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  void skip_misc() {
    for (;;) {
      skip_ws();
      if (!starts("<!--")) return;
      auto const end = s_.find("-->", i_);
      if (end == std::string_view::npos) fail("unterminated comment");
      i_ = end + 3;
    }
  }
  std::string name() {
    auto const b = i_;
    while (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '-' || s_[i_] == '_' ||
                              s_[i_] == ':' || s_[i_] == '.'))
      ++i_;
    if (i_ == b) fail("expected a name");
    return std::string(s_.substr(b, i_ - b));
  }
  std::string decode(std::string_view raw) const {
    std::string out;
    for (std::size_t k = 0; k < raw.size(); ++k) {
      char const c = raw[k];
      if (c == '<') fail("'<' in character data");
      if (c != '&') {
        out += c;
        continue;
      }
      auto const semi = raw.find(';', k);
      if (semi == std::string_view::npos) fail("bare '&'");
      auto const ent = raw.substr(k + 1, semi - k - 1);
      if (ent == "amp")
        out += '&';
      else if (ent == "lt")
        out += '<';
      else if (ent == "gt")
        out += '>';
      else if (ent == "quot")
        out += '"';
      else if (ent == "apos")
        out += '\'';
      else if (!ent.empty() && ent[0] == '#') {
        unsigned long const v = ent.size() > 1 && ent[1] == 'x' ? std::stoul(std::string(ent.substr(2)), nullptr, 16)
                                                                : std::stoul(std::string(ent.substr(1)));
        if (v >= 0x80) fail("non-ASCII character reference (not needed here)");
        out += static_cast<char>(v);
      } else {
        fail("unknown entity &" + std::string(ent) + ";");
      }
      k = semi;
    }
    return out;
  }
  std::unique_ptr<element> parse_element() {
    ++i_; // '<'
    auto e = std::make_unique<element>();
    e->name = name();
    for (;;) {
      skip_ws();
      if (starts("/>")) {
        i_ += 2;
        return e;
      }
      if (starts(">")) {
        ++i_;
        break;
      }
      auto const k = name();
      skip_ws();
      if (!starts("=")) fail("expected '=' after attribute " + k);
      ++i_;
      skip_ws();
      if (i_ >= s_.size() || (s_[i_] != '"' && s_[i_] != '\'')) fail("unquoted attribute " + k);
      char const q = s_[i_++];
      auto const end = s_.find(q, i_);
      if (end == std::string_view::npos) fail("unterminated attribute " + k);
      if (!e->attrs.emplace(k, decode(s_.substr(i_, end - i_))).second) fail("duplicate attribute " + k);
      i_ = end + 1;
    }
    for (;;) {
      auto const lt = s_.find('<', i_);
      if (lt == std::string_view::npos) fail("unclosed <" + e->name + ">");
      e->text += decode(s_.substr(i_, lt - i_));
      i_ = lt;
      if (starts("<!--")) {
        skip_misc();
        continue;
      }
      if (starts("</")) {
        i_ += 2;
        auto const n = name();
        if (n != e->name) fail("</" + n + "> closes <" + e->name + ">");
        skip_ws();
        if (!starts(">")) fail("expected '>'");
        ++i_;
        return e;
      }
      e->children.push_back(parse_element());
    }
  }

  std::string_view s_;
  std::size_t i_ = 0;
};

inline std::unique_ptr<element> parse(std::string_view text) { return parser(text).document(); }

/// The vertices of an SVG path made of absolute M, H and V commands (what the chart writes).
struct path_point {
  double x, y;
};
inline std::vector<path_point> path_vertices(std::string const& d) {
  std::vector<path_point> out;
  std::size_t i = 0;
  double x = 0, y = 0;
  auto number = [&] {
    while (i < d.size() && d[i] == ' ') ++i;
    std::size_t used = 0;
    double const v = std::stod(d.substr(i), &used);
    i += used;
    return v;
  };
  while (i < d.size()) {
    char const c = d[i++];
    if (c == ' ') continue;
    if (c == 'M') {
      x = number();
      y = number();
    } else if (c == 'H') {
      x = number();
    } else if (c == 'V') {
      y = number();
    } else {
      throw std::runtime_error(std::string("path: unexpected command '") + c + "'");
    }
    out.push_back({x, y});
  }
  return out;
}

} // namespace svg_test
