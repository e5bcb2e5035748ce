// pipeswap — a small self-contained SVG line chart (no scripts, no external fonts or style sheets).
//
// Series are step functions — a value holds until the next point — which is what memory over time
// is; levels are horizontal dashed lines (a device's capacity). The chart has a title, both axes with
// "nice" ticks (1, 2, 5 × 10^k), grid lines, axis labels and a legend. Series with more points than
// the plot has pixel columns are reduced, per column, to the first, lowest, highest and last value,
// so every peak stays visible and the file stays small.
//
// Each series is a `<path class="series">` and each level a `<line class="level">`, each inside a
// `<g>` whose `<title>` is its name, so tools (and tests) can pick them out.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pipeswap::sim::svg {

struct point {
  double x = 0, y = 0;
};

/// A step-function line: y holds from one point's x until the next point's x. Points must be sorted
/// by x (equal x are allowed: a jump).
struct series {
  std::string name;
  std::string color = "#0072b2";
  std::vector<point> points;
  bool dashed = false;
};

/// One point drawn as a dot with its name beside it (a scatter chart's point).
struct marker {
  std::string name;
  double x = 0, y = 0;
  std::string color = "#0072b2";
};

/// A horizontal line across the plot at height y, dashed.
struct level {
  std::string name;
  double y = 0;
  std::string color = "#d55e00";
};

struct chart {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<series> lines;
  std::vector<level> levels;
  int width = 960;
  int height = 540;
  std::vector<marker> markers{}; ///< points (a scatter chart), each with its legend entry
};

/// Colour-blind-safe colours (Okabe and Ito, 2008) for up to eight series.
inline constexpr std::string_view palette[] = {"#0072b2", "#e69f00", "#009e73", "#cc79a7",
                                               "#56b4e9", "#f0e442", "#000000", "#d55e00"};

/// Tick values covering [lo, hi]: multiples of 1, 2 or 5 × 10^k, about `target` of them. The first
/// tick is <= lo and the last >= hi. Empty when the range is not finite.
inline std::vector<double> nice_ticks(double lo, double hi, int target = 6) {
  std::vector<double> out;
  if (!std::isfinite(lo) || !std::isfinite(hi)) return out;
  if (hi < lo) std::swap(lo, hi);
  if (hi == lo) hi = lo + 1;
  double const raw = (hi - lo) / std::max(1, target);
  double const mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  double const first = std::floor(lo / step) * step;
  for (int i = 0;; ++i) {
    double const v = first + i * step;
    out.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
    if (v >= hi - step * 1e-9 || i > 1000) break;
  }
  return out;
}

namespace detail {

inline std::string xml_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
    case '&': out += "&amp;"; break;
    case '<': out += "&lt;"; break;
    case '>': out += "&gt;"; break;
    case '"': out += "&quot;"; break;
    case '\'': out += "&apos;"; break;
    default:
      // Control characters are not allowed in XML 1.0 text.
      if (static_cast<unsigned char>(c) >= 0x20 || c == '\n' || c == '\t') out += c;
    }
  }
  return out;
}

inline std::string num(double v, int decimals = 1) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  std::string s = buf;
  if (s == "-0" || s == "-0.0" || s == "-0.00") s = s.substr(1);
  return s;
}

// Tick label: as few decimals as the step needs.
inline std::string tick_label(double v, double step) {
  int decimals = 0;
  while (decimals < 6 && std::abs(step * std::pow(10.0, decimals) - std::round(step * std::pow(10.0, decimals))) > 1e-6)
    ++decimals;
  return num(v, decimals);
}

} // namespace detail

