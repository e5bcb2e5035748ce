// The pinned pool: slab sizes (configurable, geometric growth from a small first slab), dedicated
// blocks, trimming, and the rejection of inconsistent options.
#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <string>
#include <vector>

#include <pipeswap/backend/mock.hpp>
#include <pipeswap/core/pinned_pool.hpp>

namespace ps = pipeswap;
namespace mock = pipeswap::mock;

namespace {
constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;

/// Allocates `count` host blocks of `n` bytes.
std::vector<ps::pinned_block> take(ps::pinned_pool<mock::backend>& pool, std::size_t count, std::size_t n) {
  std::vector<ps::pinned_block> out;
  for (std::size_t i = 0; i < count; ++i) out.push_back(pool.allocate_for_host(n));
  return out;
}
} // namespace

BOOST_AUTO_TEST_SUITE(core_pinned_pool)

// A 4 MB model's worth of small mirrors pins 4 MiB of slabs (1 + 1 + 2), not a 64 MiB slab.
BOOST_AUTO_TEST_CASE(default_slabs_grow_with_use) {
  mock::backend b;
  ps::pinned_pool<mock::backend> pool(b);
  auto blocks = take(pool, 1000, 4 * KiB);
  auto const st = pool.stats();
  BOOST_TEST(st.used_bytes == 1000 * 4 * KiB);
  BOOST_TEST(st.slabs == 3u);
  BOOST_TEST(st.reserved_bytes == 4 * MiB);
  BOOST_TEST(b.host_bytes_in_use() == 4 * MiB);
  BOOST_TEST(st.reserved_bytes < 2 * st.used_bytes + MiB);
  for (auto& blk : blocks) pool.deallocate(blk);
  BOOST_TEST(pool.stats().used_bytes == 0u);
}

// Growth doubles the slab bytes held and stops at slab_bytes.
BOOST_AUTO_TEST_CASE(slab_bytes_caps_growth) {
  mock::backend b;
  ps::pinned_pool_options o;
  o.slab_bytes = 2 * MiB;
  o.dedicated_threshold = 256 * KiB;
  ps::pinned_pool<mock::backend> pool(b, o);
  std::vector<std::size_t> held;
  std::vector<ps::pinned_block> blocks;
  for (int i = 0; i < 36; ++i) {
    blocks.push_back(pool.allocate_for_host(128 * KiB)); // eight per MiB
    held.push_back(pool.stats().reserved_bytes);
  }
  // Slabs of 1, 1, 2, 2 MiB: full after 8, 16, 32 and 48 blocks.
  BOOST_TEST(held[0] == 1 * MiB);
  BOOST_TEST(held[7] == 1 * MiB);
  BOOST_TEST(held[8] == 2 * MiB);
  BOOST_TEST(held[15] == 2 * MiB);
  BOOST_TEST(held[16] == 4 * MiB);
  BOOST_TEST(held[31] == 4 * MiB);
  BOOST_TEST(held[32] == 6 * MiB);
  BOOST_TEST(pool.stats().slabs == 4u);
  for (auto& blk : blocks) pool.deallocate(blk);
}

// The old fixed-size behaviour is one option away: first_slab_bytes == slab_bytes.
BOOST_AUTO_TEST_CASE(fixed_slabs_on_request) {
  mock::backend b;
  ps::pinned_pool_options o;
  o.slab_bytes = o.first_slab_bytes = 8 * MiB;
  ps::pinned_pool<mock::backend> pool(b, o);
  auto blk = pool.allocate_for_host(512);
  BOOST_TEST(pool.stats().reserved_bytes == 8 * MiB);
  BOOST_TEST(pool.options().slab_bytes == 8 * MiB);
  pool.deallocate(blk);
}

// A block larger than the next slab would be gets a slab of its own size; a first slab larger than
// slab_bytes is capped; requests at the threshold are dedicated and exact.
BOOST_AUTO_TEST_CASE(slab_sizes_follow_the_request) {
  mock::backend b;
  ps::pinned_pool_options o;
  o.slab_bytes = 4 * MiB;
  o.first_slab_bytes = 64 * MiB; // capped to slab_bytes
  o.dedicated_threshold = 4 * MiB;
  ps::pinned_pool<mock::backend> pool(b, o);
  auto a = pool.allocate_for_host(100);
  BOOST_TEST(pool.stats().reserved_bytes == 4 * MiB);
  auto big = pool.allocate_for_host(4 * MiB + 1);
  BOOST_TEST(pool.stats().dedicated == 1u);
  BOOST_TEST(pool.stats().reserved_bytes == 8 * MiB + 1);
  pool.deallocate(a);
  pool.deallocate(big);

  ps::pinned_pool_options small;
  small.slab_bytes = 1 * MiB;
  small.first_slab_bytes = 64 * KiB;
  small.dedicated_threshold = 1 * MiB;
  ps::pinned_pool<mock::backend> p2(b, small);
  auto x = p2.allocate_for_host(1000 * KiB); // larger than the 64 KiB first slab
  BOOST_TEST(p2.stats().reserved_bytes == 1000 * KiB);
  p2.deallocate(x);
}

// trim() returns free slabs; growth then starts again from the first slab size.
BOOST_AUTO_TEST_CASE(trim_resets_growth) {
  mock::backend b;
  ps::pinned_pool<mock::backend> pool(b);
  auto blocks = take(pool, 600, 4 * KiB); // slabs of 1, 1, 2 MiB
  BOOST_TEST(pool.stats().reserved_bytes == 4 * MiB);
  for (auto& blk : blocks) pool.deallocate(blk);
  pool.trim();
  BOOST_TEST(pool.stats().reserved_bytes == 0u);
  BOOST_TEST(pool.stats().slabs == 0u);
  BOOST_TEST(b.host_bytes_in_use() == 0u);
  auto one = pool.allocate_for_host(4 * KiB);
  BOOST_TEST(pool.stats().reserved_bytes == 1 * MiB);
  pool.deallocate(one);
}

BOOST_AUTO_TEST_CASE(inconsistent_options_are_rejected) {
  mock::backend b;
  auto rejects = [&](ps::pinned_pool_options o, char const* what) {
    try {
      ps::pinned_pool<mock::backend> pool(b, o);
      BOOST_ERROR("accepted: " << what);
    } catch (ps::invalid_argument const& e) {
      BOOST_TEST(std::string(e.what()).find(what) != std::string::npos, e.what());
    }
  };
  ps::pinned_pool_options o;
  o.slab_bytes = 1 * MiB; // below the 4 MiB dedicated threshold
  rejects(o, "slab_bytes (1048576) must be at least dedicated_threshold (4194304)");
  o = {};
  o.alignment = 768;
  rejects(o, "alignment 768 is not a power of two");
  o = {};
  o.first_slab_bytes = 0;
  rejects(o, "first_slab_bytes must be positive");
}

BOOST_AUTO_TEST_SUITE_END() // core_pinned_pool
