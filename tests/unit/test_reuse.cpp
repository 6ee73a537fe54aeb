// test_reuse.cpp — the freed block held unmerged for the next request of its
// size (core/reuse_path.cpp).  The held block must be invisible: every
// address handed out and every statistic must be what the eager path (merge
// at every free) gives.  The eager path is reproduced by a twin allocator
// whose held block is settled after every step (snapshot() settles it).
// Every step is followed by validate() on both.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "alloc_fixture.h"

using namespace cachalloc;
using cachalloc::testing::AllocFixture;

namespace {

// Two allocators fed the same operations: `lazy` as a program drives it,
// `eager` settled after every step.  Each step checks that both return the
// same status and address and report the same statistics.
struct Twins {
  explicit Twins(Config cfg = {}) : lazy(cfg), eager(cfg) {}

  DevicePtr malloc(std::size_t size, StreamId stream = 0) {
    DevicePtr a = 0, b = 0;
    const Status sa = lazy.alloc->malloc(&a, size, stream);
    const Status sb = eager.alloc->malloc(&b, size, stream);
    REQUIRE(sa == sb);
    REQUIRE(a == b);
    step();
    return a;
  }
  void free(DevicePtr p) {
    REQUIRE(lazy.alloc->free(p) == eager.alloc->free(p));
    step();
  }
  void free_deferred(DevicePtr p) {
    REQUIRE(lazy.alloc->free_deferred(p) == eager.alloc->free_deferred(p));
    step();
  }
  void record_stream(DevicePtr p, StreamId s) {
    REQUIRE(lazy.alloc->record_stream(p, s) == eager.alloc->record_stream(p, s));
    step();
  }
  void complete_events() {
    lazy.backend.complete_all_events();
    eager.backend.complete_all_events();
  }
  void step() {
    (void)eager.alloc->snapshot();  // settles the eager twin's held block
    lazy.alloc->validate();
    eager.alloc->validate();
    REQUIRE(flatten_stats(lazy.stats()) == flatten_stats(eager.stats()));
  }

  AllocFixture lazy;
  AllocFixture eager;
};

std::int64_t inactive_split(const AllocFixture& f) { return f.stats().inactive_split[StatType::aggregate].current; }

}  // namespace

TEST_CASE("a freed block is reused for the next request of its size, as the eager path would") {
  Twins t;
  const DevicePtr a = t.malloc(512);
  for (int i = 0; i < 10; ++i) {
    t.free(a);
    CHECK(t.malloc(512) == a);
  }
  t.free(a);
  // The whole segment is free again: nothing split, as after a merge.
  CHECK(inactive_split(t.lazy) == 0);
  CHECK(t.lazy.stats().inactive_split[StatType::aggregate].allocated == 11);
  CHECK(t.lazy.stats().inactive_split_bytes[StatType::aggregate].freed == 11 * (2 * MiB - 512));
}

TEST_CASE("a held block settles before a request of another size, a free and the stats' consumers") {
  Twins t;
  const DevicePtr keep = t.malloc(4096);
  const DevicePtr a = t.malloc(1024);
  t.free(a);                         // held: its successor is the free tail
  const DevicePtr b = t.malloc(512);  // another size: settles, then best fit
  CHECK(b == a);
  const DevicePtr c = t.malloc(1024);
  t.free(b);  // predecessor busy, successor busy: no hold, plain free
  t.free(c);  // successor free, predecessor b free: merges both ways
  t.free(keep);
  CHECK(inactive_split(t.lazy) == 0);
  t.lazy.empty_cache();  // the held block's segment goes back whole
  CHECK(t.lazy.reserved() == 0);
  CHECK(t.lazy.backend.live_segments() == 0);
}

TEST_CASE("a free tail of another segment with the same size stays behind the reused block's tail") {
  Twins t;
  // Two 20 MiB segments, each 8 + 8 MiB allocated and a free 4 MiB tail;
  // segment B's tail was inserted last, so it comes first among the two.
  const DevicePtr k = t.malloc(8 * MiB);
  const DevicePtr h = t.malloc(8 * MiB);
  const DevicePtr j = t.malloc(8 * MiB);
  const DevicePtr q = t.malloc(8 * MiB);
  REQUIRE(t.lazy.backend.live_segments() == 2);
  t.free(h);  // held: k busy before it, A's tail free after it
  // The eager path merges h into a 12 MiB block and carves it again: A's
  // tail becomes the most recently inserted 4 MiB block, so the next 4 MiB
  // request takes it, not B's.
  CHECK(t.malloc(8 * MiB) == h);
  CHECK(t.malloc(4 * MiB) == h + 8 * MiB);
  t.free(k);
  t.free(j);
  t.free(q);
}

TEST_CASE("a block freed with another stream's use is never held and never handed out before its event") {
  AllocFixture f;
  const DevicePtr a = f.malloc(512, 1);
  REQUIRE(f.alloc->record_stream(a, 2) == kSuccess);
  f.free(a);
  CHECK(f.stats().active[StatType::aggregate].current == 1);  // waiting for the event
  for (int i = 0; i < 5; ++i) {
    const DevicePtr b = f.malloc(512, 1);
    CHECK(b != a);
    f.free(b);  // b may be held; a must stay parked
  }
  f.backend.complete_all_events();
  const DevicePtr c = f.malloc(512, 1);  // the event completes at this malloc
  f.free(c);
  CHECK(f.stats().active[StatType::aggregate].current == 0);
}

