// pipeswap — the POSIX calls of the file layer, wrapped once: owning descriptors and mappings,
// EINTR retries, errno turned into io_error. Linux is the target; nothing else includes <unistd.h>.
#pragma once

#include <cerrno>
#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pipeswap/io/error.hpp>

namespace pipeswap::io::detail {

/// strerror(err), thread-safe.
inline std::string errno_message(int err) { return std::generic_category().message(err); }

/// `call("path"): strerror(err)`, the core of every io_error message.
inline std::string syscall_text(std::string_view call, std::filesystem::path const& path, int err) {
  std::string s(call);
  s += "(\"";
  s += path.native();
  s += "\"): ";
  s += errno_message(err);
  return s;
}

[[noreturn]] inline void throw_io(std::string_view prefix, std::string_view call, std::filesystem::path const& path,
                                  int err, std::string_view suffix = {}) {
  std::string what(prefix);
  what += syscall_text(call, path, err);
  what += suffix;
  throw io_error(what, std::string(call), path, err);
}

/// Calls `f` until it does not fail with EINTR.
template <class F>
auto retry_eintr(F&& f) -> decltype(f()) {
  for (;;) {
    auto r = f();
    if (r != -1 || errno != EINTR) return r;
  }
}

/// An owned file descriptor; closed (errors ignored) on destruction. close() reports errors.
class unique_fd {
public:
  unique_fd() noexcept = default;
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  unique_fd(unique_fd const&) = delete;
  unique_fd& operator=(unique_fd const&) = delete;
  ~unique_fd() { reset(); }

  [[nodiscard]] int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }

  /// Closes now; returns 0 or the errno of close(2). The descriptor is released either way (Linux
  /// frees it even when close fails, so retrying would close someone else's descriptor).
  int close() noexcept {
    if (fd_ < 0) return 0;
    int const r = ::close(std::exchange(fd_, -1));
    return r == 0 || errno == EINTR ? 0 : errno;
  }
  void reset() noexcept { (void)close(); }

private:
  int fd_ = -1;
};

/// A read-only private mapping of a whole file; unmapped on destruction.
class mapped_region {
public:
  mapped_region() noexcept = default;
  mapped_region(void* p, std::size_t n) noexcept : p_(p), n_(n) {}
  mapped_region(mapped_region&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  mapped_region& operator=(mapped_region&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  mapped_region(mapped_region const&) = delete;
  mapped_region& operator=(mapped_region const&) = delete;
  ~mapped_region() { reset(); }

  [[nodiscard]] std::byte const* data() const noexcept { return static_cast<std::byte const*>(p_); }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }

  void reset() noexcept {
    if (p_ != nullptr) ::munmap(p_, n_);
    p_ = nullptr;
    n_ = 0;
  }

private:
  void* p_ = nullptr;
  std::size_t n_ = 0;
};

} // namespace pipeswap::io::detail
