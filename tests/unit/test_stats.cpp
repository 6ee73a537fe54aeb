// test_stats.cpp — DeviceStats accounting: exact numbers for a scripted
// sequence, peaks, cumulative counters, resets and torch key names.
#include <set>

#include "alloc_fixture.h"

using namespace cachalloc;
using namespace cachalloc::testing;

TEST_CASE("a scripted sequence gives exact current, peak, allocated and freed values") {
  AllocFixture f;
  const DevicePtr a = f.malloc(1000);     // small: 1024 B of a 2 MiB segment
  const DevicePtr b = f.malloc(3 * MiB);  // large: 3 MiB of a 20 MiB segment
  f.free(a);
  const DeviceStats s = f.stats();
  const auto& al = s.allocation;
  CHECK(al[StatType::aggregate].current == 1);
  CHECK(al[StatType::aggregate].peak == 2);
  CHECK(al[StatType::aggregate].allocated == 2);
  CHECK(al[StatType::aggregate].freed == 1);
  CHECK(al[StatType::small_pool].allocated == 1);
  CHECK(al[StatType::large_pool].current == 1);
  CHECK(s.allocated_bytes[StatType::aggregate].peak == static_cast<std::int64_t>(3 * MiB + 1024));
  CHECK(s.requested_bytes[StatType::small_pool].freed == 1000);
  CHECK(s.reserved_bytes[StatType::aggregate].current == static_cast<std::int64_t>(22 * MiB));
  CHECK(s.segment[StatType::aggregate].current == 2);
  CHECK(s.inactive_split[StatType::large_pool].current == 1);
  CHECK(s.inactive_split_bytes[StatType::large_pool].current == static_cast<std::int64_t>(17 * MiB));
  CHECK(s.inactive_split[StatType::small_pool].current == 0);  // a merged back: segment whole again
  CHECK(s.active_bytes[StatType::aggregate].current == static_cast<std::int64_t>(3 * MiB));
  CHECK(s.num_device_alloc == 2);
  CHECK(s.num_device_free == 0);
  f.free(b);
}

TEST_CASE("reset_peak_stats sets peaks to current; reset_accumulated zeroes the counters") {
  AllocFixture f;
  const DevicePtr a = f.malloc(5 * MiB);
  f.free(f.malloc(7 * MiB));
  f.alloc->reset_peak_stats();
  DeviceStats s = f.stats();
  CHECK(s.allocated_bytes[StatType::aggregate].peak == static_cast<std::int64_t>(5 * MiB));
  f.alloc->reset_accumulated_stats();
  s = f.stats();
  CHECK(s.allocation[StatType::aggregate].allocated == 0);
  CHECK(s.allocation[StatType::aggregate].freed == 0);
  CHECK(s.allocation[StatType::aggregate].current == 1);
  CHECK(s.num_device_alloc == 0);
  f.alloc->validate();
  f.free(a);
}

TEST_CASE("flatten_stats uses torch.cuda.memory_stats() names, each once") {
  DeviceStats s;
  s.allocated_bytes.increase(true, 4096);
  s.num_ooms = 3;
  const auto flat = flatten_stats(s);
  std::set<std::string> names;
  for (const auto& [k, v] : flat) CHECK(names.insert(k).second);
  // 9 arrays x 3 pools x 4 fields + 2 oversize x 4 + 6 scalars, then
  // cachalloc's own: 6 fence scalars, 2 of release_before_peak, 2 of
  // release_remap, 2 of the thread caches, 3 of cross-stream reuse,
  // deferred_free_bytes x 4, capture_held_bytes x 4.
  CHECK(flat.size() == 9 * 3 * 4 + 2 * 4 + 6 + 6 + 2 + 2 + 2 + 3 + 4 + 4);
  for (const char* key : {"allocation.all.current", "segment.large_pool.peak", "active.small_pool.allocated",
                          "inactive_split.all.freed", "allocated_bytes.all.current", "reserved_bytes.all.peak",
                          "active_bytes.large_pool.current", "inactive_split_bytes.small_pool.current",
                          "requested_bytes.all.allocated", "num_alloc_retries", "num_ooms",
                          "oversize_allocations.current", "oversize_segments.peak", "num_sync_all_streams",
                          "num_device_alloc", "num_device_free", "max_split_size", "num_deferred_frees",
                          "num_fences", "num_fence_events", "num_fence_stream_queries", "num_fence_waits", "num_fence_joins", "num_peak_releases", "peak_release_bytes", "num_peak_remaps", "peak_remap_bytes", "num_cross_stream_reuses",
                          "num_idle_cross_stream_reuses", "num_marked_cross_stream_reuses", "deferred_free_bytes.peak", "capture_held_bytes.current"})
    CHECK(names.count(key) == 1);
  for (const auto& [k, v] : flat) {
    if (k == "allocated_bytes.small_pool.current") CHECK(v == 4096);
    if (k == "allocated_bytes.all.peak") CHECK(v == 4096);
    if (k == "num_ooms") CHECK(v == 3);
  }
}

TEST_CASE("max_split_size is reported in bytes, -1 when unlimited as in PyTorch") {
  AllocFixture unlimited;
  CHECK(unlimited.stats().max_split_size == -1);
  AllocFixture limited(config_with_max_split(128));
  CHECK(limited.stats().max_split_size == static_cast<std::int64_t>(128 * MiB));
}
