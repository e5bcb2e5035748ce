// pipeswap — atomic replacement of a file: write a temporary file next to the target, make it
// durable, rename it over the target. A crash or an error at any point leaves either the previous
// file or the complete new one at the target, never a mix (docs/checkpoint-format.md, "Atomicity").
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <pipeswap/error.hpp>
#include <pipeswap/io/detail/posix.hpp>
#include <pipeswap/io/error.hpp>

namespace pipeswap::io {

/// What a test hook decides for one system call made by atomic_file.
struct syscall_fault {
  /// Nonzero: the call is not made and fails with this errno. EINTR is retried like a real
  /// interruption (the hook is asked again).
  int error = 0;
  /// For "write" only: pass at most this many bytes to write(2), forcing a short write.
  std::size_t max_bytes = std::numeric_limits<std::size_t>::max();
};

/// Called before each system call with its name: "open", "write", "fsync", "close", "rename",
/// "open_dir", "fsync_dir". Empty in production; tests use it to inject failures.
using syscall_hook = std::function<syscall_fault(std::string_view call)>;

/// Runtime knobs of atomic_file.
struct atomic_file_options {
  /// fsync the file before the rename and its directory after it. Turn off only for scratch files:
  /// without it a crash may leave an empty or partial file at the target.
  bool sync = true;
  /// Largest single write(2), so one call never blocks for long on a huge buffer.
  std::size_t max_write_bytes = std::size_t{8} << 20;
  /// Test hook, see syscall_hook.
  syscall_hook hook;
};

/// Writes a new version of `target` atomically.
///
/// The constructor creates a uniquely named temporary file in the target's directory (mode 0666
/// less the umask). write() appends to it; commit() fsyncs it, closes it, renames it over the
/// target and fsyncs the directory. Any failing call removes the temporary file and throws
/// io_error naming the call, the path and strerror(errno); until the rename the previous file at
/// the target is untouched. Destroying an uncommitted atomic_file (an exception unwinding the
/// caller) removes the temporary file. Move-only; not thread-safe.
///
/// @code
/// pipeswap::io::atomic_file f("ckpt/opt.safetensors");
/// f.write(header);
/// f.write(data);
/// f.commit();  // from here on readers see the new file
/// @endcode
class atomic_file {
public:
  explicit atomic_file(std::filesystem::path target, atomic_file_options options = {})
      : target_(std::move(target)), options_(std::move(options)) {
    if (target_.filename().empty() || target_.filename() == "." || target_.filename() == "..") {
      throw invalid_argument("atomic write of \"" + target_.native() + "\": the path names no file");
    }
    if (options_.max_write_bytes == 0) options_.max_write_bytes = 1;
    dir_ = target_.parent_path();
    if (dir_.empty()) dir_ = ".";
    create_temp();
  }

  atomic_file(atomic_file&& o) noexcept
      : target_(std::move(o.target_)), dir_(std::move(o.dir_)), temp_(std::move(o.temp_)),
        options_(std::move(o.options_)), fd_(std::move(o.fd_)), written_(std::exchange(o.written_, 0)),
        state_(std::exchange(o.state_, state::abandoned)) {}
  atomic_file& operator=(atomic_file&&) = delete;
  atomic_file(atomic_file const&) = delete;
  atomic_file& operator=(atomic_file const&) = delete;

  /// Removes the temporary file unless committed. Never throws.
  ~atomic_file() { discard(); }

  /// Appends `bytes` to the temporary file, in writes of at most options.max_write_bytes, retrying
  /// short writes and EINTR.
  void write(std::span<std::byte const> bytes) {
    require_open("write");
    while (!bytes.empty()) {
      std::size_t n = std::min(bytes.size(), options_.max_write_bytes);
      syscall_fault const f = ask("write");
      if (f.error == EINTR) continue;
      if (f.error != 0) fail("write", temp_, f.error);
      n = std::max<std::size_t>(1, std::min(n, f.max_bytes));
      ssize_t const r = ::write(fd_.get(), bytes.data(), n);
      if (r < 0) {
        if (errno == EINTR) continue;
        fail("write", temp_, errno);
      }
      if (r == 0) fail("write", temp_, EIO); // no progress on a regular file: give up, not spin
      bytes = bytes.subspan(static_cast<std::size_t>(r));
      written_ += static_cast<std::uint64_t>(r);
    }
  }

