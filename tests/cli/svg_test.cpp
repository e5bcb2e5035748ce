// The SVG chart: the document parses back as well-formed XML with one titled path per series, one
// dashed line per level, both axes with their ticks and labels and a legend; the path read back through
// the axes' ticks gives the series' values; long series are reduced without losing their peaks; the
// file refers to nothing outside itself.
#define BOOST_TEST_MODULE sim_svg
#include <boost/test/unit_test.hpp>

#include "svg_support.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <pipeswap/sim/svg.hpp>

namespace svg = pipeswap::sim::svg;
using svg_test::element;

namespace {

svg::chart sample() {
  svg::chart c;
  c.title = "Memory of rank 0";
  c.x_label = "time (s)";
  c.y_label = "device memory (GB)";
  c.lines.push_back({"no swap", "#0072b2", {{0, 40}, {1, 90}, {2.5, 130}, {4, 60}, {5, 40}}, false});
  c.lines.push_back({"both", "#009e73", {{0, 20}, {1.5, 55}, {3, 35}, {5, 20}}, true});
  c.levels.push_back({"device capacity", 141, "#d55e00"});
  return c;
}

// Elements whose `class` attribute is `cls`.
std::vector<element const*> with_class(element const& root, std::string const& cls) {
  std::vector<element const*> out;
  root.find_all([&](element const& e) { return e.has("class") && e.attr("class") == cls; }, out);
  return out;
}

// The chart's mapping from data to pixels, recovered from its tick labels.
struct axes {
  std::vector<double> xv, xp, yv, yp; // tick values and their pixel positions
  double x_to_px(double v) const {
    return xp.front() + (v - xv.front()) / (xv.back() - xv.front()) * (xp.back() - xp.front());
  }
  double y_to_px(double v) const {
    return yp.front() + (v - yv.front()) / (yv.back() - yv.front()) * (yp.back() - yp.front());
  }
  double px_to_y(double p) const {
    return yv.front() + (p - yp.front()) / (yp.back() - yp.front()) * (yv.back() - yv.front());
  }
};

axes read_axes(element const& root) {
  auto const ticks = with_class(root, "ticks");
  BOOST_REQUIRE_EQUAL(ticks.size(), 1u);
  axes a;
  for (auto const& t : ticks[0]->children) {
    if (t->name != "text" || !t->has("text-anchor") || t->has("transform")) continue;
    if (t->text.empty() || t->text.find_first_not_of("-0123456789.") != std::string::npos) continue; // a label
    double const v = std::stod(t->text);
    if (t->attr("text-anchor") == "middle") {
      a.xv.push_back(v);
      a.xp.push_back(std::stod(t->attr("x")));
    } else if (t->attr("text-anchor") == "end") {
      a.yv.push_back(v);
      a.yp.push_back(std::stod(t->attr("y")) - 4); // labels sit 4 px below their grid line
    }
  }
  BOOST_REQUIRE(a.xv.size() >= 2u);
  BOOST_REQUIRE(a.yv.size() >= 2u);
  return a;
}

// The text of the <title> of the <g> around `e`'s group: series and levels are each in a titled group.
std::string group_title(element const& g) {
  auto const* t = g.child("title");
  return t ? t->text : std::string();
}

} // namespace

BOOST_AUTO_TEST_CASE(nice_ticks_cover_the_range_with_round_steps) {
  BOOST_TEST(svg::nice_ticks(0, 238.9) == (std::vector<double>{0, 50, 100, 150, 200, 250}),
             boost::test_tools::per_element());
  BOOST_TEST(svg::nice_ticks(0, 1) == (std::vector<double>{0, 0.2, 0.4, 0.6, 0.8, 1}),
             boost::test_tools::tolerance(1e-12) << boost::test_tools::per_element());
  BOOST_TEST(svg::nice_ticks(3, 3).size() >= 2u); // an empty range still gets an axis
  BOOST_TEST(svg::nice_ticks(NAN, 1).empty());
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> mag(-6, 12), frac(0, 1);
  for (int i = 0; i < 2000; ++i) {
    // Ranges no narrower than a thousandth of their magnitude (a chart's ranges start at 0).
    double const width = std::pow(10.0, mag(rng)) * (0.001 + frac(rng));
    double const lo = width * (frac(rng) * 2000 - 1000) * frac(rng), hi = lo + width;
    auto const t = svg::nice_ticks(lo, hi);
    BOOST_REQUIRE(t.size() >= 2u);
    double const step = t[1] - t[0];
    BOOST_TEST(t.front() <= lo);
    BOOST_TEST(t.back() >= hi - step * 1e-6);
    BOOST_TEST(t.size() <= 14u);
    double const m = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
    bool const round =
        std::abs(m - 1) < 1e-6 || std::abs(m - 2) < 1e-6 || std::abs(m - 5) < 1e-6 || std::abs(m - 10) < 1e-6;
    BOOST_TEST(round, "step " << step << " for [" << lo << ", " << hi << "]");
  }
}

