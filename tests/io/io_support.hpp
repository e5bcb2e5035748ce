// Helpers shared by the file-layer tests: building files by hand, scratch directories.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include <pipeswap/io/safetensors.hpp>

namespace io_test {

using bytes = std::vector<std::byte>;

/// `n` as the 8-byte little-endian header length field.
inline bytes length_field(std::uint64_t n) {
  bytes b(8);
  for (auto& x : b) {
    x = static_cast<std::byte>(n & 0xFF);
    n >>= 8;
  }
  return b;
}

/// A file made of a length field equal to header.size(), `header` and `data_bytes` data bytes.
inline bytes make_file(std::string_view header, std::size_t data_bytes = 0) {
  bytes b = length_field(header.size());
  for (char c : header) b.push_back(static_cast<std::byte>(c));
  for (std::size_t i = 0; i < data_bytes; ++i) b.push_back(static_cast<std::byte>(i * 7 + 1));
  return b;
}

inline bytes to_bytes(std::string_view s) {
  bytes b;
  for (char c : s) b.push_back(static_cast<std::byte>(c));
  return b;
}

inline std::string to_string(std::span<std::byte const> b) {
  return {reinterpret_cast<char const*>(b.data()), b.size()};
}

/// Deterministic pseudo-random bytes.
inline bytes random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 g(seed);
  bytes b(n);
  for (auto& x : b) x = static_cast<std::byte>(g() & 0xFF);
  return b;
}

template <class T>
std::span<std::byte const> as_bytes_of(std::vector<T> const& v) {
  return std::as_bytes(std::span(v));
}

/// A fresh directory under the system temp dir, removed (with its contents) on destruction.
class scratch_dir {
public:
  scratch_dir() {
    static int n = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("pipeswap-io-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all, std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(path_, ec);
  }
  scratch_dir(scratch_dir const&) = delete;
  scratch_dir& operator=(scratch_dir const&) = delete;

  [[nodiscard]] std::filesystem::path const& path() const { return path_; }
  [[nodiscard]] std::filesystem::path operator/(std::string_view name) const { return path_ / name; }

  /// Names of the entries in the directory, sorted.
  [[nodiscard]] std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (auto const& e : std::filesystem::directory_iterator(path_)) {
      out.push_back(e.path().filename().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

private:
  std::filesystem::path path_;
};

inline bytes read_file(std::filesystem::path const& p) {
  std::ifstream f(p, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return to_bytes(s);
}

inline void write_file(std::filesystem::path const& p, std::span<std::byte const> b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<char const*>(b.data()), static_cast<std::streamsize>(b.size()));
}

/// what() of the E that `f` throws, or "<no exception>". Other exception types propagate.
template <class E, class F>
std::string thrown_message(F&& f) {
  try {
    f();
  } catch (E const& e) {
    return e.what();
  }
  return "<no exception>";
}

} // namespace io_test
