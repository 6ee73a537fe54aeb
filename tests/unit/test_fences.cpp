// test_fences.cpp — free_deferred: frees with no stream behind batched fences
// (core/ledger_fences.cpp).  Every step is followed by validate() (the fixture).
#include <catch2/catch.hpp>

#include <algorithm>
#include <limits>
#include <vector>

#include "alloc_fixture.h"
#include "reuse_oracle.h"

using namespace cachalloc;
using cachalloc::testing::AllocFixture;

namespace {

void free_deferred(AllocFixture& f, DevicePtr p) {
  REQUIRE(f.alloc->free_deferred(p) == kSuccess);
  f.alloc->validate();
}

}  // namespace

TEST_CASE("a deferred free makes no driver call and is not reused before a fence completes") {
  AllocFixture f;
  const DevicePtr a = f.malloc(4096);
  const DevicePtr keep = f.malloc(4096);
  free_deferred(f, a);
  CHECK(f.backend.event_records == 0);
  CHECK(f.backend.event_queries == 0);
  CHECK(f.backend.device_syncs == 0);
  CHECK(f.stats().active[StatType::aggregate].current == 2);  // pending: still active
  CHECK(f.stats().allocation[StatType::aggregate].current == 1);
  CHECK(f.stats().deferred_free_bytes.current == 4096);
  // The segment's rest serves the next request; a stays out of reach.
  CHECK(f.malloc(4096) != a);
  f.free(keep);
}

TEST_CASE("a miss records one fence once enough frees wait, and reclaims them when it completes") {
  AllocFixture f;
  // 21 blocks of 1 MiB + 512 B fill one 20 MiB segment's worth and a bit:
  // each gets its own place in large segments.
  std::vector<DevicePtr> blocks, live;
  for (int i = 0; i < 40; ++i) blocks.push_back(f.malloc(2 * MiB));
  // As many bytes stay allocated as will wait: the miss below does not wait
  // for the fence (wait_oldest_fence), it grows.
  for (int i = 0; i < 40; ++i) live.push_back(f.malloc(2 * MiB));
  const int segments = f.backend.alloc_calls;
  for (DevicePtr p : blocks) free_deferred(f, p);
  CHECK(f.backend.fence_records == 0);  // no miss yet: nothing recorded
  CHECK(f.stats().num_deferred_frees == 40);

  // All 40 wait, more than the batch minimum (20 per fence event): the miss
  // records a fence; it is not complete, so the allocator grows.
  const DevicePtr p = f.malloc(2 * MiB);
  CHECK(f.backend.fence_records == 1);
  CHECK(f.stats().num_fences == 1);
  CHECK(f.stats().num_fence_events == 1);
  CHECK(f.stats().num_fence_waits == 0);
  CHECK(f.backend.event_syncs == 0);
  CHECK(f.backend.alloc_calls == segments + 1);
  CHECK(std::find(blocks.begin(), blocks.end(), p) == blocks.end());

  // Once the fence completes, the next miss returns the whole batch.
  f.backend.complete_all_events();
  std::vector<DevicePtr> again;
  for (int i = 0; i < 40; ++i) again.push_back(f.malloc(2 * MiB));
  CHECK(f.backend.alloc_calls == segments + 1);  // all from the reclaimed blocks
  CHECK(f.stats().deferred_free_bytes.current == 0);
  CHECK(f.stats().deferred_free_bytes.peak == static_cast<std::int64_t>(40 * 2 * MiB));
  for (DevicePtr q : again) f.free(q);
  for (DevicePtr q : live) f.free(q);
  f.free(p);
}

