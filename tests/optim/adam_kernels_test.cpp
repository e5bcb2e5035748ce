// The Adam kernel policies, the same bodies on every backend of support/backend_list.hpp: the mock
// and the user-written synchronous backend here, the CUDA backend's fused kernels in tests/cuda
// (cuda_adam_kernels, skipped without a GPU). Each batch's device results must equal the host loop
// bit for bit — every parameter/gradient type, master or not, amsgrad on and off, each alignment
// pattern, sizes around the vector group and block boundaries, several step counts per batch, and a
// batch too large for a kernel parameter; a bad batch must throw before any tensor changes.
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "support/backend_list.hpp"

#include <pipeswap/optim/mock/adam_kernels.hpp>
#include <pipeswap/optim/adam.hpp>
#include <pipeswap/optim/adam_tensor.hpp>
#if defined(PIPESWAP_TEST_CUDA)
#  include <pipeswap/optim/cuda/adam_kernels.hpp>
#endif

#include "support/adam_ranges.hpp"
#include "support/world.hpp"
#include "support/no_hazards.hpp"

BOOST_AUTO_TEST_SUITE(optim_adam_kernels)

namespace ps = pipeswap;
using ps::test::backend_fixture;
using ps::test::backends_under_test;
using ps::test::host_range;

using gate = ps::test::skip_unless_available<backends_under_test>;
BOOST_TEST_GLOBAL_FIXTURE(gate);

namespace {

/// A host_range's storage mirrored in device memory of `b` (same offsets).
template <class B>
struct on_device {
  B& b;
  host_range& r;
  std::vector<ps::device_ptr> mem;

  on_device(B& b_, host_range& r_) : b(b_), r(r_) {
    for (auto& a : r.arrays) {
      mem.push_back(b.allocate_device(a.storage_bytes(), b.current_stream()));
      ps::test::upload(b, mem.back(), a.storage.data(), a.storage_bytes());
    }
  }
  on_device(on_device const&) = delete;
  ~on_device() {
    for (std::size_t a = 0; a < mem.size(); ++a) {
      b.deallocate_device(mem[a], r.arrays[a].storage_bytes(), b.current_stream());
    }
  }
  ps::adam_tensor<B> view() {
    return r.template view<B>([&](std::size_t a) { return mem[a] + r.arrays[a].offset * r.arrays[a].esize; });
  }
  /// Copies the device bytes back into the host_range.
  void fetch() {
    for (std::size_t a = 0; a < mem.size(); ++a) {
      auto const bytes = ps::test::download(b, mem[a], r.arrays[a].storage_bytes());
      std::memcpy(r.arrays[a].storage.data(), bytes.data(), bytes.size());
    }
  }
};

/// Runs the batch of `rs` through B's policy on a stream of its own, applies the host loop to
/// `twins`, compares every array.
template <class B>
void check_batch(B& b, std::vector<host_range>& rs, std::vector<host_range>& twins,
                 std::vector<ps::adam_step_scalars> const& sc, std::string const& what) {
  if constexpr (std::is_same_v<B, ps::mock::backend>) b.set_hazard_policy(ps::mock::hazard_policy::record);
  std::vector<std::unique_ptr<on_device<B>>> dev;
  std::vector<ps::adam_tensor<B>> ts;
  for (auto& r : rs) {
    dev.push_back(std::make_unique<on_device<B>>(b, r));
    ts.push_back(dev.back()->view());
  }
  auto const s = b.new_stream();
  b.wait_event(s, b.record_event(b.current_stream())); // the uploads ran on the compute stream
  ps::adam_kernels<B>{}.update(b, s, ts, sc);
  b.wait_event(b.current_stream(), b.record_event(s));
  for (auto& d : dev) d->fetch();
  for (std::size_t i = 0; i < rs.size(); ++i) {
    BOOST_TEST(ps::test::differs_from_reference(rs[i], twins[i], sc) == "",
               what << " range " << i << " numel " << rs[i].n);
  }
  PIPESWAP_CHECK_NO_HAZARDS(b);
}

// Around the vector group (4), the block chunk (16384) and, on the GPU, several blocks (the
// host-executed policies loop over a range as a whole; optim_adam_batch emulates the blocks).
std::size_t const sizes[] = {1,    3, 4, 5, 8, 13, 1030, 16384, 16391,
#if defined(PIPESWAP_TEST_CUDA)
                             70001
#endif
};

} // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(policy_equals_the_host_loop_for_every_kind_and_alignment, B, backends_under_test) {
  backend_fixture<B> f;
  ps::test::for_each_sweep_batch(sizes, 1, [&](auto& rs, auto& twins, auto const& sc, std::string const& what) {
    check_batch(f.b, rs, twins, sc, what);
  });
}