TEST_CASE("a held block freed on one stream is not handed to a request on another") {
  constexpr StreamId kS1 = 0x1001, kS2 = 0x2002;
  AllocFixture f;
  const DevicePtr keep = f.malloc(4096, kS1);
  const DevicePtr a = f.malloc(512, kS1);
  f.free(a);  // held: busy predecessor, free successor (S1's segment's tail)
  // Same size, another stream: S1's work may still use a, and S2's is not
  // ordered after it; S2 gets its own segment.
  const DevicePtr b = f.malloc(512, kS2);
  CHECK(b != a);
  CHECK(f.backend.alloc_calls == 2);
  CHECK_FALSE(f.alloc->is_live(a));
  // The held block settled into S1's pool: S1's next request gets it.
  CHECK(f.malloc(512, kS1) == a);
  // Held again, then asked for from S2 once more.
  f.free(a);
  const DevicePtr c = f.malloc(512, kS2);
  CHECK(c != a);
  CHECK(f.backend.alloc_calls == 2);  // from S2's segment
  f.free(b);
  f.free(c);
  f.free(keep);
}

TEST_CASE("a block freed on one stream while recorded on another is handed to neither before the event") {
  constexpr StreamId kS1 = 0x1001, kS2 = 0x2002;
  AllocFixture f;
  const DevicePtr keep = f.malloc(4096, kS1);
  const DevicePtr a = f.malloc(512, kS1);
  REQUIRE(f.alloc->record_stream(a, kS2) == kSuccess);
  f.free(a);  // waits for an event on S2: not held
  CHECK(f.backend.event_records == 1);
  for (int i = 0; i < 3; ++i) {
    const DevicePtr b = f.malloc(512, kS2);
    const DevicePtr c = f.malloc(512, kS1);
    CHECK(b != a);
    CHECK(c != a);
    f.free(b);
    f.free(c);  // may be held; a stays parked
  }
  f.backend.complete_events_on(kS2);
  // S2's work is done, but a is S1's: S2 still gets its own blocks.
  const DevicePtr b = f.malloc(512, kS2);
  CHECK(b != a);
  const DevicePtr c = f.malloc(512, kS1);  // a, back in S1's pool
  CHECK(c == a);
  f.free(b);
  f.free(c);
  f.free(keep);
  CHECK(f.stats().active[StatType::aggregate].current == 0);
}

TEST_CASE("a deferred free is never handed out before its fence, whatever was held") {
  AllocFixture f;
  const DevicePtr a = f.malloc(512);
  f.free(a);  // held
  const DevicePtr b = f.malloc(512);
  CHECK(b == a);
  REQUIRE(f.alloc->free_deferred(b) == kSuccess);
  f.alloc->validate();
  for (int i = 0; i < 5; ++i) {
    const DevicePtr c = f.malloc(512);
    CHECK(c != b);
    f.free(c);
  }
  CHECK(f.stats().deferred_free_bytes.current == 512);
}

TEST_CASE("a held block is settled for empty_cache, snapshots and the out-of-memory path") {
  AllocFixture f({}, 21 * MiB);  // room for a small and a large segment, not both
  const DevicePtr a = f.malloc(512);
  f.free(a);  // held
  const auto snap = f.alloc->snapshot();
  REQUIRE(snap.size() == 1);
  CHECK(snap[0].blocks.size() == 1);  // merged
  const DevicePtr b = f.malloc(512);
  f.free(b);  // held again
  // 3 MiB takes a 20 MiB segment: only after the retry path released the
  // cached small segment, which it can only do once the held block merged.
  const DevicePtr big = f.malloc(3 * MiB);
  CHECK(f.reserved() == static_cast<std::int64_t>(20 * MiB));
  f.free(big);
  f.empty_cache();
  CHECK(f.reserved() == 0);
}

TEST_CASE("random operations give the eager path's addresses and statistics at every step") {
  std::mt19937 rng(20240611);
  for (int round = 0; round < 4; ++round) {
    Config cfg;
    if (round == 1) cfg.max_split_size = 20 * MiB;
    if (round == 2) cfg.garbage_collection_threshold = 0.5;
    Twins t(cfg);
    const std::size_t sizes[] = {512, 1024, 4096, 1 * MiB, 3 * MiB, 12 * MiB, 30 * MiB};
    std::vector<std::pair<DevicePtr, StreamId>> live;
    for (int i = 0; i < 600; ++i) {
      const unsigned op = rng() % 10;
      if (op < 5 || live.empty()) {
        const StreamId s = rng() % 4 == 0 ? 1 : 0;
        live.push_back({t.malloc(sizes[rng() % 7], s), s});
        continue;
      }
      const std::size_t k = rng() % live.size();
      const DevicePtr p = live[k].first;
      if (op == 5) {
        t.record_stream(p, 2);
      } else if (op == 6) {
        t.free_deferred(p);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      } else {
        t.free(p);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      }
      if (rng() % 16 == 0) t.complete_events();
      if (round == 3 && rng() % 50 == 0) {
        t.lazy.alloc->reset_peak_stats();
        t.eager.alloc->reset_peak_stats();
        t.step();
      }
    }
    for (const auto& [p, s] : live) t.free(p);
  }
}
