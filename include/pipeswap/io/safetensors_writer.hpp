// pipeswap — writing safetensors files (to memory, or atomically to disk).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/core/dtype.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/io/atomic_file.hpp>
#include <pipeswap/io/detail/safetensors_rules.hpp>
#include <pipeswap/io/safetensors_format.hpp>

namespace pipeswap::io {

/// One tensor to write. `bytes` is only read, and only during the call that writes it, so it may
/// point straight into a pinned host mirror: numel(shape) × size_of(type) bytes, little-endian,
/// row-major. An empty shape is a scalar (one element); a zero extent makes an empty tensor.
struct tensor_source {
  std::string name;
  dtype type = dtype::f32;
  std::vector<std::uint64_t> shape;
  std::span<std::byte const> bytes;
};

/// Runtime knobs of the writer.
struct write_options {
  /// Refuse to write a header larger than this (readers reject it; 100 MB by default).
  std::uint64_t max_header_size = default_max_header_size;
};

/// Runtime knobs of save_file.
struct save_options {
  std::uint64_t max_header_size = default_max_header_size;
  /// Durability, largest single write and the test hook of the atomic replacement.
  atomic_file_options file;
};

/// The layout of one safetensors file for a set of tensors and metadata: validated input, header,
/// tensor order and offsets, computed once; the bytes are then written to a buffer or a file.
///
/// Output is deterministic and matches the safetensors package (`safetensors.serialize`)
/// byte for byte: tensors ordered by descending dtype alignment rank, then by name (bytewise);
/// header `{"__metadata__":{...sorted keys...},"name":{"dtype":..,"shape":[..],"data_offsets":[b,e]},...}`
/// with no whitespace ("__metadata__" omitted when there is no metadata), padded with spaces to a
/// multiple of 8 bytes, so every tensor's data starts at a file offset that is a multiple of its
/// element size. Throws invalid_argument for input that would make an invalid file: an empty,
/// duplicate or reserved ("__metadata__") name, a name or metadata string that is not UTF-8, a byte
/// count that does not match dtype × shape, a header over the limit.
///
/// Holds a reference to `tensors` (not a copy): keep them alive and their bytes unchanged until the
/// last write_to/save.
class safetensors_writer {
public:
  explicit safetensors_writer(std::span<tensor_source const> tensors, metadata_map const& metadata = {},
                              write_options const& options = {})
      : tensors_(tensors) {
    for (auto const& [k, v] : metadata) {
      if (auto at = detail::find_invalid_utf8(k); at != detail::no_error) {
        reject(pipeswap::detail::message({"metadata key ", detail::quote(k), " is not valid UTF-8 (byte ", at, ")"}));
      }
      if (auto at = detail::find_invalid_utf8(v); at != detail::no_error) {
        reject(
            pipeswap::detail::message({"metadata ", detail::quote(k), ": value is not valid UTF-8 (byte ", at, ")"}));
      }
    }
    std::vector<std::string_view> names;
    names.reserve(tensors.size());
    for (auto const& t : tensors) {
      check_tensor(t);
      names.push_back(t.name);
    }
    std::sort(names.begin(), names.end());
    if (auto d = std::adjacent_find(names.begin(), names.end()); d != names.end()) {
      reject("tensor " + detail::quote(*d) + " appears twice");
    }

    order_.resize(tensors.size());
    std::iota(order_.begin(), order_.end(), std::size_t{0});
    std::sort(order_.begin(), order_.end(), [&](std::size_t a, std::size_t b) {
      int const ra = detail::dtype_rank(tensors[a].type);
      int const rb = detail::dtype_rank(tensors[b].type);
      return ra != rb ? ra > rb : tensors[a].name < tensors[b].name;
    });

    std::string h = "{";
    if (!metadata.empty()) {
      h += "\"__metadata__\":{";
      bool first = true;
      for (auto const& [k, v] : metadata) {
        if (!first) h += ',';
        first = false;
        append_json_string(h, k);
        h += ':';
        append_json_string(h, v);
      }
      h += '}';
    }
    std::uint64_t offset = 0;
    for (std::size_t i : order_) {
      auto const& t = tensors[i];
      if (h.size() > 1) h += ',';
      append_json_string(h, t.name);
      h += ":{\"dtype\":\"";
      h += name_of(t.type);
      h += "\",\"shape\":[";
      for (std::size_t k = 0; k < t.shape.size(); ++k) {
        if (k) h += ',';
        h += std::to_string(t.shape[k]);
      }
      h += "],\"data_offsets\":[";
      h += std::to_string(offset);
      h += ',';
      offset += t.bytes.size();
      h += std::to_string(offset);
      h += "]}";
    }
    h += '}';
    h.resize((h.size() + 7) / 8 * 8, ' ');
    if (h.size() > options.max_header_size) {
      reject(pipeswap::detail::message(
          {"the header would be ", h.size(), " bytes, over the limit of ", options.max_header_size}));
    }
    data_size_ = offset;

    prefix_.resize(header_length_bytes + h.size());
    std::uint64_t n = h.size();
    for (std::size_t i = 0; i < header_length_bytes; ++i) {
      prefix_[i] = static_cast<std::byte>(n & 0xFF);
      n >>= 8;
    }
    std::memcpy(prefix_.data() + header_length_bytes, h.data(), h.size());
  }