BOOST_AUTO_TEST_CASE(the_document_is_well_formed_with_series_levels_axes_and_legend) {
  auto const c = sample();
  auto const text = svg::render(c);
  BOOST_TEST(text.rfind("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n", 0) == 0);
  auto const root = svg_test::parse(text);
  BOOST_TEST(root->name == "svg");
  BOOST_TEST(root->attr("xmlns") == "http://www.w3.org/2000/svg");
  BOOST_TEST(root->attr("width") == "960");
  BOOST_TEST(root->attr("viewBox") == "0 0 960 540");
  BOOST_REQUIRE(root->child("title") != nullptr);
  BOOST_TEST(root->child("title")->text == c.title);

  // One path per series, in a group titled with the series' name, in its colour and dash.
  std::vector<element const*> groups;
  root->find_all([](element const& e) { return e.name == "g" && e.child("title") != nullptr; }, groups);
  BOOST_REQUIRE_EQUAL(groups.size(), 3u);
  for (std::size_t i = 0; i < 2; ++i) {
    BOOST_TEST(group_title(*groups[i]) == c.lines[i].name);
    auto const* p = groups[i]->child("path");
    BOOST_REQUIRE(p != nullptr);
    BOOST_TEST(p->attr("class") == "series");
    BOOST_TEST(p->attr("stroke") == c.lines[i].color);
    BOOST_TEST(p->attr("fill") == "none");
    BOOST_TEST(p->has("stroke-dasharray") == c.lines[i].dashed);
  }
  BOOST_TEST(with_class(*root, "series").size() == 2u);
  BOOST_TEST(group_title(*groups[2]) == "device capacity");
  auto const levels = with_class(*root, "level");
  BOOST_REQUIRE_EQUAL(levels.size(), 1u);
  BOOST_TEST(levels[0]->name == "line");
  BOOST_TEST(levels[0]->has("stroke-dasharray"));
  BOOST_TEST(levels[0]->attr("y1") == levels[0]->attr("y2")); // horizontal

  // Axes: the x ticks cover 0..5 s, the y ticks 0 up to above the capacity; the axis labels are there.
  auto const a = read_axes(*root);
  BOOST_TEST(a.xv.front() == 0.0);
  BOOST_TEST(a.xv.back() >= 5.0);
  BOOST_TEST(a.yv.front() == 0.0);
  BOOST_TEST(a.yv.back() >= 141.0);
  BOOST_TEST(std::is_sorted(a.xp.begin(), a.xp.end()));   // x grows to the right
  BOOST_TEST(std::is_sorted(a.yp.rbegin(), a.yp.rend())); // y grows upwards
  bool x_label = false, y_label = false;
  for (auto const* t : root->all("text")) {
    x_label = x_label || t->text == c.x_label;
    y_label = y_label || (t->text == c.y_label && t->attr("transform").find("rotate(-90)") != std::string::npos);
  }
  BOOST_TEST(x_label);
  BOOST_TEST(y_label);

  // The legend names every series and level.
  auto const legend = with_class(*root, "legend");
  BOOST_REQUIRE_EQUAL(legend.size(), 1u);
  std::vector<std::string> names;
  for (auto const* t : legend[0]->all("text")) names.push_back(t->text);
  BOOST_TEST(names == (std::vector<std::string>{"no swap", "both", "device capacity"}),
             boost::test_tools::per_element());
  BOOST_TEST(legend[0]->all("line").size() == 3u);
}