TEST_CASE("a miss waits for the oldest fence instead of growing while more bytes wait than are allocated") {
  AllocFixture f;
  std::vector<DevicePtr> blocks;
  for (int i = 0; i < 40; ++i) blocks.push_back(f.malloc(2 * MiB));
  const DevicePtr small_live = f.malloc(4096);
  const int segments = f.backend.alloc_calls;
  for (DevicePtr p : blocks) free_deferred(f, p);
  // 80 MiB wait, 4 KiB are allocated: the miss records a fence, waits for
  // it (an event synchronization, not the device) and reuses a block.
  const DevicePtr p = f.malloc(2 * MiB);
  CHECK(f.backend.fence_records == 1);
  CHECK(f.stats().num_fence_waits == 1);
  CHECK(f.backend.event_syncs == 1);
  CHECK(f.backend.device_syncs == 0);
  CHECK(f.backend.alloc_calls == segments);
  CHECK(std::find(blocks.begin(), blocks.end(), p) != blocks.end());
  CHECK(f.stats().deferred_free_bytes.current == 0);
  f.free(p);
  f.free(small_live);
}

TEST_CASE("a miss does not wait for a fence it could not use, nor while fences are refused") {
  AllocFixture f;
  // The waiting bytes are smaller than the request: no wait, growth.
  std::vector<DevicePtr> blocks;
  for (int i = 0; i < 40; ++i) blocks.push_back(f.malloc(4096));
  for (DevicePtr p : blocks) free_deferred(f, p);
  const int segments = f.backend.alloc_calls;
  const DevicePtr big = f.malloc(64 * MiB);
  CHECK(f.backend.fence_records == 1);
  CHECK(f.stats().num_fence_waits == 0);
  CHECK(f.backend.alloc_calls == segments + 1);
  f.free(big);

  // A capture in flight (fences refused): the deferred frees keep waiting.
  AllocFixture g;
  std::vector<DevicePtr> more;
  for (int i = 0; i < 40; ++i) more.push_back(g.malloc(2 * MiB));
  for (DevicePtr p : more) free_deferred(g, p);
  g.backend.refuse_fences(true);
  const int before = g.backend.alloc_calls;
  const DevicePtr q = g.malloc(2 * MiB);
  CHECK(g.stats().num_fence_waits == 0);
  CHECK(g.backend.alloc_calls == before + 1);
  CHECK(std::find(more.begin(), more.end(), q) == more.end());
  g.backend.refuse_fences(false);
  g.free(q);
}

TEST_CASE("below the batch minimum a miss grows instead of recording a fence") {
  AllocFixture f;
  const DevicePtr a = f.malloc(12 * MiB);
  free_deferred(f, a);
  const DevicePtr b = f.malloc(12 * MiB);
  CHECK(b != a);
  CHECK(f.backend.fence_records == 0);
  CHECK(f.backend.alloc_calls == 2);
  f.free(b);
}

