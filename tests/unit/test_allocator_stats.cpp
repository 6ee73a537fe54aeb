// test_allocator_stats.cpp — PoolStats and AllocatorStats (core/allocator_stats.h)
// read exactly as the StatArray and DeviceStats they replace would, after
// every update and reset.
#include <catch2/catch.hpp>

#include <random>

#include "allocator_stats.h"

using namespace cachalloc;

namespace {

void require_same(const StatArray& got, const StatArray& want) {
  for (int t = 0; t < kNumStatTypes; ++t) {
    INFO("entry " << stat_type_name(static_cast<StatType>(t)));
    REQUIRE(got.a[t].current == want.a[t].current);
    REQUIRE(got.a[t].peak == want.a[t].peak);
    REQUIRE(got.a[t].allocated == want.a[t].allocated);
    REQUIRE(got.a[t].freed == want.a[t].freed);
  }
}

}  // namespace

TEST_CASE("PoolStats reads as a StatArray after every increase, decrease and reset") {
  std::mt19937_64 rng(7);
  PoolStats fast;
  StatArray plain;
  for (int i = 0; i < 20000; ++i) {
    const bool small = rng() % 2 == 0;
    const auto amount = static_cast<std::int64_t>(rng() % 5000);
    switch (rng() % 16) {
      case 0: fast.reset_peak(); for (Stat& s : plain.a) s.reset_peak(); break;
      case 1: fast.reset_accumulated(); for (Stat& s : plain.a) s.reset_accumulated(); break;
      default:
        // Decreases never take a pool below zero, as in the allocator.
        if (rng() % 2 == 0 || plain[small ? StatType::small_pool : StatType::large_pool].current < amount) {
          fast.increase(small, amount);
          plain.increase(small, amount);
        } else {
          fast.decrease(small, amount);
          plain.decrease(small, amount);
        }
    }
    require_same(fast.get(), plain);
    REQUIRE(fast[StatType::aggregate].peak == plain[StatType::aggregate].peak);
  }
}

TEST_CASE("AllocatorStats carries every DeviceStats field through get() and the resets") {
  AllocatorStats s;
  s.allocation.increase(true, 3);
  s.allocation.decrease(true, 1);
  s.reserved_bytes.increase(false, 1 << 20);
  s.num_alloc_retries = 1;
  s.num_ooms = 2;
  s.oversize_allocations.increase(4);
  s.oversize_segments.increase(5);
  s.num_sync_all_streams = 6;
  s.num_device_alloc = 7;
  s.num_device_free = 8;
  s.max_split_size = 9;
  s.num_deferred_frees = 10;
  s.num_fences = 11;
  s.num_fence_events = 12;
  s.deferred_free_bytes.increase(13);
  DeviceStats d = s.get();
  CHECK(d.allocation[StatType::small_pool].current == 2);
  CHECK(d.allocation[StatType::aggregate].freed == 1);
  CHECK(d.reserved_bytes[StatType::large_pool].peak == 1 << 20);
  CHECK(flatten_stats(d).size() == flatten_stats(DeviceStats{}).size());
  CHECK(d.num_alloc_retries == 1);
  CHECK(d.num_ooms == 2);
  CHECK(d.oversize_allocations.current == 4);
  CHECK(d.oversize_segments.current == 5);
  CHECK(d.num_sync_all_streams == 6);
  CHECK(d.num_device_alloc == 7);
  CHECK(d.num_device_free == 8);
  CHECK(d.max_split_size == 9);
  CHECK(d.num_deferred_frees == 10);
  CHECK(d.num_fences == 11);
  CHECK(d.num_fence_events == 12);
  CHECK(d.deferred_free_bytes.current == 13);

  DeviceStats want = d;
  s.reset_accumulated();
  want.reset_accumulated();
  CHECK(flatten_stats(s.get()) == flatten_stats(want));
  s.allocation.decrease(true, 2);
  s.reset_peak();
  want.allocation.decrease(true, 2);
  want.reset_peak();
  CHECK(flatten_stats(s.get()) == flatten_stats(want));
}
