// Qwen3-30B-A3B, the mixture-of-experts model the simulator's MoE tests and the CPU-step offload check
// share: its published shape on H100 80 GB devices, laid out as asked.
#pragma once

#include <cstdint>

#include <pipeswap/sim/model.hpp>

namespace pipeswap::test {

/// Qwen/Qwen3-30B-A3B's configuration: 48 layers, hidden 2048, 32 query heads of 128, 4 key/value
/// heads, 128 routed experts of width 768, 8 per token, no shared expert, vocabulary 151 936, untied
/// embeddings; sequences of 4096 tokens. tp (with sequence parallelism when above 1), pp ranks, dp
/// with the distributed optimizer, ep; one micro-batch of one sequence.
inline sim::scenario qwen3_30b_a3b(std::uint32_t tp, std::uint32_t pp, std::uint32_t dp, std::uint32_t ep) {
  sim::scenario s;
  auto& m = s.model;
  m.name = "Qwen3-30B-A3B";
  m.layers = 48;
  m.hidden = 2048;
  m.ffn_hidden = 6144;
  m.heads = 32;
  m.kv_heads = 4;
  m.head_dim = 128;
  m.vocab = 151936;
  m.seq_len = 4096;
  m.moe.experts = 128;
  m.moe.top_k = 8;
  m.moe.expert_ffn_hidden = 768;
  s.device.memory_bytes = 80'000'000'000;
  s.parallel.tp = tp;
  s.parallel.sequence_parallel = tp > 1;
  s.parallel.dp = dp;
  s.parallel.distributed_optimizer = true;
  s.parallel.ep = ep;
  s.pipeline.ranks = pp;
  return s;
}

} // namespace pipeswap::test
