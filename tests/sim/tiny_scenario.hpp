// The small scenario the simulator tests share (tests/sim).
#pragma once

#include <cstdint>

#include <pipeswap/backend/mock/timing.hpp>
#include <pipeswap/sim/model.hpp>

namespace pipeswap::test {

/// One layer, hidden 64, 32 tokens: P = 128·64 (embedding) + 2·64 + 4·64² + 3·64·128 (the layer:
/// two norms, q/k/v/o with kv = heads, gate/up/down) + 64 (final norm) + 128·64 (head) = 57 536
/// parameters, of which 3·64 are norms (fewer than swap_config::min_swap_numel elements: never swapped).
/// Saved activations: A = 1 MB per layer (override) plus the stage input D = 32·64·2 = 4096 bytes.
/// The device computes 1 GFLOP/s (device.compute "flops": every kernel at FLOPs / peak). A forward multiplies by the weight matrices only (the layer's
/// 4·64² + 3·64·128 = 40 960 and the head's 8 192: M = 49 152; the embedding is a lookup, norms are
/// not counted): f = 2·M·32 + 4·32²·64 = 3 407 872 ns, and a backward 2f, while a copy of A over the
/// 55 GB/s link takes about 20 µs: copies hide entirely. duplex_factor 1 keeps the link at 55 GB/s.
/// BF16 weights, F32 gradients (the default with an fp32 master), fp32 master and moments: 18·P bytes.
/// The last stage also saves the head's tensors: the final norm's and lm_head's inputs (2·32·64
/// each) and the fp32 softmax of the logits (4·32·128): H = 24 576 bytes, kept with the last layer's.
constexpr std::uint64_t P = 57'536, norms = 3 * 64, A = 1'000'000, D = 4'096, M = 49'152, H = 24'576;
constexpr pipeswap::mock::sim_time f = 3'407'872;

inline pipeswap::sim::scenario tiny(std::uint32_t ranks = 1, std::uint32_t micro = 8) {
  pipeswap::sim::scenario s;
  s.model.layers = 1;
  s.model.hidden = 64;
  s.model.ffn_hidden = 128;
  s.model.heads = 4;
  s.model.kv_heads = 4;
  s.model.vocab = 128;
  s.model.seq_len = 32;
  s.model.activation_bytes_per_layer = A;
  s.device.memory_bytes = 64'000'000;
  s.device.reserved_bytes = 1'000'000;
  s.device.bf16_tflops = 1e-3;
  s.device.kernel_efficiency = 1;
  s.device.compute = pipeswap::sim::compute_kind::flops; // the hand-checked times: FLOPs at the peak
  s.device.duplex_factor = 1;
  s.pipeline.schedule = pipeswap::sim::schedule_kind::gpipe;
  s.pipeline.ranks = ranks;
  s.pipeline.micro_batches = micro;
  return s;
}

} // namespace pipeswap::test