TEST_CASE("with many streams, 20 waiting frees that could serve a miss get a fence instead of growth") {
  AllocFixture f;
  // PyTorch's pool of non-blocking streams alive, all idle: each fence
  // records one event and makes 128 stream queries.
  for (StreamId s = 1; s <= 128; ++s) f.backend.add_nonblocking_stream(0x5000 + s);
  // A first fence teaches the allocator what a fence costs: the full batch
  // is then 160 frees.
  f.free(f.malloc(2 * MiB));
  const DevicePtr first = f.malloc(2 * MiB);
  free_deferred(f, first);
  f.alloc->empty_cache();  // records a fence for the waiting block
  CHECK(f.backend.fence_records == 1);
  f.backend.complete_all_events();
  f.alloc->empty_cache();
  REQUIRE(f.reserved() == 0);

  std::vector<DevicePtr> blocks;
  for (int i = 0; i < 30; ++i) blocks.push_back(f.malloc(2 * MiB));
  const int segments = f.backend.alloc_calls;
  SECTION("19 waiting frees: the miss grows, no fence") {
    for (int i = 0; i < 19; ++i) free_deferred(f, blocks[static_cast<std::size_t>(i)]);
    const DevicePtr p = f.malloc(2 * MiB);
    CHECK(f.backend.fence_records == 1);
    CHECK(f.backend.alloc_calls == segments + 1);
    f.free(p);
    for (int i = 19; i < 30; ++i) f.free(blocks[static_cast<std::size_t>(i)]);
  }
  SECTION("20 waiting frees: the miss records a fence; completed at once, it serves the request") {
    f.backend.set_auto_complete(true);  // the device is idle (the program just synchronized)
    for (int i = 0; i < 20; ++i) free_deferred(f, blocks[static_cast<std::size_t>(i)]);
    const DevicePtr p = f.malloc(2 * MiB);
    CHECK(f.backend.fence_records == 2);
    CHECK(f.backend.alloc_calls == segments);  // no growth
    CHECK(std::find(blocks.begin(), blocks.begin() + 20, p) != blocks.begin() + 20);
    CHECK(f.stats().deferred_free_bytes.current == 0);
    f.free(p);
    for (int i = 20; i < 30; ++i) f.free(blocks[static_cast<std::size_t>(i)]);
  }
  SECTION("20 waiting frees too small for the request: no fence, growth") {
    for (int i = 0; i < 20; ++i) {
      const DevicePtr small = f.malloc(512);
      free_deferred(f, small);
    }
    const DevicePtr big = f.malloc(64 * MiB);
    CHECK(f.backend.fence_records == 1);
    CHECK(f.backend.alloc_calls == segments + 2);  // a small segment for the 512 B blocks, then the big one
    f.free(big);
    for (DevicePtr q : blocks) f.free(q);
  }
  f.backend.complete_all_events();
  f.empty_cache();
  CHECK(f.reserved() == 0);
}

TEST_CASE("a steady malloc/free loop costs at most 0.1 driver calls per deferred free") {
  AllocFixture f;
  f.backend.set_auto_complete(true);  // an idle device: every fence is complete when queried
  const int pairs = 5000;
  for (std::size_t size : {std::size_t{512}, std::size_t{1} * MiB, std::size_t{64} * MiB}) {
    const int calls_before = f.backend.event_records + f.backend.event_queries;
    for (int i = 0; i < pairs; ++i) {
      DevicePtr p = 0;
      REQUIRE(f.alloc->malloc(&p, size, 0) == kSuccess);
      REQUIRE(f.alloc->free_deferred(p) == kSuccess);
    }
    f.alloc->validate();
    const int calls = f.backend.event_records + f.backend.event_queries - calls_before;
    INFO("size " << size << ": " << calls << " driver calls for " << pairs << " frees");
    CHECK(calls <= pairs / 10);
  }
  // The memory held back stays under the limit.
  CHECK(f.stats().deferred_free_bytes.peak <= static_cast<std::int64_t>(f.alloc->deferred_bytes_limit() + 64 * MiB));
}

TEST_CASE("past the byte limit a free records the fence itself") {
  AllocFixture f;
  const std::size_t limit = f.alloc->deferred_bytes_limit();
  std::vector<DevicePtr> blocks;
  const std::size_t size = 64 * MiB;
  for (std::size_t held = 0; held <= limit; held += size) blocks.push_back(f.malloc(size));
  for (std::size_t i = 0; i + 1 < blocks.size(); ++i) free_deferred(f, blocks[i]);
  CHECK(f.backend.fence_records == 0);
  free_deferred(f, blocks.back());  // now past the limit
  CHECK(f.backend.fence_records == 1);
  f.empty_cache();
  CHECK(f.reserved() == 0);
}

