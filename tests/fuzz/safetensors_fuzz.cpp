// libFuzzer target over the in-memory safetensors parser.
//
// Any input must either be rejected with format_error or parse into a view that keeps the format's
// invariants (tensor ranges tile the data section inside the input) and survives a round trip
// through the writer unchanged. Any other exception, a sanitizer report or a broken invariant is a
// crash. Built with clang++ -fsanitize=fuzzer,address,undefined (see tests/io/meson.build).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

#include <pipeswap/io/safetensors.hpp>

namespace io = pipeswap::io;

namespace {

[[noreturn]] void broken(char const* what) {
  std::fprintf(stderr, "safetensors_fuzz: invariant broken: %s\n", what);
  std::abort();
}

void check_view(io::safetensors_view const& v, std::span<std::byte const> in) {
  if (v.total_size() != in.size()) broken("total_size");
  if (8 + v.header_size() + v.data_size() != in.size()) broken("sizes");
  std::uint64_t pos = 0;
  auto const* data = in.data() + 8 + v.header_size();
  for (auto const& t : v.tensors()) {
    if (t.begin != pos || t.end < t.begin) broken("tiling");
    if (t.bytes.data() != data + t.begin || t.bytes.size() != t.end - t.begin) broken("span");
    if (t.bytes.size() != t.numel() * pipeswap::size_of(t.type)) broken("byte count");
    if (t.name.empty() || t.name == io::metadata_key) broken("name");
    if (v.find(t.name) != &t) broken("lookup");
    pos = t.end;
  }
  if (pos != v.data_size()) broken("coverage");
}

void check_round_trip(io::safetensors_view const& v) {
  std::vector<io::tensor_source> sources;
  for (auto const& t : v.tensors()) sources.push_back({t.name, t.type, t.shape, t.bytes});
  std::vector<std::byte> out;
  try {
    out = io::serialize(sources, v.metadata());
  } catch (pipeswap::invalid_argument const&) {
    broken("the writer rejects what the reader accepted");
  }
  auto const w = io::safetensors_view::parse(out);
  if (w.size() != v.size() || w.metadata() != v.metadata()) broken("round trip: tensors or metadata");
  for (auto const& t : v.tensors()) {
    auto const* u = w.find(t.name);
    if (u == nullptr || u->type != t.type || u->shape != t.shape ||
        !std::equal(u->bytes.begin(), u->bytes.end(), t.bytes.begin(), t.bytes.end())) {
      broken("round trip: tensor");
    }
  }
  // The writer is deterministic: writing the re-read file gives the same bytes.
  std::vector<io::tensor_source> again;
  for (auto const& t : w.tensors()) again.push_back({t.name, t.type, t.shape, t.bytes});
  if (io::serialize(again, w.metadata()) != out) broken("writer determinism");
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  std::span<std::byte const> const in(reinterpret_cast<std::byte const*>(data), size);
  try {
    auto const v = io::safetensors_view::parse(in);
    check_view(v, in);
    check_round_trip(v);
  } catch (io::format_error const&) {
    // Rejected cleanly.
  }
  return 0;
}
