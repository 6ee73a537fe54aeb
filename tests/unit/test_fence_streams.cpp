// test_fence_streams.cpp — fences over live non-blocking streams, as the
// shim records them (shim/cuda_backend.cpp): one event on the legacy stream,
// a query per non-blocking stream, an event on each busy one.  The fake
// backend counts what each fence did; the allocator's fence statistics must
// say the same, and a fence must not count as complete before the events on
// its busy streams are.
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "alloc_fixture.h"

using namespace cachalloc;
using cachalloc::testing::AllocFixture;

namespace {

constexpr StreamId kIdleA = 0x7101, kIdleB = 0x7102, kBusy = 0x7103;

// `n` blocks of `size` bytes, freed without a stream: they wait for a fence.
std::vector<DevicePtr> defer_blocks(AllocFixture& f, int n, std::size_t size) {
  std::vector<DevicePtr> blocks;
  for (int i = 0; i < n; ++i) blocks.push_back(f.malloc(size));
  for (DevicePtr p : blocks) {
    REQUIRE(f.alloc->free_deferred(p) == kSuccess);
    f.alloc->validate();
  }
  return blocks;
}

// The allocator's fence statistics against the backend's own counts.
void check_fence_stats(const AllocFixture& f) {
  const DeviceStats s = f.stats();
  CHECK(s.num_fences == f.backend.fence_records);
  CHECK(s.num_fence_events == f.backend.fence_event_records);
  CHECK(s.num_fence_stream_queries == f.backend.stream_queries);
}

bool contains(const std::vector<DevicePtr>& v, DevicePtr p) { return std::find(v.begin(), v.end(), p) != v.end(); }

}  // namespace

TEST_CASE("fence statistics count the events and stream queries the backend made") {
  AllocFixture f;
  f.backend.set_auto_complete(true);  // each fence is complete when queried
  f.backend.add_nonblocking_stream(kIdleA);
  f.backend.add_nonblocking_stream(kIdleB);
  f.backend.add_nonblocking_stream(kBusy, /*busy=*/true);

  // Three streams: three queries; the legacy stream and the busy one get events.
  defer_blocks(f, 5, 4096);
  f.alloc->reclaim();  // puts the waiting frees behind a fence
  REQUIRE(f.backend.fence_records == 1);
  CHECK(f.backend.stream_queries == 3);
  CHECK(f.backend.fence_event_records == 2);
  check_fence_stats(f);
  CHECK(f.stats().num_fence_stream_queries == 3);
  CHECK(f.stats().num_fence_events == 2);

  // One stream gone, the busy one idle now: two queries, one event.
  f.backend.remove_nonblocking_stream(kIdleA);
  f.backend.set_stream_busy(kBusy, false);
  defer_blocks(f, 5, 4096);
  f.alloc->reclaim();
  REQUIRE(f.backend.fence_records == 2);
  check_fence_stats(f);
  CHECK(f.stats().num_fence_stream_queries == 3 + 2);
  CHECK(f.stats().num_fence_events == 2 + 1);

  // No non-blocking stream: the legacy stream's event alone, no query.
  f.backend.remove_nonblocking_stream(kIdleB);
  f.backend.remove_nonblocking_stream(kBusy);
  defer_blocks(f, 5, 4096);
  f.alloc->reclaim();
  REQUIRE(f.backend.fence_records == 3);
  check_fence_stats(f);
  CHECK(f.stats().num_fence_stream_queries == 5);
  CHECK(f.stats().num_fence_events == 4);

  // Fences recorded on a miss (the fence path's own trigger) count the same.
  for (StreamId s = 1; s <= 40; ++s) f.backend.add_nonblocking_stream(0x8000 + s);
  for (int round = 0; round < 3; ++round) {
    std::vector<DevicePtr> blocks = defer_blocks(f, 40, 2 * MiB);
    (void)blocks;
    f.free(f.malloc(2 * MiB));
    check_fence_stats(f);
  }
  CHECK(f.backend.fence_records > 3);
  CHECK(f.stats().num_fence_stream_queries == 5 + 40 * (f.backend.fence_records - 3));
  f.empty_cache();
  check_fence_stats(f);
  CHECK(f.reserved() == 0);
}

TEST_CASE("a fence over a busy non-blocking stream is not complete until that stream's event is") {
  AllocFixture f;
  f.backend.add_nonblocking_stream(kIdleA);
  f.backend.add_nonblocking_stream(kBusy, /*busy=*/true);
  // As many bytes stay allocated as will wait: a miss grows instead of
  // waiting for the fence (wait_oldest_fence).
  std::vector<DevicePtr> live;
  for (int i = 0; i < 40; ++i) live.push_back(f.malloc(2 * MiB));
  const std::vector<DevicePtr> blocks = defer_blocks(f, 40, 2 * MiB);
  std::vector<DevicePtr> got;
  got.push_back(f.malloc(2 * MiB));  // records the fence; not complete: grows
  REQUIRE(f.backend.fence_records == 1);
  CHECK(f.backend.fence_event_records == 2);
  CHECK(f.backend.stream_queries == 2);
  check_fence_stats(f);

  // The legacy stream's work is done, the busy stream's not: the fence is
  // incomplete and none of its blocks may come back.
  f.backend.complete_events_on(0);
  for (int i = 0; i < 5; ++i) got.push_back(f.malloc(2 * MiB));
  for (DevicePtr p : got) CHECK_FALSE(contains(blocks, p));
  CHECK(f.stats().deferred_free_bytes.current == static_cast<std::int64_t>(40 * 2 * MiB));
  CHECK(f.backend.live_fences() == 1);

  // Now the busy stream's event completes: the next miss reclaims the batch.
  f.backend.complete_events_on(kBusy);
  const int segments = f.backend.alloc_calls;
  std::vector<DevicePtr> again;
  for (int i = 0; i < 10; ++i) again.push_back(f.malloc(2 * MiB));
  CHECK(f.backend.alloc_calls == segments);
  CHECK(std::count_if(again.begin(), again.end(), [&](DevicePtr p) { return contains(blocks, p); }) > 0);
  CHECK(f.stats().deferred_free_bytes.current == 0);
  CHECK(f.backend.live_fences() == 0);
  for (DevicePtr p : again) f.free(p);
  for (DevicePtr p : got) f.free(p);
  for (DevicePtr p : live) f.free(p);
  check_fence_stats(f);
}
