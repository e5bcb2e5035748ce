// Partition policies: the reference rule's published cases, and sweeps with an oracle (a literal
// transcription of the reference loop) over sizes × batch counts; the element-splitting policy's
// tiling and balance invariants.
#define BOOST_TEST_MODULE partition
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include <range/v3/algorithm/equal.hpp>
#include <range/v3/numeric/accumulate.hpp>
#include <range/v3/view/iota.hpp>
#include <range/v3/view/transform.hpp>

#include <pipeswap/swap/partition.hpp>

namespace ps = pipeswap;

namespace {

std::vector<std::uint64_t> batch_costs(std::vector<std::uint64_t> const& costs, std::vector<std::size_t> const& sizes) {
  std::vector<std::uint64_t> out;
  std::size_t i = 0;
  for (auto s : sizes) {
    std::uint64_t c = 0;
    for (std::size_t j = 0; j < s; ++j) c += costs[i++];
    out.push_back(c);
  }
  return out;
}

__extension__ using i128 = __int128; // signed and wide enough for Σw · swap_times

/// The reference loop, written out as plainly as the Python (signed arithmetic, big enough).
std::vector<std::size_t> oracle(std::vector<std::uint64_t> const& costs, std::size_t swap_times) {
  std::size_t const n = costs.size();
  if (n == 0) return {};
  std::size_t const k = std::max<std::size_t>(1, std::min(swap_times, n));
  std::vector<i128> w(n);
  i128 left = 0;
  for (std::size_t i = 0; i < n; ++i) left += w[i] = std::max<std::uint64_t>(1, costs[i]);
  std::vector<std::size_t> sizes;
  std::size_t start = 0;
  for (std::size_t b = 0; b + 1 < k; ++b) {
    i128 const r = static_cast<i128>(k - b);
    std::size_t const limit = n - static_cast<std::size_t>(r) + 1;
    std::size_t end = start;
    i128 acc = 0;
    while (end < limit) {
      auto here = left - acc * r;
      auto there = left - (acc + w[end]) * r;
      if (here < 0) here = -here;
      if (there < 0) there = -there;
      if (end > start && here <= there) break;
      acc += w[end];
      ++end;
    }
    sizes.push_back(end - start);
    left -= acc;
    start = end;
  }
  sizes.push_back(n - start);
  return sizes;
}

std::vector<ps::partition_item> items_of(std::vector<std::uint64_t> const& numels, std::uint64_t bpe) {
  std::vector<ps::partition_item> v;
  for (auto n : numels) v.push_back({n, bpe});
  return v;
}

} // namespace

BOOST_AUTO_TEST_CASE(reference_cases) {
  std::vector<std::uint64_t> const c{16, 16, 16, 16, 16, 1, 16, 16, 4, 2, 4, 2};
  auto const sizes = ps::partition_sizes(c, 4);
  BOOST_TEST((sizes == std::vector<std::size_t>{2, 2, 3, 5}));
  BOOST_TEST((batch_costs(c, sizes) == std::vector<std::uint64_t>{32, 32, 33, 28}));

  BOOST_TEST(ps::partition_sizes(std::vector<std::uint64_t>{}, 4).empty());
  BOOST_TEST((ps::partition_sizes(std::vector<std::uint64_t>{16, 16, 16}, 8) == std::vector<std::size_t>{1, 1, 1}));
  BOOST_TEST((ps::partition_sizes(std::vector<std::uint64_t>{0, 0, 0, 0}, 2) == std::vector<std::size_t>{2, 2}));
  BOOST_TEST((ps::partition_sizes(std::vector<std::uint64_t>{512, 16, 16}, 2) == std::vector<std::size_t>{1, 2}));
  // Greedy, not optimal: 1..12 in 4 batches.
  std::vector<std::uint64_t> one_to_12(12);
  std::iota(one_to_12.begin(), one_to_12.end(), 1);
  BOOST_TEST((batch_costs(one_to_12, ps::partition_sizes(one_to_12, 4)) == std::vector<std::uint64_t>{21, 15, 19, 23}));
}

BOOST_AUTO_TEST_CASE(swap_times_zero_is_rejected) {
  std::vector<std::uint64_t> const c{1, 2};
  BOOST_CHECK_EXCEPTION((void)ps::partition_sizes(c, 0), ps::invalid_argument,
                        [](auto const& e) { return std::string(e.what()) == "swap_times must be positive (got 0)"; });
  BOOST_CHECK_THROW((void)ps::split_partition{}(items_of({1, 2}, 4), 0), ps::invalid_argument);
}

BOOST_AUTO_TEST_CASE(costs_beyond_32_bits_are_exact) {
  std::uint64_t const big = std::uint64_t{1} << 40;
  std::vector<std::uint64_t> const c{big, big, big, 3 * big, big};
  BOOST_TEST((ps::partition_sizes(c, 2) == oracle(c, 2)));
  BOOST_TEST((ps::partition_sizes(c, 2) == std::vector<std::size_t>{3, 2}));
  std::vector<std::uint64_t> const huge{~std::uint64_t{0} / 4, ~std::uint64_t{0} / 4, 5, 7};
  BOOST_TEST((ps::partition_sizes(huge, 3) == oracle(huge, 3)));
}