TEST_CASE("no fence while one cannot be recorded (a capture): blocks wait, nothing is reused") {
  AllocFixture f;
  std::vector<DevicePtr> blocks;
  for (int i = 0; i < 30; ++i) blocks.push_back(f.malloc(2 * MiB));
  for (DevicePtr p : blocks) free_deferred(f, p);
  f.backend.refuse_fences(true);
  const DevicePtr p = f.malloc(2 * MiB);
  CHECK(std::find(blocks.begin(), blocks.end(), p) == blocks.end());
  CHECK(f.stats().num_fences == 0);
  CHECK(f.backend.device_syncs == 0);
  f.backend.refuse_fences(false);
  f.backend.set_auto_complete(true);
  // The capture is over: the next miss records the fence and reuses them.
  std::vector<DevicePtr> again;
  const int segments = f.backend.alloc_calls;
  for (int i = 0; i < 30; ++i) again.push_back(f.malloc(2 * MiB));
  CHECK(f.stats().num_fences == 1);
  CHECK(f.backend.alloc_calls == segments);
  for (DevicePtr q : again) f.free(q);
  f.free(p);
}

TEST_CASE("a failed fence record synchronizes the device instead") {
  AllocFixture f;
  std::vector<DevicePtr> blocks;
  for (int i = 0; i < 30; ++i) blocks.push_back(f.malloc(2 * MiB));
  for (DevicePtr p : blocks) free_deferred(f, p);
  f.backend.fail_next_records(1);
  const int segments = f.backend.alloc_calls;
  const DevicePtr p = f.malloc(2 * MiB);
  CHECK(f.backend.device_syncs == 1);
  CHECK(f.stats().num_sync_all_streams == 1);
  CHECK(f.backend.alloc_calls == segments);  // served from the synchronized blocks
  CHECK(f.stats().deferred_free_bytes.current == 0);
  f.free(p);
}

TEST_CASE("out of memory waits for fences and deferred frees before giving up") {
  AllocFixture f({}, 100 * MiB);
  std::vector<DevicePtr> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(f.malloc(20 * MiB));
  for (DevicePtr p : blocks) free_deferred(f, p);
  // 4 waiting frees are below the batch minimum, and 80 of 100 MiB are
  // held: a 60 MiB request cannot grow, so the OOM path flushes them.
  const DevicePtr p = f.malloc(60 * MiB);
  CHECK(f.stats().num_fences == 1);
  CHECK(f.stats().num_ooms == 0);
  CHECK(f.stats().deferred_free_bytes.current == 0);
  f.free(p);
}

TEST_CASE("double and foreign deferred frees are refused and change nothing") {
  AllocFixture f;
  const DevicePtr a = f.malloc(4096);
  free_deferred(f, a);
  CHECK(f.alloc->free_deferred(a) == kInvalidValue);
  CHECK(f.alloc->free_deferred(a + 512) == kInvalidValue);
  CHECK(f.alloc->free_deferred(0x10) == kNotOwned);
  CHECK(f.alloc->free_deferred(0) == kSuccess);
  CHECK(f.stats().num_deferred_frees == 1);
  f.alloc->validate();
}

// ---------------------------------------------------------------- joins
// (ledger_fences.cpp, join_for): a miss that would grow while waiting frees
// could serve it orders later work after their fence and reuses them at once.

namespace {

struct JoinFixture : AllocFixture {
  explicit JoinFixture(Config cfg = {}) : AllocFixture(cfg) {
    backend.allow_joins(true);
    backend.add_nonblocking_stream(7, true);  // a busy side stream: fences do not complete by themselves
  }
  cachalloc::testing::ReuseOracle oracle{backend};
  void defer(DevicePtr p, std::size_t size) {
    oracle.freeing_deferred(p, size, 0);
    free_deferred(*this, p);
  }
  DevicePtr checked_malloc(std::size_t size, StreamId s = 0) {
    const DevicePtr p = malloc(size, s);
    INFO(oracle.check(p, size, s));
    CHECK(oracle.check(p, size, s).empty());
    return p;
  }
};

}  // namespace