BOOST_AUTO_TEST_CASE_TEMPLATE(a_batch_of_many_small_ranges_is_one_update, B, backends_under_test) {
  // 1200 ranges: a table of about 77 KiB, written by three copy kernels on CUDA.
  backend_fixture<B> f;
  auto const sc = ps::test::batch_scalars(true, true);
  auto const& types = ps::test::adam_types;
  std::vector<host_range> rs, twins;
  for (std::uint32_t k = 0; k < 1200; ++k) {
    auto const p = types[k % 3];
    bool const master = p != ps::dtype::f32 && k % 2 == 0;
    ps::test::range_offsets off{};
    off.fill(k % 7 == 0 ? 1 : 0);
    rs.emplace_back(p, types[(k / 3) % 3], master, true, 1 + k % 50, k % 3, off, 9000 + k);
    twins.emplace_back(p, types[(k / 3) % 3], master, true, 1 + k % 50, k % 3, off, 9000 + k);
  }
  check_batch(f.b, rs, twins, sc, "1200 ranges");
}

BOOST_AUTO_TEST_CASE_TEMPLATE(a_bad_batch_throws_before_any_tensor_changes, B, backends_under_test) {
  backend_fixture<B> f;
  auto& b = f.b;
  if constexpr (std::is_same_v<B, ps::mock::backend>) b.set_hazard_policy(ps::mock::hazard_policy::record);
  auto const sc = ps::test::batch_scalars(false, true);
  host_range good(ps::dtype::f32, ps::dtype::f32, false, false, 5000, 0, ps::test::range_offsets{}, 3);
  host_range bad(ps::dtype::bf16, ps::dtype::bf16, true, false, 100, 1, ps::test::range_offsets{}, 4);
  auto const before = good.state();
  on_device<B> dg(b, good), db(b, bad);
  auto t = db.view();
  t.exp_avg_sq = {};
  std::vector<ps::adam_tensor<B>> ts{dg.view(), t};
  BOOST_CHECK_EXCEPTION(
      ps::adam_kernels<B>{}.update(b, b.current_stream(), ts, sc), ps::invalid_argument,
      [](auto const& e) { return std::string(e.what()) == "adam kernels: batch range 1 has no exp_avg_sq"; });
  ts[1] = db.view();
  ts[1].scalars = 5;
  BOOST_CHECK_THROW(ps::adam_kernels<B>{}.update(b, b.current_stream(), ts, sc), ps::invalid_argument);
  dg.fetch();
  BOOST_TEST((good.state() == before));
  // Empty batches and empty ranges enqueue nothing.
  ps::adam_kernels<B>{}.update(b, b.current_stream(), {}, sc);
  ts[1].numel = 0;
  ts.erase(ts.begin());
  ps::adam_kernels<B>{}.update(b, b.current_stream(), ts, sc);
  PIPESWAP_CHECK_NO_HAZARDS(b);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(init_master_widens_the_parameter, B, backends_under_test) {
  backend_fixture<B> f;
  auto& b = f.b;
  for (auto type : ps::test::adam_types) {
    for (std::size_t n : {std::size_t{1}, std::size_t{70001}}) {
      ps::test::host_array param(n, ps::size_of(type), 0);
      auto const values = ps::test::random_floats(n, n + 17);
      param.put(type, values);
      auto const cs = b.current_stream();
      auto const dp = b.allocate_device(n * ps::size_of(type), cs);
      auto const dm = b.allocate_device(n * 4, cs);
      ps::test::upload(b, dp, param.data(), n * ps::size_of(type));
      ps::adam_kernels<B>{}.init_master(b, cs, dp, dm, n, type);
      auto const got = ps::test::download(b, dm, n * 4);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < n; ++i) {
        float want = values[i];
        if (type == ps::dtype::bf16) want = ps::to_float(ps::to_bf16(values[i]));
        if (type == ps::dtype::f16) want = ps::to_float(ps::to_f16(values[i]));
        wrong += std::memcmp(got.data() + 4 * i, &want, 4) != 0;
      }
      BOOST_TEST(wrong == 0u, ps::name_of(type) << " numel " << n);
      b.deallocate_device(dp, n * ps::size_of(type), cs);
      b.deallocate_device(dm, n * 4, cs);
    }
  }
}

#if defined(PIPESWAP_TEST_CUDA)
BOOST_AUTO_TEST_CASE(cuda_rejects_arrays_not_aligned_to_their_elements) {
  backend_fixture<ps::cuda::backend> f;
  auto const sc = ps::test::batch_scalars(false, true);
  host_range r(ps::dtype::f32, ps::dtype::f32, false, false, 64, 0, ps::test::range_offsets{}, 5);
  on_device<ps::cuda::backend> d(f.b, r);
  auto t = d.view();
  t.grad = t.grad + 2;
  std::vector<ps::adam_tensor<ps::cuda::backend>> ts{t};
  BOOST_CHECK_EXCEPTION(ps::adam_kernels<ps::cuda::backend>{}.update(f.b, f.b.current_stream(), ts, sc),
                        ps::invalid_argument, [](auto const& e) {
                          return std::string(e.what()) ==
                                 "pipeswap::cuda::enqueue_adam: batch range 0 has grad not aligned to its "
                                 "4-byte elements";
                        });
}
#endif

BOOST_AUTO_TEST_SUITE_END() // optim_adam_kernels
