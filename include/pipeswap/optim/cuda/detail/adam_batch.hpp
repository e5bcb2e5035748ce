// pipeswap — the work of the fused multi-tensor Adam kernel, written once for the device and for a
// host emulation (tests/optim/adam_batch_test.cpp runs it on the CPU, where no GPU is needed).
//
//   build_table(tensors, scalars)   host: checks a batch and lays out its launch table — a header,
//                                   the step scalars the batch uses, one 64-byte desc per range —
//                                   and counts the blocks of the grid.
//   locate(table, block, count)     which range block `block` works on. `count(pred)` must return
//                                   how many of the block's threads t have pred(t) true: on the
//                                   device __syncthreads_count, on the host a loop.
//   update_share(table, range, block, thread)   the elements of that range thread `thread` of
//                                   block `block` updates. Threads of a block touch disjoint
//                                   elements, so running them one after another (the emulation)
//                                   gives the device's bytes.
//
// Work split: each range gets ceil(numel / chunk_elements) blocks of block_threads threads; block k
// of a range owns elements [k * chunk, (k + 1) * chunk). A range whose arrays share their offset
// from a 4-element boundary (16 bytes for fp32 arrays, 8 for bf16/f16) is processed in aligned
// groups of 4 elements after `peel` < 4 leading elements; block 0 also takes the leading and the
// < 4 trailing elements. Other ranges go element by element. Every element goes through
// adam_element exactly once.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <pipeswap/detail/message.hpp>
#include <pipeswap/backend/concepts.hpp>
#include <pipeswap/backend/device_ptr.hpp>
#include <pipeswap/config.hpp>
#include <pipeswap/detail/round.hpp>
#include <pipeswap/core/dtype.hpp>
#include <pipeswap/core/half.hpp>
#include <pipeswap/error.hpp>
#include <pipeswap/optim/adam_math.hpp>
#include <pipeswap/optim/adam_tensor.hpp>