// (12 MiB requests get segments of exactly their size: a miss means growth.)
TEST_CASE("a large miss joins the waiting frees instead of growing, with no host wait") {
  JoinFixture f;
  std::vector<DevicePtr> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(f.checked_malloc(12 * MiB));
  const DevicePtr keep = f.checked_malloc(12 * MiB);
  const int segments = f.backend.alloc_calls;
  for (DevicePtr p : blocks) f.defer(p, 12 * MiB);
  // Their fence cannot complete (the side stream is busy), yet the miss is
  // served from them: one fence, one join, no growth, no synchronization.
  const DevicePtr p = f.checked_malloc(12 * MiB);
  CHECK(std::find(blocks.begin(), blocks.end(), p) != blocks.end());
  CHECK(f.backend.alloc_calls == segments);
  CHECK(f.backend.fence_records == 1);
  CHECK(f.backend.fence_joins == 1);
  CHECK(f.backend.event_syncs == 0);
  CHECK(f.backend.device_syncs == 0);
  CHECK(f.stats().num_fence_joins == 1);
  CHECK(f.stats().num_fence_waits == 0);
  CHECK(f.stats().deferred_free_bytes.current == 0);
  CHECK(f.backend.live_fences() == 0);  // retired with the join
  // The other three are free now: three more requests cost nothing.
  for (int i = 0; i < 3; ++i) f.checked_malloc(12 * MiB);
  CHECK(f.backend.alloc_calls == segments);
  CHECK(f.backend.fence_joins == 1);
  f.free(keep);
}

TEST_CASE("a join covers every older fence, and frees after it wait for the next one") {
  JoinFixture f;
  std::vector<DevicePtr> a, b;
  for (int i = 0; i < 25; ++i) a.push_back(f.checked_malloc(64 * 1024));
  for (int i = 0; i < 2; ++i) b.push_back(f.checked_malloc(12 * MiB));
  const DevicePtr keep = f.checked_malloc(12 * MiB);
  for (DevicePtr p : a) f.defer(p, 64 * 1024);
  f.alloc->reclaim();  // puts the 25 behind a fence (not complete)
  REQUIRE(f.backend.fence_records == 1);
  for (DevicePtr p : b) f.defer(p, 12 * MiB);
  // A large miss: one more fence for the two, one join of the newest,
  // both fences retired.
  const int segments = f.backend.alloc_calls;
  f.checked_malloc(12 * MiB);
  CHECK(f.backend.fence_records == 2);
  CHECK(f.backend.fence_joins == 1);
  CHECK(f.backend.live_fences() == 0);
  CHECK(f.backend.alloc_calls == segments);
  // The 25 small blocks came back too: 25 requests, no growth, no join.
  for (int i = 0; i < 25; ++i) f.checked_malloc(64 * 1024);
  CHECK(f.backend.alloc_calls == segments);
  CHECK(f.backend.fence_joins == 1);
  // A free after the join is not covered by it.
  const DevicePtr late = f.checked_malloc(12 * MiB);
  f.defer(late, 12 * MiB);
  CHECK(f.checked_malloc(12 * MiB) == late);  // served by a second join...
  CHECK(f.backend.fence_joins == 2);          // ...not by the first
  f.free(keep);
}

TEST_CASE("a small miss joins only once 20 frees wait") {
  JoinFixture f;
  std::vector<DevicePtr> blocks;
  for (int i = 0; i < 20; ++i) blocks.push_back(f.checked_malloc(4096));
  // Fill the rest of the small segment so that a miss means growth.
  std::vector<DevicePtr> filler;
  const int segments = f.backend.alloc_calls;
  while (f.backend.alloc_calls == segments) filler.push_back(f.checked_malloc(4096));
  const DevicePtr last = filler.back();
  filler.pop_back();
  f.defer(last, 4096);  // (the block that opened a second segment: back to one segment's worth)
  for (int i = 0; i < 18; ++i) f.defer(blocks[i], 4096);
  // 19 waiting: the miss grows (or uses the second segment), no join.
  f.checked_malloc(4096);
  CHECK(f.backend.fence_joins == 0);
  f.defer(blocks[18], 4096);
  f.defer(blocks[19], 4096);
  // Exhaust what is free, then miss with 20+ waiting: a join.
  for (int guard = 0; guard < 100000 && f.backend.fence_joins == 0; ++guard) f.checked_malloc(4096);
  CHECK(f.backend.fence_joins == 1);
}

