// The fused CUDA Adam kernel's work, emulated on the host: the same functions the kernel runs
// (optim/cuda/detail/adam_batch.hpp: table layout, block-to-range search, element split, vector
// loads and stores), executed block by block and thread by thread on the CPU, must equal the host
// reference loop bit for bit — every parameter/gradient type, with and without master, amsgrad on
// and off, every alignment pattern (vector path with each peel, element path), sizes around the
// group and chunk boundaries, several step counts in one batch, tables too large for a kernel
// parameter. Runs everywhere; the GPU runs the same functions in tests/cuda (cuda_adam_kernels).
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <pipeswap/backend/mock.hpp>
#include <pipeswap/optim/adam_tensor.hpp>
#include <pipeswap/optim/cuda/detail/adam_batch.hpp>

#include "support/adam_ranges.hpp"

BOOST_AUTO_TEST_SUITE(optim_adam_batch)

namespace ps = pipeswap;
namespace ad = pipeswap::cuda::adam_detail;
using ps::test::host_range;
using tensor = ps::adam_tensor<ps::mock::backend>;

namespace {

/// How many of a block's threads satisfy `pred`: what __syncthreads_count returns on the device.
unsigned count_threads(auto const& pred) {
  unsigned c = 0;
  for (unsigned th = 0; th < ad::block_threads; ++th) c += pred(th) ? 1u : 0u;
  return c;
}

/// Runs a table the way the GPU does: every block, every thread.
void emulate(ad::table const& t) {
  for (std::uint32_t b = 0; b < t.blocks; ++b) {
    auto const r = ad::locate(t.bytes.data(), b, [](auto const& pred) { return count_threads(pred); });
    for (unsigned th = 0; th < ad::block_threads; ++th) ad::update_share(t.bytes.data(), r, b, th);
  }
}

tensor view(host_range& r) {
  return r.view<ps::mock::backend>([&](std::size_t a) { return ps::device_ptr(r.arrays[a].data()); });
}

ad::table build(std::vector<tensor> const& ts, std::vector<ps::adam_step_scalars> const& sc) {
  return ad::build_table(std::span<tensor const>(ts), std::span<ps::adam_step_scalars const>(sc));
}

/// Emulates the batch of `rs`, applies the host loop to `twins`, compares every array.
void check_batch(std::vector<host_range>& rs, std::vector<host_range>& twins,
                 std::vector<ps::adam_step_scalars> const& sc, std::string const& what) {
  std::vector<tensor> ts;
  for (auto& r : rs) ts.push_back(view(r));
  emulate(build(ts, sc));
  for (std::size_t i = 0; i < rs.size(); ++i) {
    BOOST_TEST(ps::test::differs_from_reference(rs[i], twins[i], sc) == "",
               what << " range " << i << " numel " << rs[i].n);
  }
}

std::size_t const sizes[] = {1, 2, 3, 4, 5, 7, 8, 13, 100, 1030, ad::chunk_elements + 7};

} // namespace

BOOST_AUTO_TEST_CASE(emulated_kernel_equals_the_host_loop_for_every_kind_and_alignment) {
  ps::test::for_each_sweep_batch(sizes, 1, [](auto& rs, auto& twins, auto const& sc, std::string const& what) {
    check_batch(rs, twins, sc, what);
  });
}

BOOST_AUTO_TEST_CASE(a_table_too_large_for_a_kernel_parameter_is_laid_out_the_same_way) {
  auto const sc = ps::test::batch_scalars(false, true);
  auto const& types = ps::test::adam_types;
  std::vector<host_range> rs, twins;
  for (std::uint32_t k = 0; k < 300; ++k) { // 300 descriptors: about 19 KiB
    auto const p = types[k % 3];
    bool const master = p != ps::dtype::f32 && k % 2 == 0;
    rs.emplace_back(p, types[(k / 3) % 3], master, false, 1 + k % 37, k % 3, ps::test::range_offsets{}, 5000 + k);
    twins.emplace_back(p, types[(k / 3) % 3], master, false, 1 + k % 37, k % 3, ps::test::range_offsets{}, 5000 + k);
  }
  std::vector<tensor> ts;
  for (auto& r : rs) ts.push_back(view(r));
  auto const t = build(ts, sc);
  BOOST_TEST(t.bytes.size() > ad::param_table_bytes);
  BOOST_TEST(t.ranges == 300u);
  BOOST_TEST(t.blocks == 300u);
  check_batch(rs, twins, sc, "300 ranges");
}