namespace pipeswap::cuda::adam_detail {

inline constexpr unsigned block_threads = 256;
/// Elements of one range a block updates (a multiple of 4 * block_threads).
inline constexpr std::uint64_t chunk_elements = 16384;
/// Largest table passed directly as the update kernel's parameter.
inline constexpr std::size_t param_table_bytes = 4096;
/// Marks a range processed element by element.
inline constexpr std::uint8_t scalar_path = 255;

/// One range, as the kernel reads it.
struct alignas(16) desc {
  void* param;
  void const* grad;
  float* exp_avg;
  float* exp_avg_sq;
  float* max_exp_avg_sq; ///< null unless amsgrad
  float* master;         ///< null: update param in place
  std::uint64_t numel;
  std::uint32_t first_block; ///< blocks of the ranges before this one
  std::uint16_t scalars;     ///< index into the table's scalars
  std::uint8_t kind;         ///< param type * 3 + grad type, + 9 with a master (f32 0, bf16 1, f16 2)
  std::uint8_t peel;         ///< elements before the first aligned group, or scalar_path
};
static_assert(sizeof(desc) == 64);

struct alignas(16) header {
  std::uint32_t ranges;
  std::uint32_t scalars;
  std::uint32_t reserved[2];
};

/// Table layout: header | adam_step_scalars[scalars] | desc[ranges], descs 16-byte aligned.
PIPESWAP_HOST_DEVICE constexpr std::size_t descs_offset(std::size_t scalars) noexcept {
  return (sizeof(header) + scalars * sizeof(adam_step_scalars) + 15) / 16 * 16;
}

/// A batch's launch table (bytes padded to a multiple of 16) and grid size.
struct table {
  std::vector<unsigned char> bytes;
  std::uint64_t blocks = 0;
  std::size_t ranges = 0;
};

inline std::uint8_t type_index(dtype t) noexcept { return t == dtype::bf16 ? 1 : t == dtype::f16 ? 2 : 0; }

/// Element offset of `p` from a 4-element boundary; -1 when `p` is not aligned to its element size.
inline int group_offset(void const* p, std::size_t esize) noexcept {
  auto const a = reinterpret_cast<std::uintptr_t>(p);
  if (a % esize != 0) return -1;
  return static_cast<int>((a / esize) % 4);
}

/// Checks the batch (validate_adam_batch; every array aligned to its element size; at most 2^31 - 1
/// blocks; at most 65536 distinct scalars) and lays out its table. Ranges with numel == 0 are left
/// out; `ranges == 0` means there is nothing to launch. Throws invalid_argument.
template <pipeswap::backend B>
requires std::same_as<device_pointer_t<B>, device_ptr> table build_table(std::span<adam_tensor<B> const> tensors,
                                                                         std::span<adam_step_scalars const> scalars) {
  validate_adam_batch(tensors, scalars);
  constexpr auto none = std::numeric_limits<std::uint32_t>::max();
  std::vector<std::uint32_t> remap(scalars.size(), none);
  std::vector<adam_step_scalars> used;
  std::vector<desc> descs;
  descs.reserve(tensors.size());
  std::uint64_t blocks = 0;
  for (std::size_t r = 0; r < tensors.size(); ++r) {
    auto const& t = tensors[r];
    if (t.numel == 0) continue;
    auto const fail = [r](std::string const& why) {
      throw invalid_argument(pipeswap::detail::message({"pipeswap::cuda::enqueue_adam: batch range ", r, " ", why}));
    };
    desc d{};
    d.param = t.param.get();
    d.grad = t.grad.get();
    d.exp_avg = t.exp_avg.template get<float>();
    d.exp_avg_sq = t.exp_avg_sq.template get<float>();
    d.max_exp_avg_sq = scalars[t.scalars].amsgrad ? t.max_exp_avg_sq.template get<float>() : nullptr;
    d.master = t.master ? t.master.template get<float>() : nullptr;
    d.numel = t.numel;
    d.first_block = static_cast<std::uint32_t>(blocks);
    d.kind = static_cast<std::uint8_t>(type_index(t.param_type) * 3 + type_index(t.grad_type) +
                                       (d.master != nullptr ? 9 : 0));
    if (remap[t.scalars] == none) {
      if (used.size() == 65536) fail("brings the batch over 65536 distinct step counts");
      remap[t.scalars] = static_cast<std::uint32_t>(used.size());
      used.push_back(scalars[t.scalars]);
    }
    d.scalars = static_cast<std::uint16_t>(remap[t.scalars]);

    struct array {
      char const* name;
      void const* p;
      std::size_t esize;
    };
    array const arrays[] = {
        {"param", d.param, size_of(t.param_type)}, {"grad", d.grad, size_of(t.grad_type)},  {"exp_avg", d.exp_avg, 4},
        {"exp_avg_sq", d.exp_avg_sq, 4},           {"max_exp_avg_sq", d.max_exp_avg_sq, 4}, {"master", d.master, 4}};
    int common = -2; // -2: no array seen yet; -1: the arrays disagree
    for (auto const& a : arrays) {
      if (a.p == nullptr) continue;
      int const off = group_offset(a.p, a.esize);
      if (off < 0) {
        // A chain, not detail::message: nvcc 13's front end turns this braced list (a member of a local
        // struct in it) into a comma expression.
        fail(std::string("has ") + a.name + " not aligned to its " + std::to_string(a.esize) + "-byte elements");
      }
      common = common == -2 || common == off ? off : -1;
    }
    std::uint64_t const peel = common >= 0 ? (4 - static_cast<std::uint64_t>(common)) % 4 : 0;
    d.peel = common >= 0 && t.numel >= peel + 4 ? static_cast<std::uint8_t>(peel) : scalar_path;

    blocks += pipeswap::detail::ceil_div(std::uint64_t{t.numel}, chunk_elements);
    if (blocks > static_cast<std::uint64_t>(std::numeric_limits<int>::max())) {
      fail(pipeswap::detail::message({"brings the batch over 2^31 - 1 blocks of ", chunk_elements, " elements"}));
    }
    descs.push_back(d);
  }
  table out;
  out.blocks = blocks;
  out.ranges = descs.size();
  if (descs.empty()) return out;
  header const h{static_cast<std::uint32_t>(descs.size()), static_cast<std::uint32_t>(used.size()), {0, 0}};
  std::size_t const off = descs_offset(used.size());
  out.bytes.assign((off + descs.size() * sizeof(desc) + 15) / 16 * 16, 0);
  std::memcpy(out.bytes.data(), &h, sizeof h);
  std::memcpy(out.bytes.data() + sizeof h, used.data(), used.size() * sizeof(adam_step_scalars));
  std::memcpy(out.bytes.data() + off, descs.data(), descs.size() * sizeof(desc));
  return out;
}

/// 4 consecutive elements at an address aligned to 4 elements, widened to float (one 16- or
/// 8-byte load on the device).
template <class T>
PIPESWAP_HOST_DEVICE inline void load4(T const* p, float (&out)[4]) {
  if constexpr (sizeof(T) == 4) {
#if defined(__CUDA_ARCH__)
    float4 const x = *reinterpret_cast<float4 const*>(p);
    out[0] = x.x;
    out[1] = x.y;
    out[2] = x.z;
    out[3] = x.w;
#else
    std::memcpy(out, p, 16);
#endif
  } else {
    std::uint32_t w[2];
#if defined(__CUDA_ARCH__)
    uint2 const x = *reinterpret_cast<uint2 const*>(p);
    w[0] = x.x;
    w[1] = x.y;
#else
    std::memcpy(w, p, 8);
#endif
    for (int j = 0; j < 4; ++j) {
      out[j] = to_float(T{static_cast<std::uint16_t>(w[j / 2] >> (16 * (j % 2)))});
    }
  }
}

/// Rounds 4 floats to T (exactly, for float) and stores them at an address aligned to 4 elements.
template <class T>
PIPESWAP_HOST_DEVICE inline void store4(T* p, float const (&in)[4]) {
  if constexpr (sizeof(T) == 4) {
#if defined(__CUDA_ARCH__)
    *reinterpret_cast<float4*>(p) = make_float4(in[0], in[1], in[2], in[3]);
#else
    std::memcpy(p, in, 16);
#endif
  } else {
    std::uint32_t w[2] = {0, 0};
    for (int j = 0; j < 4; ++j) {
      w[j / 2] |= static_cast<std::uint32_t>(from_float<T>(in[j]).bits) << (16 * (j % 2));
    }
#if defined(__CUDA_ARCH__)
    *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
#else
    std::memcpy(p, w, 8);
#endif
  }
}

/// The elements of range `d` that thread `thread` of the range's block number `share` updates.
/// P: parameter storage, G: gradient storage, Master: update the fp32 master, then round it into
/// the parameter.
template <class P, class G, bool Master>
PIPESWAP_HOST_DEVICE void update_elements(desc const& d, adam_step_scalars const& s, std::uint64_t share,
                                          unsigned thread) {
  P* __restrict__ const param = static_cast<P*>(d.param);
  G const* __restrict__ const grad = static_cast<G const*>(d.grad);
  float* __restrict__ const m = d.exp_avg;
  float* __restrict__ const v = d.exp_avg_sq;
  float* __restrict__ const vmax = d.max_exp_avg_sq;
  float* __restrict__ const master = d.master;
  std::uint64_t const n = d.numel;

  auto one = [&](std::uint64_t i) {
    float w = Master ? master[i] : to_float(param[i]);
    float vm = s.amsgrad ? vmax[i] : 0.0f;
    adam_element(s, to_float(grad[i]), w, m[i], v[i], vm);
    if (s.amsgrad) vmax[i] = vm;
    if constexpr (Master) master[i] = w;
    param[i] = from_float<P>(w);
  };

  if (d.peel == scalar_path) {
    std::uint64_t const last = (share + 1) * chunk_elements;
    std::uint64_t const end = last < n ? last : n;
    for (std::uint64_t i = share * chunk_elements + thread; i < end; i += block_threads) one(i);
    return;
  }
  std::uint64_t const peel = d.peel;
  std::uint64_t const groups = (n - peel) / 4;
  std::uint64_t const last = (share + 1) * (chunk_elements / 4);
  std::uint64_t const end = last < groups ? last : groups;
  for (std::uint64_t k = share * (chunk_elements / 4) + thread; k < end; k += block_threads) {
    std::uint64_t const i = peel + 4 * k;
    float w[4], g[4], mm[4], vv[4], vm[4] = {0, 0, 0, 0};
    if constexpr (Master) {
      load4(master + i, w);
    } else {
      load4(param + i, w);
    }
    load4(grad + i, g);
    load4(m + i, mm);
    load4(v + i, vv);
    if (s.amsgrad) load4(vmax + i, vm);
    for (int j = 0; j < 4; ++j) adam_element(s, g[j], w[j], mm[j], vv[j], vm[j]);
    if constexpr (Master) store4(master + i, w);
    store4(param + i, w);
    store4(m + i, mm);
    store4(v + i, vv);
    if (s.amsgrad) store4(vmax + i, vm);
  }
  if (share == 0) { // the < 4 elements before the first group and the < 4 after the last
    std::uint64_t const tail = peel + 4 * groups;
    if (thread < peel) one(thread);
    if (tail + thread < n) one(tail + thread);
  }
}

PIPESWAP_HOST_DEVICE inline header const& header_of(unsigned char const* t) {
  return *reinterpret_cast<header const*>(t);
}
PIPESWAP_HOST_DEVICE inline desc const* descs_of(unsigned char const* t) {
  return reinterpret_cast<desc const*>(t + descs_offset(header_of(t).scalars));
}

/// Index of the range block `block` works on: the last range whose first block is <= block. Each
/// round every thread tests one evenly spaced candidate, so up to 256 ranges take one round and up
/// to 65536 two. `count(pred)`: the number of the block's threads t with pred(t).
template <class Count>
PIPESWAP_HOST_DEVICE std::uint32_t locate(unsigned char const* t, std::uint32_t block, Count&& count) {
  desc const* const ds = descs_of(t);
  std::uint32_t lo = 0, n = header_of(t).ranges;
  while (n > 1) {
    std::uint32_t const stride = pipeswap::detail::ceil_div(n, std::uint32_t{block_threads});
    auto const below = [&](unsigned thread) {
      return thread * stride < n && ds[lo + thread * stride].first_block <= block;
    };
    auto const hits = static_cast<std::uint32_t>(count(below)); // >= 1: ds[lo] qualifies
    std::uint32_t const next = lo + (hits - 1) * stride;
    std::uint32_t const left = lo + n - next;
    n = stride < left ? stride : left;
    lo = next;
  }
  return lo;
}

/// Thread `thread` of block `block`, which works on range `range`: its share of the update.
PIPESWAP_HOST_DEVICE inline void update_share(unsigned char const* t, std::uint32_t range, std::uint32_t block,
                                              unsigned thread) {
  desc const d = descs_of(t)[range];
  adam_step_scalars const s = reinterpret_cast<adam_step_scalars const*>(t + sizeof(header))[d.scalars];
  std::uint64_t const share = block - d.first_block;
  switch (d.kind) {
  case 0: update_elements<float, float, false>(d, s, share, thread); break;
  case 1: update_elements<float, bf16, false>(d, s, share, thread); break;
  case 2: update_elements<float, f16, false>(d, s, share, thread); break;
  case 3: update_elements<bf16, float, false>(d, s, share, thread); break;
  case 4: update_elements<bf16, bf16, false>(d, s, share, thread); break;
  case 5: update_elements<bf16, f16, false>(d, s, share, thread); break;
  case 6: update_elements<f16, float, false>(d, s, share, thread); break;
  case 7: update_elements<f16, bf16, false>(d, s, share, thread); break;
  case 8: update_elements<f16, f16, false>(d, s, share, thread); break;
  case 12: update_elements<bf16, float, true>(d, s, share, thread); break;
  case 13: update_elements<bf16, bf16, true>(d, s, share, thread); break;
  case 14: update_elements<bf16, f16, true>(d, s, share, thread); break;
  case 15: update_elements<f16, float, true>(d, s, share, thread); break;
  case 16: update_elements<f16, bf16, true>(d, s, share, thread); break;
  case 17: update_elements<f16, f16, true>(d, s, share, thread); break;
  default: break; // build_table makes no other kind
  }
}

} // namespace pipeswap::cuda::adam_detail