// The boundary of the rule above, on a real miss each time: the small
// segment is full (32 blocks of 64 KiB), so the request must grow or join.
TEST_CASE("a small miss with fence_join_frees - 1 frees waiting grows; with fence_join_frees it joins") {
  for (bool enough : {false, true}) {
    INFO((enough ? "20" : "19") << " frees waiting");
    JoinFixture f;
    REQUIRE(f.alloc->config().fence_join_frees == 20);
    std::vector<DevicePtr> blocks;
    for (int i = 0; i < 32; ++i) blocks.push_back(f.checked_malloc(64 * 1024));
    REQUIRE(f.backend.alloc_calls == 1);  // one full 2 MiB segment
    const int waiting = enough ? 20 : 19;
    for (int i = 0; i < waiting; ++i) f.defer(blocks[static_cast<std::size_t>(i)], 64 * 1024);
    const DevicePtr p = f.checked_malloc(64 * 1024);
    if (enough) {
      CHECK(f.backend.fence_joins == 1);
      CHECK(f.backend.alloc_calls == 1);  // served by a joined block
      CHECK(std::find(blocks.begin(), blocks.end(), p) != blocks.end());
    } else {
      CHECK(f.backend.fence_joins == 0);  // two driver calls for 19 frees: more than 0.1 a free
      CHECK(f.backend.alloc_calls == 2);
      CHECK(std::find(blocks.begin(), blocks.end(), p) == blocks.end());
    }
  }
}

// A fence recorded before a capture began cannot be joined during it
// (cuCtxWaitEvent is refused, the fake's refuse_fences): its blocks must
// wait for the fence itself, however the miss is then served.
TEST_CASE("a join refused after the fence was recorded hands none of its blocks out early") {
  JoinFixture f;
  std::vector<DevicePtr> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(f.checked_malloc(12 * MiB));
  const DevicePtr keep = f.checked_malloc(200 * MiB);  // more allocated than waits: no host wait for the fence
  for (DevicePtr p : blocks) f.defer(p, 12 * MiB);
  f.alloc->reclaim();  // behind one fence, not complete (the side stream is busy)
  REQUIRE(f.backend.fence_records == 1);
  f.backend.refuse_fences(true);  // a capture begins
  const DevicePtr p = f.checked_malloc(12 * MiB);  // the oracle: not one of them before the fence completed
  CHECK(f.backend.fence_joins == 0);
  CHECK(std::find(blocks.begin(), blocks.end(), p) == blocks.end());
  f.backend.refuse_fences(false);
  CHECK(std::find(blocks.begin(), blocks.end(), f.checked_malloc(12 * MiB)) != blocks.end());  // joined now
  CHECK(f.backend.fence_joins == 1);
  f.free(keep);
}

TEST_CASE("no join during a capture, nor with fence_join:false, nor where the device cannot") {
  SECTION("capture: fences refused, the miss grows, nothing is reused early") {
    JoinFixture f;
    const DevicePtr a = f.checked_malloc(8 * MiB);
    f.defer(a, 8 * MiB);
    f.backend.refuse_fences(true);
    CHECK(f.checked_malloc(8 * MiB) != a);
    CHECK(f.backend.fence_joins == 0);
    f.backend.refuse_fences(false);
    CHECK(f.checked_malloc(8 * MiB) == a);  // the next miss joins
    CHECK(f.backend.fence_joins == 1);
  }
  SECTION("fence_join:false") {
    Config cfg;
    cfg.fence_join = false;
    JoinFixture f(cfg);
    const DevicePtr a = f.checked_malloc(8 * MiB);
    f.defer(a, 8 * MiB);
    CHECK(f.checked_malloc(8 * MiB) != a);
    CHECK(f.backend.fence_joins == 0);
    CHECK(f.stats().num_fence_joins == 0);
  }
  SECTION("a device without joins: no fence is recorded for nothing") {
    JoinFixture f;
    f.backend.allow_joins(false);
    const DevicePtr a = f.checked_malloc(8 * MiB);
    f.defer(a, 8 * MiB);
    CHECK(f.checked_malloc(8 * MiB) != a);
    CHECK(f.backend.fence_records == 0);
    CHECK(f.backend.fence_joins == 0);
  }
}