BOOST_AUTO_TEST_CASE(every_block_finds_its_range) {
  // 70000 ranges of 1..3 chunks: the search takes three rounds (256^2 < 70000).
  std::vector<ad::desc> ds(70000);
  std::uint32_t first = 0;
  std::vector<std::uint32_t> owner;
  for (std::size_t r = 0; r < ds.size(); ++r) {
    ds[r].first_block = first;
    std::uint32_t const k = 1 + static_cast<std::uint32_t>(r * 7 % 3);
    for (std::uint32_t j = 0; j < k; ++j) owner.push_back(static_cast<std::uint32_t>(r));
    first += k;
  }
  std::vector<unsigned char> table(ad::descs_offset(0) + ds.size() * sizeof(ad::desc));
  ad::header const h{static_cast<std::uint32_t>(ds.size()), 0, {0, 0}};
  std::memcpy(table.data(), &h, sizeof h);
  std::memcpy(table.data() + ad::descs_offset(0), ds.data(), ds.size() * sizeof(ad::desc));
  auto const count = [](auto const& pred) { return count_threads(pred); };
  std::size_t wrong = 0;
  for (std::uint32_t b = 0; b < owner.size(); b += 1 + b % 5) {
    wrong += ad::locate(table.data(), b, count) != owner[b];
  }
  BOOST_TEST(wrong == 0u);
  BOOST_TEST(ad::locate(table.data(), static_cast<std::uint32_t>(owner.size() - 1), count) == 69999u);
}

BOOST_AUTO_TEST_CASE(bad_batches_are_rejected_with_the_range_and_the_rule) {
  auto const sc = ps::test::batch_scalars(true, true);
  host_range r(ps::dtype::bf16, ps::dtype::f32, true, true, 10, 0, ps::test::range_offsets{}, 1);
  auto expect = [&](tensor t, std::string const& message) {
    std::vector<tensor> ts{view(r), t};
    BOOST_CHECK_EXCEPTION(build(ts, sc), ps::invalid_argument, [&](auto const& e) {
      if (std::string(e.what()) != message) BOOST_TEST_MESSAGE("got: " << e.what());
      return std::string(e.what()) == message;
    });
  };
  auto t = view(r);
  t.scalars = 3;
  expect(t, "adam kernels: batch range 1 uses step scalars 3 but the step has 3");
  t = view(r);
  t.max_exp_avg_sq = {};
  expect(t, "adam kernels: batch range 1 has no max_exp_avg_sq");
  t = view(r);
  t.param_type = ps::dtype::f32;
  expect(t, "adam kernels: batch range 1 has an F32 parameter and a master");
  t = view(r);
  t.grad_type = ps::dtype::i64;
  expect(t, "adam kernels: batch range 1 has types BF16/I64; F32, BF16 and F16 are supported");
  t = view(r);
  t.exp_avg_sq = t.exp_avg + 4;
  expect(t, "adam kernels: batch range 1 has exp_avg and exp_avg_sq overlapping");
  t = view(r);
  t.exp_avg = t.exp_avg + 2;
  t.exp_avg_sq = t.exp_avg_sq + 2;
  expect(t, "pipeswap::cuda::enqueue_adam: batch range 1 has exp_avg not aligned to its 4-byte elements");
  t = view(r);
  t.exp_avg = {};
  t.numel = 0; // empty ranges are not looked at
  auto const table = build({view(r), t}, sc);
  BOOST_TEST(table.ranges == 1u);
}

BOOST_AUTO_TEST_SUITE_END() // optim_adam_batch