BOOST_AUTO_TEST_CASE(the_legend_fits_in_the_picture) {
  auto c = sample();
  c.lines[0].name = "optimizer swap (packed, 16 batches) + activation groups with gap >= 9 (peak 133.3 GB)";
  for (int width : {960, 300}) {
    c.width = width;
    auto const root = svg_test::parse(svg::render(c));
    double const w = std::stod(root->attr("width"));
    BOOST_TEST(w >= width);
    auto const plot = with_class(*root, "axes").at(0)->child("rect");
    BOOST_REQUIRE(plot != nullptr);
    BOOST_TEST(std::stod(plot->attr("width")) >= 200.0);                 // the plot keeps a usable width
    for (auto const* t : with_class(*root, "legend").at(0)->all("text")) // about 7 px a character
      BOOST_TEST(std::stod(t->attr("x")) + 7.0 * static_cast<double>(t->text.size()) <= w, t->text);
  }
}

BOOST_AUTO_TEST_CASE(the_paths_read_back_through_the_axes_give_the_series) {
  auto const c = sample();
  auto const root = svg_test::parse(svg::render(c));
  auto const a = read_axes(*root);
  auto const paths = with_class(*root, "series");
  BOOST_REQUIRE_EQUAL(paths.size(), c.lines.size());
  double const tol = 0.06; // coordinates are written with one decimal
  for (std::size_t i = 0; i < c.lines.size(); ++i) {
    auto const v = svg_test::path_vertices(paths[i]->attr("d"));
    auto const& pts = c.lines[i].points;
    // A step function: after the start, every other vertex moves right at the old level, then up or
    // down at the new x. So the vertices are exactly (x_k, y_{k-1}) and (x_k, y_k).
    BOOST_REQUIRE_EQUAL(v.size(), 2 * pts.size() - 1);
    for (std::size_t k = 0; k < pts.size(); ++k) {
      auto const& at = v[k == 0 ? 0 : 2 * k];
      BOOST_TEST(std::abs(at.x - a.x_to_px(pts[k].x)) < tol, "series " << i << " point " << k);
      BOOST_TEST(std::abs(at.y - a.y_to_px(pts[k].y)) < tol, "series " << i << " point " << k);
      BOOST_TEST(std::abs(a.px_to_y(at.y) - pts[k].y) < 0.2);
      if (k > 0) {
        auto const& corner = v[2 * k - 1];
        BOOST_TEST(std::abs(corner.x - at.x) < tol);
        BOOST_TEST(std::abs(corner.y - a.y_to_px(pts[k - 1].y)) < tol);
      }
    }
  }
  auto const levels = with_class(*root, "level");
  BOOST_TEST(std::abs(std::stod(levels[0]->attr("y1")) - a.y_to_px(141)) < tol);
  BOOST_TEST(std::abs(std::stod(levels[0]->attr("x1")) - a.xp.front()) < tol);
  BOOST_TEST(std::abs(std::stod(levels[0]->attr("x2")) - a.x_to_px(a.xv.back())) < tol);
}