TEST_CASE("a loop of large plain frees with a busy side stream stays at its live bytes") {
  JoinFixture f;
  // Each step: 6 tensors of 4..24 MiB live at once, all freed without a
  // stream while the side stream stays busy (the host runs ahead).
  std::vector<std::pair<DevicePtr, std::size_t>> live;
  std::int64_t most_live = 0;
  for (int step = 0; step < 200; ++step) {
    const std::size_t size = (4 + 4 * (step % 6)) * MiB;
    live.emplace_back(f.checked_malloc(size), size);
    most_live = std::max(most_live, f.allocated());
    if (live.size() == 6) {
      for (auto [p, bytes] : live) f.defer(p, bytes);
      live.clear();
    }
  }
  // Without joins this grows by a segment per miss until 20 frees wait and
  // then waits on the host; with them the cache stays within 2x the live
  // bytes and nothing ever waits on the host.
  CHECK(f.reserved() <= 2 * most_live);
  CHECK(f.backend.event_syncs == 0);
  CHECK(f.stats().num_fence_waits == 0);
  CHECK(f.stats().num_fence_joins > 0);
}

// ---------------------------------------------------------------- the byte bound
// (ledger_fences.cpp, bound_waiting): past fence_wait_max waiting bytes, and
// with 20 frees waiting, the free itself joins them.

TEST_CASE("past fence_wait_max a free joins the waiting frees: reusable at once, at most 0.1 calls per free") {
  Config cfg;
  cfg.fence_wait_max = 1 * MiB;
  JoinFixture f(cfg);
  std::vector<DevicePtr> blocks;
  for (int i = 0; i < 40; ++i) blocks.push_back(f.checked_malloc(64 * 1024));
  // 19 frees of 64 KiB: 1.19 MiB wait, over the bound, but fewer than 20
  // frees: no join yet (a join per free would cost two calls per free).
  for (int i = 0; i < 19; ++i) f.defer(blocks[i], 64 * 1024);
  CHECK(f.backend.fence_joins == 0);
  CHECK(f.stats().deferred_free_bytes.current == 19 * 64 * 1024);
  // The 20th joins them all: nothing waits, and they serve the next requests
  // (the oracle checks each is reused only after the join).
  f.defer(blocks[19], 64 * 1024);
  CHECK(f.backend.fence_joins == 1);
  CHECK(f.backend.fence_records == 1);
  CHECK(f.stats().num_fence_joins == 1);
  CHECK(f.stats().deferred_free_bytes.current == 0);
  CHECK(f.backend.live_fences() == 0);
  CHECK(f.backend.event_syncs == 0);
  CHECK(f.backend.device_syncs == 0);
  const int segments = f.backend.alloc_calls;
  for (int i = 0; i < 20; ++i) f.checked_malloc(64 * 1024);
  CHECK(f.backend.alloc_calls == segments);
  // The next frees wait for a join of their own: one covering earlier frees
  // does not cover later ones.
  for (int i = 20; i < 39; ++i) f.defer(blocks[i], 64 * 1024);
  CHECK(f.backend.fence_joins == 1);
  CHECK(f.stats().deferred_free_bytes.current == 19 * 64 * 1024);
  f.defer(blocks[39], 64 * 1024);
  CHECK(f.backend.fence_joins == 2);
  // Two joins (a record and a wait each) for 40 frees: 0.1 calls per free.
  CHECK(f.backend.fence_records + f.backend.fence_joins <= 40 / 10);
}

