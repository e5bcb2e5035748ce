// libFuzzer target over the in-memory safetensors parser and the optimizer checkpoint validation.
//
// Any input must either be rejected with format_error or parse into a view that keeps the format's
// invariants (tensor ranges tile the data section inside the input) and survives a round trip
// through the writer unchanged. A parsed view is then validated as the checkpoint of a fixed small
// optimizer (three slots): it is rejected with invalid_argument, or it holds exactly those slots and
// the optimizer's metadata comes back without the format's keys. Any other exception, a sanitizer
// report or a broken invariant is a crash. Built with clang++ -fsanitize=fuzzer,address,undefined
// (see tests/io/meson.build).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <pipeswap/io/safetensors.hpp>
#include <pipeswap/swap/detail/checkpoint_schema.hpp>

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

/// The slots of the optimizer the checkpoint validation is fuzzed against (corpus: valid-checkpoint).
std::vector<pipeswap::detail::checkpoint_entry> const checkpoint_slots{
    {"state.0.exp_avg", pipeswap::dtype::f32, 2},
    {"state.0.exp_avg_sq", pipeswap::dtype::f32, 2},
    {"state.1.exp_avg", pipeswap::dtype::bf16, 1},
};

void check_checkpoint(io::safetensors_view const& v) {
  std::map<std::string, std::string> meta;
  try {
    meta = pipeswap::detail::check_checkpoint(v, checkpoint_slots);
  } catch (io::format_error const&) {
    broken("checkpoint validation threw a format_error for a file the reader accepted");
  } catch (pipeswap::invalid_argument const&) {
    return; // rejected cleanly
  }
  if (v.size() != checkpoint_slots.size()) broken("checkpoint: tensor count");
  for (auto const& e : checkpoint_slots) {
    auto const* t = v.find(e.name);
    if (t == nullptr || t->type != e.type || t->shape != std::vector<std::uint64_t>{e.numel}) {
      broken("checkpoint: accepted a tensor that does not match its slot");
    }
  }
  if (meta.size() + 2 != v.metadata().size()) broken("checkpoint: metadata count");
  for (auto const& [k, val] : meta) {
    if (k.starts_with(pipeswap::checkpoint_reserved_prefix)) broken("checkpoint: reserved key passed on");
    auto const it = v.metadata().find(k);
    if (it == v.metadata().end() || it->second != val) broken("checkpoint: metadata changed");
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  std::span<std::byte const> const in(reinterpret_cast<std::byte const*>(data), size);
  try {
    auto const v = io::safetensors_view::parse(in);
    check_view(v, in);
    check_round_trip(v);
    check_checkpoint(v);
  } catch (io::format_error const&) {
    // Rejected cleanly.
  }
  return 0;
}