BOOST_AUTO_TEST_CASE(long_series_are_reduced_and_keep_their_peaks) {
  svg::chart c;
  c.title = "long";
  svg::series s{"noise", "#000000", {}, false};
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> val(10, 60);
  std::size_t const n = 200'000, spike = 123'457, dip = 7'001;
  for (std::size_t k = 0; k < n; ++k) {
    double y = val(rng);
    if (k == spike) y = 97.25;
    if (k == dip) y = 1.5;
    s.points.push_back({static_cast<double>(k) * 1e-3, y});
  }
  c.lines.push_back(s);
  auto const text = svg::render(c);
  BOOST_TEST(text.size() < 200'000u); // at most a few vertices per half-pixel column
  auto const root = svg_test::parse(text);
  auto const a = read_axes(*root);
  auto const v = svg_test::path_vertices(with_class(*root, "series").at(0)->attr("d"));
  auto const [lo, hi] = std::minmax_element(v.begin(), v.end(), [](auto p, auto q) { return p.y < q.y; });
  BOOST_TEST(std::abs(a.px_to_y(lo->y) - 97.25) < 0.2); // the highest value is the lowest pixel
  BOOST_TEST(std::abs(a.px_to_y(hi->y) - 1.5) < 0.2);
  BOOST_TEST(std::abs(lo->x - a.x_to_px(spike * 1e-3)) < 0.6);
  BOOST_TEST(std::abs(v.back().x - a.x_to_px((n - 1) * 1e-3)) < 0.6);
  BOOST_TEST(std::abs(a.px_to_y(v.back().y) - s.points.back().y) < 0.2); // the last value is kept
}

BOOST_AUTO_TEST_CASE(text_is_escaped_and_the_file_is_self_contained) {
  auto c = sample();
  c.title = "a < b & \"c\" 'd' >\x01";
  c.lines[0].name = "<script>alert(1)</script>";
  auto const text = svg::render(c);
  auto const root = svg_test::parse(text);                         // would throw on a bare '<' or '&'
  BOOST_TEST(root->child("title")->text == "a < b & \"c\" 'd' >"); // the control character is dropped
  BOOST_TEST(root->all("script").empty());
  std::vector<element const*> any;
  root->find_all([](element const&) { return true; }, any);
  for (auto const* e : any) {
    for (auto const& tag : {"script", "style", "image", "use", "foreignObject", "a", "link"})
      BOOST_TEST(e->name != tag);
    for (auto const& [k, val] : e->attrs) {
      BOOST_TEST(k.find("href") == std::string::npos, "<" << e->name << " " << k << ">");
      BOOST_TEST(val.find("url(") == std::string::npos, "<" << e->name << " " << k << "=" << val << ">");
      BOOST_TEST(k.rfind("on", 0) != 0, "event handler " << k);
    }
  }
  BOOST_TEST(text.find("http") == text.find("http://www.w3.org/2000/svg")); // only the namespace
}

BOOST_AUTO_TEST_CASE(degenerate_charts_still_render) {
  for (auto const& c :
       {svg::chart{}, svg::chart{"one point", "x", "y", {{"p", "#000000", {{2, 3}}, false}}, {}, 960, 540},
        svg::chart{"flat", "x", "y", {{"z", "#000000", {{0, 0}, {1, 0}}, false}}, {}, 10, 10}}) {
    auto const text = svg::render(c);
    BOOST_TEST(text.find("nan") == std::string::npos);
    BOOST_TEST(text.find("inf") == std::string::npos);
    auto const root = svg_test::parse(text);
    BOOST_TEST(with_class(*root, "series").size() == c.lines.size());
    for (auto const* r : root->all("rect")) // a too small size still leaves room for the plot
      if (r->has("x")) BOOST_TEST((std::stod(r->attr("width")) > 0 && std::stod(r->attr("height")) > 0));
  }
}

// Markers (the alternatives chart of `pipeswap plan --svg`): each a circle at its (x, y) in the
// plot's coordinates, with its name as its title and a legend entry; they widen the axes to contain
// them.
BOOST_AUTO_TEST_CASE(markers_are_drawn_at_their_points_with_a_legend_entry) {
  svg::chart c;
  c.title = "alternatives";
  c.markers = {{"no swap", 20.0, 255.0, "#0072b2"}, {"the plan", 22.0, 140.0, "#e69f00"}};
  c.levels.push_back({"budget", 141.0, "#d55e00"});
  auto const root = svg_test::parse(svg::render(c));
  auto const dots = with_class(*root, "marker");
  BOOST_REQUIRE(dots.size() == 2u);
  // Higher y is higher on the page (smaller cy); larger x further right.
  BOOST_TEST(std::stod(dots[0]->attr("cy")) < std::stod(dots[1]->attr("cy")));
  BOOST_TEST(std::stod(dots[0]->attr("cx")) < std::stod(dots[1]->attr("cx")));
  BOOST_TEST(root->all("circle").size() == 4u); // two points, two legend entries
  auto const text = svg::render(c);
  BOOST_TEST(text.find("<title>no swap</title>") != std::string::npos);
  BOOST_TEST(text.find("<title>the plan</title>") != std::string::npos);
}
