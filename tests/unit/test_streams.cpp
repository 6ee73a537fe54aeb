// test_streams.cpp — stream-keyed caching, record_stream, fenced frees and
// the event pool, with events completed by the test.
#include <algorithm>
#include <array>

#include "alloc_fixture.h"

using namespace cachalloc;
using namespace cachalloc::testing;

constexpr StreamId kS1 = 0x1001;
constexpr StreamId kS2 = 0x2002;

// (Others may take it once ordered after this stream's work:
// test_cross_stream.cpp.  Off here, the blocks stay this stream's.)
TEST_CASE("a block freed on its own stream is reusable on that stream at once, not on others") {
  Config cfg;
  cfg.cross_stream_reuse = CrossStream::off;
  AllocFixture f(cfg);
  const DevicePtr a = f.malloc(3 * MiB, kS1);
  f.free(a);
  CHECK(f.malloc(3 * MiB, kS1) == a);
  CHECK(f.backend.alloc_calls == 1);
  const DevicePtr b = f.malloc(3 * MiB, kS2);  // S1's cached tail is not S2's
  CHECK(b != a);
  CHECK(f.backend.alloc_calls == 2);
  CHECK(f.backend.event_records == 0);  // same-stream frees need no events
}

TEST_CASE("record_stream: the block waits for an event on the other stream") {
  AllocFixture f;
  const DevicePtr a = f.malloc(3 * MiB, kS1);
  REQUIRE(f.alloc->record_stream(a, kS2) == kSuccess);
  REQUIRE(f.alloc->record_stream(a, kS1) == kSuccess);  // own stream: no event needed
  f.free(a);
  CHECK(f.backend.event_records == 1);
  CHECK(f.stats().active[StatType::aggregate].current == 1);  // still active while pending
  CHECK(f.stats().allocation[StatType::aggregate].current == 0);

  const DevicePtr b = f.malloc(3 * MiB, kS1);  // event not done: a is not reusable
  CHECK(b != a);
  CHECK(f.backend.event_queries >= 1);  // queried lazily on the allocation path

  f.backend.complete_events_on(kS2);
  f.free(b);
  const DevicePtr c = f.malloc(3 * MiB, kS1);  // a (lower address, merged) now back in the pool
  CHECK(c == a);
}

TEST_CASE("free_fenced waits for every listed stream, in record order per stream") {
  AllocFixture f;
  const std::array<StreamId, 3> live = {0, kS1, kS2};
  const DevicePtr a = f.malloc(4096, 0);
  const DevicePtr keep = f.malloc(4096, 0);
  REQUIRE(f.alloc->free_fenced(a, live) == kSuccess);
  f.alloc->validate();
  CHECK(f.backend.event_records == 2);  // not on stream 0: the block's own stream orders it
  DevicePtr p = 0;
  REQUIRE(f.try_malloc(4096, 0, &p) == kSuccess);
  CHECK(p != a);
  f.backend.complete_events_on(kS1);
  REQUIRE(f.try_malloc(512, 0, &p) == kSuccess);
  CHECK(p != a);  // S2 still pending
  f.backend.complete_events_on(kS2);
  REQUIRE(f.try_malloc(4096, 0, &p) == kSuccess);
  CHECK(p == a);
  f.free(keep);
}

TEST_CASE("events come from a pool and are reused, not created per free") {
  AllocFixture f;
  f.backend.set_auto_complete(true);
  for (int i = 0; i < 50; ++i) {
    const DevicePtr a = f.malloc(4096, kS1);
    REQUIRE(f.alloc->record_stream(a, kS2) == kSuccess);
    f.free(a);
  }
  CHECK(f.backend.event_records == 50);
  CHECK(f.backend.event_creates <= 2);
}

TEST_CASE("empty_cache waits for pending events and releases what they held") {
  AllocFixture f;
  const DevicePtr a = f.malloc(3 * MiB, kS1);
  REQUIRE(f.alloc->record_stream(a, kS2) == kSuccess);
  f.free(a);
  CHECK(f.alloc->releasable_bytes() == 20 * MiB);
  f.empty_cache();
  CHECK(f.backend.event_syncs == 1);
  CHECK(f.stats().num_sync_all_streams == 1);
  CHECK(f.reserved() == 0);
  CHECK(f.backend.free_calls == 1);
}