TEST_CASE("a few large frees past four times fence_wait_max are joined without waiting for 20") {
  Config cfg;
  cfg.fence_wait_max = 4 * MiB;
  JoinFixture f(cfg);
  std::vector<DevicePtr> blocks;
  for (int i = 0; i < 6; ++i) blocks.push_back(f.checked_malloc(8 * MiB));
  f.defer(blocks[0], 8 * MiB);  // 8 MiB: over the bound, 1 free, under 4x: waits
  f.defer(blocks[1], 8 * MiB);  // 16 MiB: exactly 4x, not over: waits
  CHECK(f.backend.fence_joins == 0);
  f.defer(blocks[2], 8 * MiB);  // 24 MiB > 16 MiB: joined
  CHECK(f.backend.fence_joins == 1);
  CHECK(f.stats().deferred_free_bytes.current == 0);
  CHECK(f.stats().deferred_free_bytes.peak == 24 * MiB);
  const int segments = f.backend.alloc_calls;
  for (int i = 0; i < 3; ++i) f.checked_malloc(8 * MiB);  // the oracle checks each reuse
  CHECK(f.backend.alloc_calls == segments);
}

TEST_CASE("under fence_wait_max frees wait for a miss; with unlimited, only misses join") {
  for (const std::size_t bound : {std::size_t{64} * MiB, std::numeric_limits<std::size_t>::max()}) {
    Config cfg;
    cfg.fence_wait_max = bound;
    JoinFixture f(cfg);
    std::vector<DevicePtr> blocks;
    for (int i = 0; i < 30; ++i) blocks.push_back(f.checked_malloc(1 * MiB));
    for (DevicePtr p : blocks) f.defer(p, 1 * MiB);  // 30 MiB wait
    CHECK(f.backend.fence_joins == 0);
    CHECK(f.stats().deferred_free_bytes.current == 30 * MiB);
  }
}

TEST_CASE("the bound holds across a long loop: max(fence_wait_max, 20 frees' bytes) at most") {
  Config cfg;
  cfg.fence_wait_max = 16 * MiB;
  JoinFixture f(cfg);
  std::vector<std::pair<DevicePtr, std::size_t>> live;
  std::int64_t most_live = 0;
  for (int step = 0; step < 600; ++step) {
    const std::size_t size = (256 + 256 * (step % 7)) * 1024;  // 256 KiB .. 1.75 MiB
    live.emplace_back(f.checked_malloc(size), size);
    most_live = std::max(most_live, f.allocated());
    if (live.size() == 24) {
      for (auto [p, bytes] : live) f.defer(p, bytes);
      live.clear();
    }
  }
  // A join needs 20 waiting frees: past the bound, at most 20 frees more
  // (1.75 MiB each at most) wait for one: under max(bound + one free, 20 frees).
  CHECK(f.stats().deferred_free_bytes.peak <= static_cast<std::int64_t>(16 * MiB + 20 * 1792 * 1024));
  CHECK(f.stats().deferred_free_bytes.peak > static_cast<std::int64_t>(16 * MiB));
  CHECK(f.stats().num_fence_joins > 0);
  CHECK(f.backend.event_syncs == 0);
  CHECK(f.reserved() <= 2 * most_live + static_cast<std::int64_t>(16 * MiB));
}

TEST_CASE("without joins the bound falls back to a fence at the free past deferred_bytes_limit") {
  Config cfg;
  cfg.fence_wait_max = 1 * MiB;
  JoinFixture f(cfg);
  f.backend.allow_joins(false);
  std::vector<DevicePtr> blocks;
  for (int i = 0; i < 30; ++i) blocks.push_back(f.checked_malloc(1 * MiB));
  for (DevicePtr p : blocks) f.defer(p, 1 * MiB);
  CHECK(f.backend.fence_joins == 0);
  CHECK(f.backend.fence_records == 0);  // 30 MiB is under deferred_bytes_limit (>= 256 MiB)
  CHECK(f.stats().deferred_free_bytes.current == 30 * MiB);
}
