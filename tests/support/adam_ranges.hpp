// Adam batches for kernel tests: ranges with deterministic contents at chosen alignments, their
// host reference update, and a kernel policy for the user-written synchronous backend.
//
//   host_array            16-byte aligned host storage; the array starts `offset` elements in.
//   host_range            one range's six arrays (param, grad, exp_avg, exp_avg_sq,
//                         max_exp_avg_sq, master) with its types, size, scalars index;
//                         view(where) makes the adam_tensor<B> a policy receives, reference(s)
//                         applies the host loop in place, state() returns every array's bytes.
//   adam_kernels<sync_host_backend>   the host loop over "device" memory that is host memory: the
//                         policy a user with such a backend would write.
//
// Shared by tests/optim/adam_batch_test.cpp (the CUDA kernel's work emulated in host memory) and
// tests/optim/adam_kernels_test.cpp (the policies of every backend on their own memory).
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <pipeswap/optim/mock/adam_kernels.hpp>
#include <pipeswap/optim/adam.hpp>
#include <pipeswap/optim/adam_math.hpp>
#include <pipeswap/optim/adam_tensor.hpp>

#include "support/backends.hpp"
#include "support/sanitized.hpp"
#include "support/world.hpp"

namespace pipeswap::test {

struct host_array {
  std::vector<float> storage; // operator new: 16-byte aligned
  std::size_t esize = 4, offset = 0, n = 0;

  host_array(std::size_t n_, std::size_t esize_, std::size_t offset_)
      : storage((n_ + offset_ + 8) * esize_ / 4 + 4), esize(esize_), offset(offset_), n(n_) {}
  [[nodiscard]] unsigned char* data() { return reinterpret_cast<unsigned char*>(storage.data()) + offset * esize; }
  [[nodiscard]] std::size_t storage_bytes() const { return storage.size() * 4; }
  [[nodiscard]] std::vector<unsigned char> bytes() { return {data(), data() + n * esize}; }

  /// Stores `v` as type `t` (rounded to nearest even for bf16/f16).
  void put(dtype t, std::vector<float> const& v) {
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (t == dtype::f32) {
        std::memcpy(data() + 4 * i, &v[i], 4);
      } else {
        std::uint16_t const bits = t == dtype::bf16 ? to_bf16(v[i]).bits : to_f16(v[i]).bits;
        std::memcpy(data() + 2 * i, &bits, 2);
      }
    }
  }
};

/// Offsets in elements of (param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, master).
using range_offsets = std::array<std::size_t, 6>;

struct host_range {
  dtype ptype, gtype;
  bool master, amsgrad;
  std::size_t n;
  std::uint32_t scalars;
  std::vector<host_array> arrays; // param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, master

  host_range(dtype p, dtype g, bool with_master, bool ams, std::size_t n_, std::uint32_t sc, range_offsets const& off,
             std::uint64_t seed)
      : ptype(p), gtype(g), master(with_master), amsgrad(ams), n(n_), scalars(sc) {
    std::size_t const es[6] = {size_of(p), size_of(g), 4, 4, 4, 4};
    for (std::size_t a = 0; a < 6; ++a) arrays.emplace_back(n, es[a], off[a]);
    auto const pv = random_floats(n, seed);
    arrays[0].put(p, pv);
    arrays[1].put(g, random_floats(n, seed + 1));
    arrays[2].put(dtype::f32, random_floats(n, seed + 2));
    auto sq = random_floats(n, seed + 3);
    for (auto& x : sq) x *= x;
    arrays[3].put(dtype::f32, sq);
    for (auto& x : sq) x *= 1.5f;
    arrays[4].put(dtype::f32, sq);
    arrays[5].put(dtype::f32, pv);
  }

  /// The range as a policy sees it; `where(a)` is the device address of element 0 of array a.
  template <class B, class Where>
  [[nodiscard]] adam_tensor<B> view(Where&& where) {
    adam_tensor<B> t;
    t.param = where(0);
    t.grad = where(1);
    t.exp_avg = where(2);
    t.exp_avg_sq = where(3);
    if (amsgrad) t.max_exp_avg_sq = where(4);
    if (master) t.master = where(5);
    t.numel = n;
    t.param_type = ptype;
    t.grad_type = gtype;
    t.scalars = scalars;
    return t;
  }

  /// The host reference loop, applied in place.
  void reference(adam_step_scalars const& s) {
    auto f32 = [&](std::size_t a) { return reinterpret_cast<float*>(arrays[a].data()); };
    adam_update_host(s, ptype, gtype, arrays[0].data(), arrays[1].data(), f32(2), f32(3), amsgrad ? f32(4) : nullptr,
                     master ? f32(5) : nullptr, n);
  }