TEST_CASE("a failed event record falls back to synchronizing the device") {
  AllocFixture f;
  const DevicePtr a = f.malloc(4096, kS1);
  const DevicePtr keep = f.malloc(4096, kS1);
  REQUIRE(f.alloc->record_stream(a, kS2) == kSuccess);
  f.backend.fail_next_records(1);
  f.free(a);
  CHECK(f.backend.device_syncs == 1);
  CHECK(f.stats().num_sync_all_streams >= 1);
  CHECK(f.malloc(4096, kS1) == a);  // safe to reuse at once
  f.free(keep);
}

TEST_CASE("is_live describes live blocks only; owns covers whole segments") {
  AllocFixture f;
  const DevicePtr a = f.malloc(100, kS2);
  CHECK(f.alloc->is_live(a));
  CHECK_FALSE(f.alloc->is_live(a + 512));
  CHECK(f.alloc->owns(a + 512));
  f.free(a);
  CHECK_FALSE(f.alloc->is_live(a));
  CHECK(f.alloc->owns(a));
  CHECK(f.alloc->record_stream(a, kS1) == kInvalidValue);
  CHECK(f.alloc->record_stream(0x10, kS1) == kNotOwned);
}

TEST_CASE("live_block_addresses lists the allocated blocks, not the cached or pending ones") {
  AllocFixture f;
  CHECK(f.alloc->live_block_addresses().empty());
  const DevicePtr a = f.malloc(100, kS1);
  const DevicePtr b = f.malloc(3 * MiB, kS2);
  const DevicePtr c = f.malloc(4096, kS1);
  f.free(c);
  std::vector<DevicePtr> live = f.alloc->live_block_addresses();
  std::sort(live.begin(), live.end());
  std::vector<DevicePtr> want{a, b};
  std::sort(want.begin(), want.end());
  CHECK(live == want);
  f.free(a);
  f.free(b);
  CHECK(f.alloc->live_block_addresses().empty());
}

TEST_CASE("retire_stream: cached blocks of a destroyed stream wait for its last work") {
  AllocFixture f;
  const DevicePtr a = f.malloc(3 * MiB, kS1);
  const DevicePtr keep = f.malloc(4096, kS1);
  f.free(a);
  REQUIRE(f.alloc->retire_stream(kS1) == kSuccess);
  f.alloc->validate();
  CHECK(f.backend.event_records >= 1);
  // A new stream with the same handle must not get the block yet.
  DevicePtr p = 0;
  REQUIRE(f.try_malloc(3 * MiB, kS1, &p) == kSuccess);
  CHECK(p != a);
  f.backend.complete_events_on(kS1);
  f.free(p);
  REQUIRE(f.try_malloc(3 * MiB, kS1, &p) == kSuccess);
  CHECK(p == a);
  f.free(keep);
}

TEST_CASE("retire_stream: without an event the device is synchronized instead") {
  AllocFixture f;
  const DevicePtr a = f.malloc(4096, kS1);
  const DevicePtr keep = f.malloc(4096, kS1);
  f.free(a);
  f.backend.fail_next_records(1);
  REQUIRE(f.alloc->retire_stream(kS1) == kSuccess);
  f.alloc->validate();
  CHECK(f.backend.device_syncs == 1);
  CHECK(f.malloc(4096, kS1) == a);
  f.free(keep);
  CHECK(f.alloc->owns(a));
  CHECK_FALSE(f.alloc->owns(0x10));
}

TEST_CASE("a failed second event record synchronizes and frees the block exactly once") {
  AllocFixture f;
  const DevicePtr a = f.malloc(4096, kS1);
  const DevicePtr keep = f.malloc(4096, kS1);
  const StreamId fence[] = {kS2, 0x3003};
  f.backend.fail_next_records(1, /*after=*/1);  // the first record works, the second fails
  REQUIRE(f.alloc->free_fenced(a, fence) == kSuccess);
  f.alloc->validate();
  CHECK(f.backend.event_records == 2);
  CHECK(f.backend.device_syncs == 1);
  CHECK(f.stats().active[StatType::aggregate].current == 1);  // only keep: a is free again
  CHECK(f.malloc(4096, kS1) == a);
  f.free(keep);
}