  /// N: the header's length in bytes, padding included.
  [[nodiscard]] std::uint64_t header_size() const noexcept { return prefix_.size() - header_length_bytes; }
  /// Bytes of tensor data after the header.
  [[nodiscard]] std::uint64_t data_size() const noexcept { return data_size_; }
  /// Size of the whole file: 8 + header_size() + data_size().
  [[nodiscard]] std::uint64_t total_size() const noexcept { return prefix_.size() + data_size_; }
  /// The header JSON, padding included.
  [[nodiscard]] std::string_view header() const noexcept {
    return {reinterpret_cast<char const*>(prefix_.data()) + header_length_bytes, header_size()};
  }
  /// Indices into the tensors in file order.
  [[nodiscard]] std::span<std::size_t const> order() const noexcept { return order_; }

  /// Writes the file into `out`, which must hold exactly total_size() bytes.
  void write_to(std::span<std::byte> out) const {
    if (out.size() != total_size()) {
      throw invalid_argument(pipeswap::detail::message(
          {"safetensors: write_to: the buffer holds ", out.size(), " bytes but the file is ", total_size()}));
    }
    std::memcpy(out.data(), prefix_.data(), prefix_.size());
    std::size_t at = prefix_.size();
    for (std::size_t i : order_) {
      auto const b = tensors_[i].bytes;
      if (!b.empty()) std::memcpy(out.data() + at, b.data(), b.size());
      at += b.size();
    }
  }

  /// The file as a new buffer.
  [[nodiscard]] std::vector<std::byte> to_bytes() const {
    std::vector<std::byte> out(total_size());
    write_to(out);
    return out;
  }

  /// Writes the file to `path` through atomic_file: on success `path` holds the new file; on any
  /// failure io_error is thrown, the previous file at `path` is intact and no temporary file is left.
  void save(std::filesystem::path const& path, atomic_file_options options = {}) const {
    atomic_file f(path, std::move(options));
    f.write(prefix_);
    for (std::size_t i : order_) f.write(tensors_[i].bytes);
    f.commit();
  }

private:
  [[noreturn]] static void reject(std::string const& rule) {
    throw invalid_argument("safetensors: cannot write: " + rule);
  }

  static void check_tensor(tensor_source const& t) {
    if (t.name.empty()) reject("a tensor has an empty name");
    if (t.name == metadata_key) {
      reject("tensor name \"__metadata__\" is reserved for the metadata");
    }
    if (auto at = detail::find_invalid_utf8(t.name); at != detail::no_error) {
      reject(
          pipeswap::detail::message({"tensor ", detail::quote(t.name), ": name is not valid UTF-8 (byte ", at, ")"}));
    }
    std::uint64_t numel = 0;
    std::uint64_t bytes = 0;
    if (!detail::checked_numel(t.shape, numel) || !detail::checked_mul(numel, size_of(t.type), bytes)) {
      reject("tensor " + detail::quote(t.name) + ": " + detail::describe(t.type, t.shape) +
             " needs more than 2^64 - 1 bytes");
    }
    if (bytes != t.bytes.size()) {
      reject(pipeswap::detail::message({"tensor ", detail::quote(t.name), ": ", detail::describe(t.type, t.shape),
                                        " needs ", bytes, " bytes but ", t.bytes.size(), " were given"}));
    }
  }

  /// JSON string as serde_json writes it (what the safetensors package emits): `"` and `\` escaped, the
  /// control characters as \b \f \n \r \t or \u00xx, everything else (UTF-8 included) verbatim.
  static void append_json_string(std::string& out, std::string_view s) {
    char const* hex = "0123456789abcdef";
    out += '"';
    for (char c : s) {
      switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += "\\u00";
          out += hex[(c >> 4) & 0xF];
          out += hex[c & 0xF];
        } else {
          out += c;
        }
      }
    }
    out += '"';
  }

  std::span<tensor_source const> tensors_;
  std::vector<std::size_t> order_;
  std::vector<std::byte> prefix_; // 8-byte length + padded header
  std::uint64_t data_size_ = 0;
};

/// Size in bytes of the file serialize() would produce.
[[nodiscard]] inline std::uint64_t serialized_size(std::span<tensor_source const> tensors,
                                                   metadata_map const& metadata = {},
                                                   write_options const& options = {}) {
  return safetensors_writer(tensors, metadata, options).total_size();
}

/// The safetensors file for `tensors` and `metadata`, in memory.
[[nodiscard]] inline std::vector<std::byte> serialize(std::span<tensor_source const> tensors,
                                                      metadata_map const& metadata = {},
                                                      write_options const& options = {}) {
  return safetensors_writer(tensors, metadata, options).to_bytes();
}

/// Writes the file into `out`, which must hold exactly serialized_size() bytes (e.g. a reusable
/// staging buffer of a double-buffered save).
inline void serialize_to(std::span<std::byte> out, std::span<tensor_source const> tensors,
                         metadata_map const& metadata = {}, write_options const& options = {}) {
  safetensors_writer(tensors, metadata, options).write_to(out);
}

/// Atomically replaces `path` with the safetensors file for `tensors` and `metadata` (see
/// safetensors_writer::save and atomic_file). Input errors throw invalid_argument before the file
/// system is touched; system-call failures throw io_error.
inline void save_file(std::filesystem::path const& path, std::span<tensor_source const> tensors,
                      metadata_map const& metadata = {}, save_options const& options = {}) {
  safetensors_writer(tensors, metadata, write_options{options.max_header_size}).save(path, options.file);
}

} // namespace pipeswap::io
