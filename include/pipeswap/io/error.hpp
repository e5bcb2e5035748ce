// pipeswap — errors of the file layer (checkpoints on disk).
#pragma once

#include <filesystem>
#include <string>
#include <utility>

#include <pipeswap/error.hpp>

namespace pipeswap::io {

/// A file's contents break a rule of its format (a truncated or corrupt checkpoint). The message
/// names the file when there is one, the tensor (or "header") and the rule broken.
class format_error : public invalid_argument {
public:
  using invalid_argument::invalid_argument;
};

/// A system call on a file failed. The message names the call, the path and strerror(errno);
/// the pieces are also available separately.
class io_error : public error {
public:
  io_error(std::string const& what, std::string call, std::filesystem::path path, int errnum)
      : error(what), call_(std::move(call)), path_(std::move(path)), errnum_(errnum) {}

  /// The failing system call ("open", "write", "fsync", "rename", ...).
  [[nodiscard]] std::string const& call() const noexcept { return call_; }
  /// The path it was applied to.
  [[nodiscard]] std::filesystem::path const& path() const noexcept { return path_; }
  /// The errno it failed with.
  [[nodiscard]] int code() const noexcept { return errnum_; }

private:
  std::string call_;
  std::filesystem::path path_;
  int errnum_;
};

} // namespace pipeswap::io