/// The chart as an SVG document.
inline std::string render(chart const& c) {
  using detail::num;
  using detail::xml_escape;
  // The legend, right of the plot, is as wide as its longest name (about 7 px a character at 12 px).
  std::size_t longest = 0;
  for (auto const& s : c.lines) longest = std::max(longest, s.name.size());
  for (auto const& m : c.markers) longest = std::max(longest, m.name.size());
  for (auto const& l : c.levels) longest = std::max(longest, l.name.size());
  double const left = 80, right = 70 + 7.0 * static_cast<double>(longest), top = 50, bottom = 60;
  // Never smaller than the margins plus a usable plot.
  double const w = std::max(static_cast<double>(c.width), left + right + 200), h = std::max(200, c.height);
  double const px0 = left, px1 = w - right, py0 = h - bottom, py1 = top;

  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymax = 0;
  for (auto const& s : c.lines) {
    for (auto const& p : s.points) {
      xmin = std::min(xmin, p.x);
      xmax = std::max(xmax, p.x);
      ymax = std::max(ymax, p.y);
    }
  }
  for (auto const& l : c.levels) ymax = std::max(ymax, l.y);
  for (auto const& m : c.markers) {
    xmin = std::min(xmin, m.x);
    xmax = std::max(xmax, m.x);
    ymax = std::max(ymax, m.y);
  }
  if (!std::isfinite(xmin)) xmin = 0, xmax = 1;
  xmin = std::min(xmin, 0.0);
  auto const xt = nice_ticks(xmin, xmax);
  auto const yt = nice_ticks(0, ymax * 1.04);
  double const x0 = xt.front(), x1 = xt.back(), y0 = yt.front(), y1 = yt.back();
  auto X = [&](double x) { return px0 + (x - x0) / (x1 - x0) * (px1 - px0); };
  auto Y = [&](double y) { return py0 - (y - y0) / (y1 - y0) * (py0 - py1); };

  std::string o;
  o += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  o += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(w, 0) + "\" height=\"" + num(h, 0) +
       "\" viewBox=\"0 0 " + num(w, 0) + " " + num(h, 0) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o += "<title>" + xml_escape(c.title) + "</title>\n";
  o += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  o += "<text x=\"" + num(w / 2, 0) + "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">" + xml_escape(c.title) +
       "</text>\n";

  // Grid, ticks and axes.
  o += "<g class=\"axes\" stroke=\"#dddddd\" stroke-width=\"1\">\n";
  for (double v : xt)
    o += "<line x1=\"" + num(X(v)) + "\" y1=\"" + num(py0) + "\" x2=\"" + num(X(v)) + "\" y2=\"" + num(py1) + "\"/>\n";
  for (double v : yt)
    o += "<line x1=\"" + num(px0) + "\" y1=\"" + num(Y(v)) + "\" x2=\"" + num(px1) + "\" y2=\"" + num(Y(v)) + "\"/>\n";
  o += "<rect x=\"" + num(px0) + "\" y=\"" + num(py1) + "\" width=\"" + num(px1 - px0) + "\" height=\"" +
       num(py0 - py1) + "\" fill=\"none\" stroke=\"#333333\"/>\n";
  o += "</g>\n<g class=\"ticks\" fill=\"#333333\">\n";
  double const xstep = xt.size() > 1 ? xt[1] - xt[0] : 1, ystep = yt.size() > 1 ? yt[1] - yt[0] : 1;
  for (double v : xt)
    o += "<text x=\"" + num(X(v)) + "\" y=\"" + num(py0 + 18) + "\" text-anchor=\"middle\">" +
         detail::tick_label(v, xstep) + "</text>\n";
  for (double v : yt)
    o += "<text x=\"" + num(px0 - 8) + "\" y=\"" + num(Y(v) + 4) + "\" text-anchor=\"end\">" +
         detail::tick_label(v, ystep) + "</text>\n";
  o += "<text x=\"" + num((px0 + px1) / 2) + "\" y=\"" + num(h - 18) + "\" text-anchor=\"middle\">" +
       xml_escape(c.x_label) + "</text>\n";
  o += "<text transform=\"translate(20 " + num((py0 + py1) / 2) + ") rotate(-90)\" text-anchor=\"middle\">" +
       xml_escape(c.y_label) + "</text>\n</g>\n";

  // Series: step paths, reduced to first/min/max/last per half-pixel column.
  for (auto const& s : c.lines) {
    o += "<g><title>" + xml_escape(s.name) + "</title>\n<path class=\"series\" fill=\"none\" stroke=\"" +
         xml_escape(s.color) + "\" stroke-width=\"1.6\"" + (s.dashed ? " stroke-dasharray=\"6 3\"" : "") + " d=\"";
    bool started = false;
    double last_y = 0;
    std::size_t i = 0;
    auto const& pts = s.points;
    while (i < pts.size()) {
      double const col = std::round(X(pts[i].x) * 2) / 2;
      double lo = pts[i].y, hi = pts[i].y;
      std::size_t j = i;
      for (; j < pts.size() && std::round(X(pts[j].x) * 2) / 2 == col; ++j) {
        lo = std::min(lo, pts[j].y);
        hi = std::max(hi, pts[j].y);
      }
      double const first = pts[i].y, last = pts[j - 1].y;
      if (!started) {
        o += "M" + num(col) + " " + num(Y(first));
        started = true;
      } else {
        o += " H" + num(col);
        if (first != last_y) o += " V" + num(Y(first));
      }
      for (double v : {lo, hi, last})
        if (lo != hi || v != first) o += " V" + num(Y(v));
      last_y = last;
      i = j;
    }
    o += "\"/>\n</g>\n";
  }
  for (auto const& l : c.levels) {
    o += "<g><title>" + xml_escape(l.name) + "</title>\n<line class=\"level\" x1=\"" + num(px0) + "\" y1=\"" +
         num(Y(l.y)) + "\" x2=\"" + num(px1) + "\" y2=\"" + num(Y(l.y)) + "\" stroke=\"" + xml_escape(l.color) +
         "\" stroke-width=\"1.4\" stroke-dasharray=\"8 4\"/>\n</g>\n";
  }

  for (auto const& m : c.markers) {
    o += "<g><title>" + xml_escape(m.name) + "</title>\n<circle class=\"marker\" cx=\"" + num(X(m.x)) + "\" cy=\"" +
         num(Y(m.y)) + "\" r=\"5\" fill=\"" + xml_escape(m.color) + "\"/>\n</g>\n";
  }

  // Legend, right of the plot.
  o += "<g class=\"legend\">\n";
  double ly = py1 + 8;
  auto entry = [&](std::string const& name, std::string const& color, bool dashed) {
    o += "<line x1=\"" + num(px1 + 16) + "\" y1=\"" + num(ly) + "\" x2=\"" + num(px1 + 44) + "\" y2=\"" + num(ly) +
         "\" stroke=\"" + xml_escape(color) + "\" stroke-width=\"2\"" + (dashed ? " stroke-dasharray=\"6 3\"" : "") +
         "/>\n<text x=\"" + num(px1 + 50) + "\" y=\"" + num(ly + 4) + "\">" + xml_escape(name) + "</text>\n";
    ly += 20;
  };
  for (auto const& s : c.lines) entry(s.name, s.color, s.dashed);
  for (auto const& l : c.levels) entry(l.name, l.color, true);
  for (auto const& m : c.markers) {
    o += "<circle cx=\"" + num(px1 + 30) + "\" cy=\"" + num(ly) + "\" r=\"5\" fill=\"" + xml_escape(m.color) +
         "\"/>\n<text x=\"" + num(px1 + 50) + "\" y=\"" + num(ly + 4) + "\">" + xml_escape(m.name) + "</text>\n";
    ly += 20;
  }
  o += "</g>\n</svg>\n";
  return o;
}

} // namespace pipeswap::sim::svg