BOOST_AUTO_TEST_CASE(sweep_matches_the_oracle_and_keeps_the_invariants) {
  std::mt19937_64 rng(42);
  for (std::size_t n : {0u, 1u, 3u, 7u, 16u, 99u, 1000u}) {
    for (std::size_t k : {1u, 2u, 3u, 4u, 7u, 16u, 64u, 1000u, 5000u}) {
      for (int shape = 0; shape < 4; ++shape) {
        std::vector<std::uint64_t> costs(n);
        for (auto& c : costs) {
          switch (shape) {
          case 0: c = 16; break;
          case 1: c = rng() % 1000; break; // includes zeros
          case 2: c = rng() % 3 == 0 ? 0 : rng() % 1000000; break;
          default: c = (rng() % 2) ? (std::uint64_t{1} << 36) : 1; break;
          }
        }
        BOOST_TEST_CONTEXT("n " << n << " k " << k << " shape " << shape) {
          auto const sizes = ps::partition_sizes(costs, k);
          BOOST_TEST((sizes == oracle(costs, k)));
          BOOST_TEST(sizes.size() == (n == 0 ? 0 : std::min(n, k)));
          BOOST_TEST(ranges::accumulate(sizes, std::size_t{0}) == n); // every unit once, in order
          for (auto s : sizes) BOOST_TEST(s >= 1u);
          // The policy object maps the same sizes to whole, ordered unit ranges.
          std::vector<ps::partition_item> items;
          for (auto c : costs) items.push_back({c, 1});
          auto const plan = ps::balanced_partition{}(items, k);
          BOOST_TEST(plan.size() == sizes.size());
          std::size_t u = 0;
          for (std::size_t b = 0; b < plan.size(); ++b) {
            BOOST_TEST(plan[b].size() == sizes[b]);
            for (auto const& r : plan[b]) {
              BOOST_TEST(r.unit == u++);
              BOOST_TEST(r.begin == 0u);
              BOOST_TEST(r.end == costs[r.unit]);
            }
          }
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(split_partition_tiles_every_unit_and_balances_bytes) {
  std::mt19937_64 rng(7);
  for (std::size_t n : {1u, 3u, 7u, 16u, 99u}) {
    for (std::size_t k : {1u, 2u, 3u, 7u, 16u, 64u}) {
      for (std::uint64_t gran : {1u, 32u}) {
        std::vector<ps::partition_item> items(n);
        for (auto& it : items) it = {rng() % 5000, (rng() % 4 == 0) ? 0u : 8u + 4 * (rng() % 2)};
        BOOST_TEST_CONTEXT("n " << n << " k " << k << " granularity " << gran) {
          auto const plan = ps::split_partition{gran}(items, k);
          // Tiling: ranges in order, each unit covered exactly once, cuts on granules.
          std::size_t u = 0, e = 0;
          for (auto const& batch : plan) {
            BOOST_TEST(!batch.empty());
            for (auto const& r : batch) {
              if (r.unit != u) {
                BOOST_TEST(e == items[u].numel);
                ++u;
                e = 0;
                while (u < r.unit) BOOST_TEST(items[u++].numel == 0u);
              }
              BOOST_TEST(r.begin == e);
              BOOST_TEST(r.end >= r.begin);
              BOOST_TEST((r.end == items[u].numel || r.end % gran == 0));
              e = r.end;
            }
          }
          // The last range ends its unit, and only empty units come after it.
          BOOST_TEST_REQUIRE(!plan.empty());
          BOOST_TEST(e == items[u].numel);
          for (++u; u < n; ++u) BOOST_TEST(items[u].numel == 0u, "unit " << u << " is not covered");
          // Balance: batch b ends at the first granule boundary at or past its share T·(b+1)/k,
          // so every cumulative end is within one granule of bytes of the ideal one.
          std::uint64_t total = 0, max_elem = 0, granules = 0;
          for (auto const& it : items) {
            total += it.bytes();
            max_elem = std::max(max_elem, it.bytes_per_element);
            if (it.bytes_per_element) granules += (it.numel + gran - 1) / gran;
          }
          if (total == 0) continue;
          auto const keff = std::max<std::uint64_t>(1, std::min<std::uint64_t>(k, granules));
          BOOST_TEST(plan.size() <= keff);
          if (plan.size() != keff) continue; // a batch was absorbed by a coarse granule
          std::uint64_t end = 0;
          for (std::size_t b = 0; b + 1 < plan.size(); ++b) {
            for (auto const& r : plan[b]) end += (r.end - r.begin) * items[r.unit].bytes_per_element;
            auto const target = (total * (b + 1) + keff - 1) / keff;
            BOOST_TEST(end >= target, "batch " << b);
            BOOST_TEST(end < target + gran * max_elem, "batch " << b << " ends at " << end);
          }
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(split_partition_exact_example) {
  // 3 units of 10, 20, 30 elements × 4 bytes in 3 batches: 80 bytes each = 20 elements each.
  auto const plan = ps::split_partition{}(items_of({10, 20, 30}, 4), 3);
  std::vector<std::vector<ps::unit_range>> const expected{
      {{0, 0, 10}, {1, 0, 10}}, {{1, 10, 20}, {2, 0, 10}}, {{2, 10, 30}}};
  BOOST_TEST((plan == expected));
}