  /// fsync, close, rename over the target, fsync the directory. After a failure before the rename
  /// the target is untouched and the temporary file is gone. A failure syncing the directory
  /// (after the rename) still throws: the new file is in place but may not survive a crash.
  void commit() {
    require_open("commit");
    if (options_.sync) checked("fsync", temp_, [&] { return ::fsync(fd_.get()); });
    if (int const e = ask("close").error; e != 0 && e != EINTR) fail("close", temp_, e);
    if (int const e = fd_.close(); e != 0) fail("close", temp_, e);
    checked("rename", temp_, [&] { return ::rename(temp_.c_str(), target_.c_str()); });
    state_ = state::committed;
    if (!options_.sync) return;
    std::string const after =
        "; \"" + target_.native() + "\" holds the new file but the rename may not survive a crash";
    detail::unique_fd dir;
    for (;;) {
      int const e = ask("open_dir").error;
      if (e == EINTR) continue;
      if (e != 0) detail::throw_io(prefix(), "open", dir_, e, after);
      int const fd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (fd >= 0) {
        dir = detail::unique_fd(fd);
        break;
      }
      if (errno != EINTR) detail::throw_io(prefix(), "open", dir_, errno, after);
    }
    for (;;) {
      int e = ask("fsync_dir").error;
      if (e == 0 && ::fsync(dir.get()) != 0) e = errno;
      if (e == EINTR) continue;
      // Some file systems cannot sync a directory (EINVAL); their renames are as durable as they get.
      if (e != 0 && e != EINVAL) detail::throw_io(prefix(), "fsync", dir_, e, after);
      break;
    }
  }

  /// Abandons the write: closes and removes the temporary file. No effect once committed.
  void discard() noexcept { (void)discard_reporting(); }

  [[nodiscard]] std::filesystem::path const& target() const noexcept { return target_; }
  /// The temporary file (exists from construction until commit or discard).
  [[nodiscard]] std::filesystem::path const& temp_path() const noexcept { return temp_; }
  [[nodiscard]] std::uint64_t bytes_written() const noexcept { return written_; }
  [[nodiscard]] bool committed() const noexcept { return state_ == state::committed; }

private:
  enum class state : std::uint8_t { open, committed, abandoned };

  [[nodiscard]] std::string prefix() const { return "atomic write of \"" + target_.native() + "\": "; }

  syscall_fault ask(std::string_view call) const { return options_.hook ? options_.hook(call) : syscall_fault{}; }

  void require_open(char const* what) const {
    if (state_ != state::open) {
      throw state_error(prefix() + what + "() after the file was committed, discarded or failed");
    }
  }

  /// Runs a call returning -1/errno through the hook, retrying EINTR; fails on error.
  template <class F>
  void checked(std::string_view call, std::filesystem::path const& path, F&& f) {
    for (;;) {
      int e = ask(call).error;
      if (e == 0 && f() != 0) e = errno;
      if (e == EINTR) continue;
      if (e != 0) fail(call, path, e);
      return;
    }
  }

  /// Returns 0, or the errno of a failed unlink of the temporary file.
  int discard_reporting() noexcept {
    if (state_ != state::open) return 0;
    state_ = state::abandoned;
    fd_.reset();
    if (::unlink(temp_.c_str()) != 0 && errno != ENOENT) return errno;
    temp_.clear();
    return 0;
  }

  // `path` by value: it is often temp_, which discarding clears.
  [[noreturn]] void fail(std::string_view call, std::filesystem::path path, int err) {
    std::filesystem::path const temp = temp_;
    std::string suffix = "; \"" + target_.native() + "\" is unchanged";
    if (int const e = discard_reporting(); e != 0) {
      suffix += "; removing the temporary file failed too: " + detail::syscall_text("unlink", temp, e);
    }
    detail::throw_io(prefix(), call, path, err, suffix);
  }

  void create_temp() {
    static std::atomic<std::uint64_t> counter{0};
    std::string base = target_.filename().native();
    if (base.size() > 200) base.resize(200); // keep the temporary name under NAME_MAX
    auto const seed = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    for (int attempt = 0;; ++attempt) {
      std::uint64_t const n = counter.fetch_add(1, std::memory_order_relaxed);
      char tag[64];
      std::snprintf(tag, sizeof tag, ".tmp.%ld.%llx", static_cast<long>(::getpid()),
                    static_cast<unsigned long long>((seed * 0x9E3779B97F4A7C15ull) ^ n));
      temp_ = dir_ / ("." + base + tag);
      syscall_fault const f = ask("open");
      int e = f.error;
      if (e == 0) {
        int const fd = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd >= 0) {
          fd_ = detail::unique_fd(fd);
          state_ = state::open;
          return;
        }
        e = errno;
      }
      if (e == EINTR || (e == EEXIST && attempt < 100)) continue;
      std::filesystem::path const temp = std::exchange(temp_, {});
      detail::throw_io(prefix(), "open", temp, e, "; \"" + target_.native() + "\" is unchanged");
    }
  }

  std::filesystem::path target_;
  std::filesystem::path dir_;
  std::filesystem::path temp_;
  atomic_file_options options_;
  detail::unique_fd fd_;
  std::uint64_t written_ = 0;
  state state_ = state::abandoned;
};

} // namespace pipeswap::io
