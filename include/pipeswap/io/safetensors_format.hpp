// pipeswap — constants and types shared by the safetensors reader and writer.
//
// The file layout (docs/checkpoint-format.md): an 8-byte little-endian unsigned header length N,
// N bytes of UTF-8 JSON mapping each tensor name to {"dtype", "shape", "data_offsets"} plus an
// optional "__metadata__" object of strings, then the data section that the tensors' byte ranges
// tile exactly.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>

namespace pipeswap::io {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; pipeswap reads and writes it in place, which "
              "needs a little-endian host");

/// Size of the header-length field at the start of the file.
inline constexpr std::size_t header_length_bytes = 8;

/// Largest header accepted or written by default (the safetensors package's limit, 100 MB).
inline constexpr std::uint64_t default_max_header_size = 100'000'000;

/// The reserved key holding the string metadata; no tensor may have this name.
inline constexpr std::string_view metadata_key = "__metadata__";

/// String metadata of a file, ordered by key (the writer emits it in this order).
using metadata_map = std::map<std::string, std::string, std::less<>>;

} // namespace pipeswap::io