  [[nodiscard]] std::vector<std::vector<unsigned char>> state() {
    std::vector<std::vector<unsigned char>> out;
    for (auto& a : arrays) out.push_back(a.bytes());
    return out;
  }
};

inline constexpr char const* array_names[] = {"param", "grad", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "master"};

/// Applies the host loop to `twin` (with its scalars from `sc`) and names the arrays in which `got`
/// differs from it: "" when every byte matches.
inline std::string differs_from_reference(host_range& got, host_range& twin, std::span<adam_step_scalars const> sc) {
  twin.reference(sc[twin.scalars]);
  auto const a = got.state(), b = twin.state();
  std::string out;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) out += std::string(out.empty() ? "" : ", ") + array_names[i];
  }
  return out;
}

/// Scalars of steps 1, 2 and 7 of an Adam (or AdamW) configuration with weight decay.
inline std::vector<adam_step_scalars> batch_scalars(bool amsgrad, bool adamw) {
  adam_config c;
  c.lr = 0.01;
  c.weight_decay = 0.05;
  c.amsgrad = amsgrad;
  c.decoupled_weight_decay = adamw;
  return {make_step_scalars(c, 1), make_step_scalars(c, 2), make_step_scalars(c, 7)};
}

inline constexpr dtype adam_types[] = {dtype::f32, dtype::bf16, dtype::f16};

/// Offsets that take the vector path with each peel (equal offsets) and the element path.
inline constexpr range_offsets batch_offsets[] = {
    {0, 0, 0, 0, 0, 0}, {1, 1, 1, 1, 1, 1}, {2, 2, 2, 2, 2, 2}, {3, 3, 3, 3, 3, 3}, {0, 1, 0, 2, 3, 0}};

/// The kernel sweep: calls f(ranges, twins, scalars, what) for each batch — amsgrad on and off
/// (Adam and AdamW), every parameter/gradient type, with and without master, every offset pattern
/// of batch_offsets. A batch holds `copies` ranges of each size, using the scalars of steps 1, 2, 7
/// in turn; `twins` are identical ranges for the host reference; `what` describes the batch. Under
/// sanitizers it runs a sample: each (amsgrad, types, master) kind with one offset pattern, in turn.
template <class F>
void for_each_sweep_batch(std::span<std::size_t const> sizes, std::size_t copies, F&& f) {
  std::uint64_t seed = 1;
  std::size_t kind = 0; // the index of (amsgrad, param, grad, master)
  for (bool amsgrad : {false, true}) {
    auto const sc = batch_scalars(amsgrad, !amsgrad);
    for (auto p : adam_types) {
      for (auto g : adam_types) {
        for (bool master : {false, true}) {
          if (master && p == dtype::f32) continue;
          for (std::size_t o = 0; o < std::size(batch_offsets); ++o) {
            auto const& off = batch_offsets[o];
            // Under sanitizers (ten times slower) each kind runs with one of the offsets, in turn:
            // every kind and every offset is still covered, with the same data as the full sweep.
            if (sanitized_build && o != kind % std::size(batch_offsets)) {
              seed += 10 * copies * sizes.size();
              continue;
            }
            std::vector<host_range> rs, twins;
            for (std::size_t c = 0; c < copies; ++c) {
              for (std::size_t k = 0; k < sizes.size(); ++k) {
                auto const i = static_cast<std::uint32_t>(k % sc.size());
                rs.emplace_back(p, g, master, amsgrad, sizes[k], i, off, seed);
                twins.emplace_back(p, g, master, amsgrad, sizes[k], i, off, seed);
                seed += 10;
              }
            }
            f(rs, twins, sc,
              std::string(name_of(p)) + "/" + std::string(name_of(g)) + (master ? " master" : "") +
                  (amsgrad ? " amsgrad" : "") + " offsets " + std::to_string(off[0]) + std::to_string(off[1]) +
                  std::to_string(off[3]));
          }
          ++kind;
        }
      }
    }
  }
}

} // namespace pipeswap::test

/// A user-written policy: the sync_host_backend's device memory is host memory and its calls
/// complete at once, so the library's host policy is the whole of it.
template <>
struct pipeswap::adam_kernels<pipeswap::test::sync_host_backend>
    : pipeswap::host_adam_kernels<pipeswap::test::sync_host_backend> {};
