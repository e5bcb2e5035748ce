// pipeswap — the optimizer checkpoint schema and the validation of a file against it (internal).
//
// Kept free of backends and runtimes so the fuzz target can drive the validation directly; the
// public API is <pipeswap/swap/checkpoint.hpp>, the schema is documented in docs/checkpoints.md.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <pipeswap/core/dtype.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/io/detail/safetensors_rules.hpp>
#include <pipeswap/io/safetensors_format.hpp>
#include <pipeswap/io/safetensors_reader.hpp>

namespace pipeswap {

/// Metadata keys with this prefix belong to the checkpoint format; an optimizer's own metadata keys
/// must not use it.
inline constexpr std::string_view checkpoint_reserved_prefix = "pipeswap.";
/// Metadata key naming the kind of file, and its value in an optimizer checkpoint.
inline constexpr std::string_view checkpoint_format_key = "pipeswap.format";
inline constexpr std::string_view checkpoint_format_name = "optimizer_state";
/// Metadata key holding the format version, and the only version this build reads and writes.
inline constexpr std::string_view checkpoint_version_key = "pipeswap.format_version";
inline constexpr std::string_view checkpoint_version = "1";

namespace detail {

/// One tensor an optimizer checkpoint must hold: a state slot's name, dtype and element count
/// (stored with shape [numel]).
struct checkpoint_entry {
  std::string name;
  dtype type = dtype::f32;
  std::uint64_t numel = 0;
};

/// The subject of checkpoint messages: `checkpoint "PATH"`, or `checkpoint` for bytes in memory.
inline std::string checkpoint_subject(std::string_view path) {
  return path.empty() ? std::string("checkpoint") : "checkpoint " + io::detail::quote(path);
}

[[noreturn]] inline void checkpoint_reject(std::string const& subject, std::string const& rule) {
  throw invalid_argument(subject + ": " + rule);
}

/// Rejects entries that share a name (two slots of one parameter with the same key).
inline void check_unique_names(std::span<checkpoint_entry const> entries, std::string_view op) {
  std::vector<std::string_view> names;
  names.reserve(entries.size());
  for (auto const& e : entries) names.push_back(e.name);
  std::sort(names.begin(), names.end());
  if (auto d = std::adjacent_find(names.begin(), names.end()); d != names.end()) {
    throw invalid_argument(std::string(op) + ": two slots of the optimizer are both named " + io::detail::quote(*d) +
                           "; a checkpoint needs one tensor per slot");
  }
}

/// Validates `file` against the tensors the optimizer expects, touching nothing: the format and
/// version metadata, then each expected tensor (present, dtype, shape [numel]), then every tensor
/// of the file (expected). Byte ranges were checked by the safetensors reader. Throws
/// invalid_argument naming the file, the tensor or metadata key, and the rule. Returns the
/// optimizer's part of the metadata (every key without the reserved prefix).
inline std::map<std::string, std::string> check_checkpoint(io::safetensors_view const& file,
                                                           std::span<checkpoint_entry const> entries,
                                                           std::string_view path = {}) {
  auto const subject = checkpoint_subject(path);
  auto const reject = [&](std::string const& rule) { checkpoint_reject(subject, rule); };
  auto const& meta = file.metadata();
  auto const q = [](std::string_view s) { return io::detail::quote(s); };
  std::string const version_text(checkpoint_version);

  auto const format = meta.find(checkpoint_format_key);
  if (format == meta.end()) {
    reject("metadata " + q(checkpoint_format_key) + " is missing: not a pipeswap optimizer checkpoint");
  } else if (format->second != checkpoint_format_name) {
    reject("metadata " + q(checkpoint_format_key) + " is " + q(format->second) + ", not " + q(checkpoint_format_name));
  }
  auto const version = meta.find(checkpoint_version_key);
  if (version == meta.end()) {
    reject("metadata " + q(checkpoint_version_key) + " is missing");
  } else if (version->second != checkpoint_version) {
    reject("metadata " + q(checkpoint_version_key) + " is " + q(version->second) + ", but this build reads version " +
           version_text + " only");
  }
  std::map<std::string, std::string> optimizer_meta;
  for (auto const& [k, v] : meta) {
    if (!k.starts_with(checkpoint_reserved_prefix)) {
      optimizer_meta.emplace(k, v);
    } else if (k != checkpoint_format_key && k != checkpoint_version_key) {
      reject("metadata " + q(k) + " is not defined by format version " + version_text);
    }
  }

  for (auto const& e : entries) {
    std::uint64_t const shape[1] = {e.numel};
    auto const slot = "the optimizer's slot is " + io::detail::describe(e.type, shape);
    auto const* t = file.find(e.name);
    if (t == nullptr) {
      reject("tensor " + q(e.name) + " is missing (" + slot + ")");
    } else if (t->type != e.type) {
      reject("tensor " + q(e.name) + ": dtype " + std::string(name_of(t->type)) + " does not match (" + slot + ")");
    } else if (t->shape.size() != 1 || t->shape[0] != e.numel) {
      reject("tensor " + q(e.name) + ": shape " + io::detail::format_list(t->shape) + " does not match (" + slot + ")");
    }
  }
  if (file.size() != entries.size()) { // every expected name is present, so some are extra
    std::vector<std::string_view> names;
    names.reserve(entries.size());
    for (auto const& e : entries) names.push_back(e.name);
    std::sort(names.begin(), names.end());
    for (auto const& t : file.tensors()) {
      if (!std::binary_search(names.begin(), names.end(), std::string_view(t.name))) {
        reject("tensor " + q(t.name) + " is unexpected: the optimizer has no such slot");
      }
    }
  }
  return optimizer_meta;
}

} // namespace detail
} // namespace pipeswap
