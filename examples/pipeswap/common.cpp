#include "common.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include <pipeswap/sim/scenario_json.hpp>

namespace pipeswap_cli {

std::string read_input(std::string const& path) {
  if (path.empty() || path == "-") {
    if (::isatty(STDIN_FILENO)) throw bad_input("no input: give a file name or pipe JSON into standard input");
    std::ostringstream ss;
    ss << std::cin.rdbuf();
    if (std::cin.bad()) throw bad_input("cannot read standard input");
    return ss.str();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw bad_input("cannot open '" + path + "': " + std::strerror(errno));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw bad_input("cannot read '" + path + "'");
  return text;
}

nlohmann::json parse_json(std::string const& text, std::string const& what) {
  try {
    return nlohmann::json::parse(text);
  } catch (nlohmann::json::parse_error const& e) {
    throw bad_input(what + ": malformed JSON at byte " + std::to_string(e.byte) + ": " + e.what());
  }
}

void write_file(std::string const& path, std::string const& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw bad_input("cannot write '" + path + "': " + std::strerror(errno));
  out << text;
  out.close();
  if (!out) throw bad_input("cannot write '" + path + "'");
}

pipeswap::sim::scenario load_scenario(std::string const& path) {
  if (path.empty()) return pipeswap::sim::scenario{};
  auto const text = read_input(path);
  try {
    return pipeswap::sim::scenario_from_json_text(text);
  } catch (pipeswap::invalid_argument const& e) {
    throw pipeswap::invalid_argument((path == "-" ? std::string("<stdin>") : path) + ": " + e.what());
  }
}

progress_meter::progress_meter(std::string label, progress_mode mode)
    : label_(std::move(label)), start_(std::chrono::steady_clock::now()), last_draw_(start_) {
  tty_ = ::isatty(STDERR_FILENO) != 0;
  enabled_ = mode == progress_mode::always || (mode == progress_mode::automatic && tty_);
  delay_ = mode == progress_mode::automatic;
}

progress_meter::~progress_meter() {
  if (!finished_) {
    try {
      finish();
    } catch (...) { // a destructor never throws
    }
  }
}

void progress_meter::update(double fraction, std::string const& what) {
  if (!enabled_ || finished_) return;
  auto const now = std::chrono::steady_clock::now();
  if (delay_ && now - start_ < std::chrono::seconds(1)) return;
  fraction = std::clamp(fraction, 0.0, 1.0);
  int const pct = static_cast<int>(std::floor(fraction * 100.0));
  if (tty_) {
    if (shown_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    int const width = 30, full = static_cast<int>(fraction * width);
    std::string bar(static_cast<std::size_t>(full), '#');
    bar.resize(width, '.');
    double const secs = std::chrono::duration<double>(now - start_).count();
    std::fprintf(stderr, "\r\033[K%s [%s] %3d%%  %.1f s%s%s", label_.c_str(), bar.c_str(), pct, secs,
                 what.empty() ? "" : "  ", what.c_str());
  } else {
    int const tenth = pct / 10;
    if (tenth <= last_tenth_) return;
    last_tenth_ = tenth;
    std::fprintf(stderr, "%s: %d%%\n", label_.c_str(), tenth * 10);
  }
  std::fflush(stderr);
  shown_ = true;
  last_draw_ = now;
}

void progress_meter::finish() {
  if (finished_) return;
  if (enabled_ && (shown_ || !delay_)) {
    if (tty_) {
      if (shown_) std::fputs("\r\033[K", stderr);
    } else if (last_tenth_ < 10)
      std::fprintf(stderr, "%s: 100%%\n", label_.c_str());
    std::fflush(stderr);
  }
  finished_ = true;
}

} // namespace pipeswap_cli
