// test_cross_stream.cpp — cross-stream reuse (core/steal_path.cpp): a miss
// takes another stream's freed block, the requesting stream ordered after
// that stream's work on the device, instead of growing the cache.
//
// The fake backend logs every order_streams wait with the tick of the record
// it waits for, and keeps each stream's vector clock (fake_backend.h,
// "cross-stream ordering"): a test can ask whether the requesting stream
// was made to wait for an event recorded on the freeing stream after the
// free, before the pointer came back.
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "alloc_fixture.h"
#include "reuse_oracle.h"
#include "size_policy.h"

using namespace cachalloc;
using namespace cachalloc::testing;

namespace {

constexpr StreamId kS1 = 0x1000, kS2 = 0x2000, kS3 = 0x3000;

Config reuse_off() {
  Config c;
  c.cross_stream_reuse = CrossStream::off;
  return c;
}

Config lend() {
  Config c;
  c.cross_stream_reuse = CrossStream::blocks;
  return c;
}

// The one wait the last steal made: on `donor`'s work up to after `freed_at`.
void check_waited(const FakeBackend& b, StreamId waiter, StreamId donor, std::uint64_t freed_at) {
  REQUIRE_FALSE(b.order_log.empty());
  const FakeBackend::OrderWait& w = b.order_log.back();
  CHECK(w.waiter == waiter);
  CHECK(w.donor == donor);
  CHECK(w.recorded_at > freed_at);  // recorded after the free: covers the program's last use
  CHECK(w.at > w.recorded_at);
  CHECK(b.stream_ordered_after(waiter, donor, freed_at));
}

// What the shim does around the program's synchronize of `stream` that
// returned: the device has run it, and the cache is told.
void program_synchronizes(AllocFixture& f, StreamId stream, const CachingAllocator::ProgressPoint& point) {
  f.backend.program_synchronized(stream);
  f.alloc->stream_synced(stream, point);
}

// A 16 MiB request on S2 takes `expected` with no order and no event query,
// the first idle reuse.
void takes_idle(AllocFixture& f, ReuseOracle& oracle, DevicePtr expected) {
  const int queries = f.backend.event_queries;
  const DevicePtr a = f.malloc(16 * MiB, kS2);
  CHECK(oracle.check(a, 16 * MiB, kS2).empty());
  CHECK(a == expected);
  CHECK(f.backend.order_waits == 0);
  CHECK(f.backend.event_queries == queries);  // known, not asked
  CHECK(f.stats().num_idle_cross_stream_reuses == 1);
}

}  // namespace

TEST_CASE("cross-stream: a freed segment reaches another stream only after it waits for the freeing stream's work") {
  AllocFixture f;
  const DevicePtr a = f.malloc(3 * MiB, kS1);  // a 20 MiB segment of S1's
  const std::uint64_t freed_at = f.backend.now();
  f.free(a);
  CHECK(f.backend.order_records == 0);  // nothing at the free
  const DevicePtr b = f.malloc(3 * MiB, kS2);
  // S1's whole free segment, moved to S2: no new memory...
  CHECK(b == a);
  CHECK(f.backend.alloc_calls == 1);
  // ...after S2 was made to wait, on the device, for an event recorded on S1
  // after the free (before malloc returned: the log is written by the call).
  CHECK(f.backend.order_records == 1);
  CHECK(f.backend.order_waits == 1);
  check_waited(f.backend, kS2, kS1, freed_at);
  CHECK(f.backend.device_syncs == 0);  // no host wait
  CHECK(f.backend.event_syncs == 0);
  CHECK(f.stats().num_cross_stream_reuses == 1);
  // The segment is S2's now: S2's own frees reuse it at once, with no order.
  f.free(b);
  CHECK(f.malloc(3 * MiB, kS2) == a);
  CHECK(f.backend.order_waits == 1);
  const auto snap = f.alloc->snapshot();
  REQUIRE(snap.size() == 1);
  CHECK(snap[0].stream == kS2);
}

// Idle reuse: the event of a steal stays as the donor's mark; once the
// device has shown it complete, the donor's blocks freed before it go to any
// stream with no order at all (CUDA's pool's opportunistic reuse).
TEST_CASE("cross-stream: a block freed before its stream's completed mark goes to another stream with no wait") {
  AllocFixture f;
  ReuseOracle oracle(f.backend);
  const DevicePtr x = f.malloc(16 * MiB, kS1);  // two whole 16 MiB segments of S1's
  const DevicePtr y = f.malloc(16 * MiB, kS1);
  for (DevicePtr p : {x, y}) {
    oracle.freeing(p, 16 * MiB, kS1, {});
    f.free(p);
  }
  const DevicePtr a = f.malloc(16 * MiB, kS2);  // ordered: S1's mark is recorded here
  CHECK(oracle.check(a, 16 * MiB, kS2).empty());
  CHECK(f.backend.order_waits == 1);
  CHECK(f.stats().num_idle_cross_stream_reuses == 0);
  SECTION("the mark completed: the other segment goes with no order and no new memory") {
    f.backend.complete_events_on(kS1);
    const int queries = f.backend.event_queries;
    const DevicePtr b = f.malloc(16 * MiB, kS3);
    CHECK(oracle.check(b, 16 * MiB, kS3).empty());
    CHECK((b == x || b == y));
    CHECK(b != a);
    CHECK(f.backend.order_waits == 1);
    CHECK(f.backend.order_records == 1);
    CHECK(f.backend.event_queries == queries + 1);  // the mark, once
    CHECK(f.backend.mark_records == 1);  // a new mark on S1 (its later frees idle in time too)
    CHECK(f.backend.alloc_calls == 2);
    CHECK(f.stats().num_cross_stream_reuses == 2);
    CHECK(f.stats().num_idle_cross_stream_reuses == 1);
  }
  SECTION("the mark not complete yet: ordered again, the new event the mark") {
    const DevicePtr b = f.malloc(16 * MiB, kS3);
    CHECK(oracle.check(b, 16 * MiB, kS3).empty());
    CHECK(f.backend.order_waits == 2);
    CHECK(f.stats().num_idle_cross_stream_reuses == 0);
  }
  SECTION("a block freed after the mark is not covered by it") {
    f.backend.complete_events_on(kS1);
    const DevicePtr z = f.malloc(16 * MiB, kS1);  // the other segment, S1's own
    oracle.freeing(z, 16 * MiB, kS1, {});
    f.free(z);
    const DevicePtr b = f.malloc(16 * MiB, kS3);
    CHECK(oracle.check(b, 16 * MiB, kS3).empty());
    CHECK(b == z);
    CHECK(f.backend.order_waits == 2);
    CHECK(f.stats().num_idle_cross_stream_reuses == 0);
  }
}

// The program's own waits (the shim's synchronize hooks): a stream
// synchronize that returned shows the device past everything freed on that
// stream before it began, a context synchronize past everything freed on
// any, so steals of such blocks need no order, and cost no driver call.
TEST_CASE("cross-stream: a block freed before the program synchronized its stream goes to another with no wait") {
  AllocFixture f;
  ReuseOracle oracle(f.backend);
  const DevicePtr x = f.malloc(16 * MiB, kS1);
  const DevicePtr y = f.malloc(16 * MiB, kS1);
  const DevicePtr w = f.malloc(16 * MiB, kS3);
  oracle.freeing(x, 16 * MiB, kS1, {});
  f.free(x);
  const auto point = f.alloc->progress_point(kS1, false);  // a non-blocking S1: no mark
  CHECK(point.valid);
  CHECK(f.backend.mark_records == 0);
  SECTION("the wait returned: x goes with no order; y, freed after the point, is ordered") {
    oracle.freeing(y, 16 * MiB, kS1, {});
    f.free(y);  // freed while the synchronize ran: not covered
    program_synchronizes(f, kS1, point);
    takes_idle(f, oracle, x);
    const DevicePtr b = f.malloc(16 * MiB, kS3);
    CHECK(oracle.check(b, 16 * MiB, kS3).empty());
    CHECK(b == y);
    CHECK(f.backend.order_waits == 1);
    CHECK(f.stats().num_idle_cross_stream_reuses == 1);
  }
  SECTION("the wait failed (not reported): ordered") {
    const DevicePtr a = f.malloc(16 * MiB, kS2);
    CHECK(oracle.check(a, 16 * MiB, kS2).empty());
    CHECK(f.backend.order_waits == 1);
    CHECK(f.stats().num_idle_cross_stream_reuses == 0);
  }
  SECTION("another stream's synchronize says nothing of S1's blocks") {
    program_synchronizes(f, kS3, point);
    const DevicePtr a = f.malloc(16 * MiB, kS2);
    CHECK(oracle.check(a, 16 * MiB, kS2).empty());
    CHECK(f.backend.order_waits == 1);
    CHECK(f.stats().num_idle_cross_stream_reuses == 0);
  }
  SECTION("a context synchronize covers every stream") {
    oracle.freeing(w, 16 * MiB, kS3, {});
    f.free(w);
    const auto all = f.alloc->context_progress_point();
    f.backend.program_synchronized_all();
    f.alloc->all_synced(all);
    for (StreamId taker : {kS2, StreamId{0x4000}}) {
      const DevicePtr a = f.malloc(16 * MiB, taker);
      CHECK(oracle.check(a, 16 * MiB, taker).empty());
    }
    CHECK(f.backend.order_waits == 0);
    CHECK(f.backend.device_syncs == 0);
    CHECK(f.stats().num_idle_cross_stream_reuses == 2);
  }
}

// A blocking stream: legacy work a free on it relied on runs before any
// later record on it, not necessarily before its synchronize returns.  So
// the point records a mark first, and a refused mark reports nothing.
TEST_CASE("cross-stream: a blocking stream's synchronize counts through a mark recorded before it") {
  AllocFixture f;
  ReuseOracle oracle(f.backend);
  f.malloc(2 * MiB, kS3);  // a second stream with a segment: steals are possible
  const DevicePtr x = f.malloc(16 * MiB, kS1);
  oracle.freeing(x, 16 * MiB, kS1, {});
  f.free(x);
  SECTION("recorded: covered") {
    const auto point = f.alloc->progress_point(kS1, true);
    CHECK(point.valid);
    CHECK(f.backend.mark_records == 1);
    program_synchronizes(f, kS1, point);
    takes_idle(f, oracle, x);  // the mark left the ring at the report: no query
  }
  SECTION("refused (a capture in flight): nothing reported") {
    f.backend.refuse_orders(true);
    const auto point = f.alloc->progress_point(kS1, true);
    CHECK_FALSE(point.valid);
    program_synchronizes(f, kS1, point);
    f.backend.refuse_orders(false);
    const DevicePtr a = f.malloc(16 * MiB, kS2);
    CHECK(oracle.check(a, 16 * MiB, kS2).empty());
    CHECK(f.backend.order_waits == 1);
    CHECK(f.stats().num_idle_cross_stream_reuses == 0);
  }
}

// Of donors whose memory is busy, the wait is for the donor's work queued
// since the device was last known to be through it: the donor known
// furthest on goes first, before a smaller fit of one never seen.
TEST_CASE("cross-stream: of busy donors, the one the device is known to have run furthest goes first") {
  AllocFixture f;
  ReuseOracle oracle(f.backend);
  const DevicePtr small = f.malloc(16 * MiB, kS1);
  const DevicePtr big = f.malloc(32 * MiB, kS3);
  const auto point = f.alloc->progress_point(kS3, false);
  program_synchronizes(f, kS3, point);  // while `big` was live
  const std::uint64_t freed_at = f.backend.now();
  oracle.freeing(small, 16 * MiB, kS1, {});
  f.free(small);
  oracle.freeing(big, 32 * MiB, kS3, {});
  f.free(big);
  const DevicePtr a = f.malloc(16 * MiB, kS2);
  CHECK(oracle.check(a, 16 * MiB, kS2).empty());
  CHECK(a == big);
  check_waited(f.backend, kS2, kS3, freed_at);
  CHECK(f.stats().num_idle_cross_stream_reuses == 0);
  CHECK(f.backend.alloc_calls == 2);
}

TEST_CASE("cross-stream: with no cross-stream reuse, or one stream, a synchronize costs nothing") {
  SECTION("reuse off") {
    AllocFixture f(reuse_off());
    f.free(f.malloc(16 * MiB, kS1));
    f.free(f.malloc(16 * MiB, kS2));
    CHECK_FALSE(f.alloc->progress_point(kS1, true).valid);
    CHECK(f.backend.mark_records == 0);
    CHECK_FALSE(f.alloc->context_progress_point().valid);
  }
  SECTION("one stream has had segments: no steal possible yet") {
    AllocFixture f;
    f.free(f.malloc(16 * MiB, kS1));
    f.free(f.malloc(1024, kS1));
    CHECK_FALSE(f.alloc->progress_point(kS1, true).valid);
    CHECK(f.backend.mark_records == 0);
    CHECK_FALSE(f.alloc->context_progress_point().valid);
    f.malloc(16 * MiB, kS2);  // a second stream: now there is
    CHECK(f.alloc->progress_point(kS1, true).valid);
    CHECK(f.backend.mark_records == 1);
  }
}

TEST_CASE("cross-stream: an idle block of another stream comes before a smaller one that needs a wait") {
  AllocFixture f;
  const DevicePtr big = f.malloc(32 * MiB, kS1);
  const DevicePtr spare = f.malloc(16 * MiB, kS1);
  f.free(big);
  f.free(spare);
  f.free(f.malloc(16 * MiB, kS2));  // takes S1's 16 MiB (ordered: S1's mark), frees it on S2
  // S1's mark is not complete: the smallest fit, S2's, goes on (ordered).
  const DevicePtr busy = f.malloc(16 * MiB, StreamId{0x4000});
  CHECK(busy == spare);
  f.free(busy);  // a 16 MiB segment of 0x4000's, no mark there
  f.backend.complete_events_on(kS1);  // S1's 32 MiB is idle now
  const int waits = f.backend.order_waits;
  CHECK(waits == 2);
  const DevicePtr p = f.malloc(16 * MiB, kS3);
  CHECK(p == big);
  CHECK(f.backend.order_waits == waits);
  CHECK(f.stats().num_idle_cross_stream_reuses == 1);
}

TEST_CASE("cross-stream: a destroyed stream's mark goes with it") {
  AllocFixture f;
  f.free(f.malloc(16 * MiB, kS1));
  f.free(f.malloc(16 * MiB, kS1 + 1));
  f.malloc(16 * MiB, kS2);  // a mark on one of them
  const std::size_t events = f.backend.live_events();
  REQUIRE(f.alloc->retire_stream(kS1) == kSuccess);
  REQUIRE(f.alloc->retire_stream(kS1 + 1) == kSuccess);
  f.alloc.reset();  // every event goes back to the driver, marks included
  CHECK(f.backend.live_events() == 0);
  CHECK(events > 0);
}

// What bounds a stream's cache: no stream grows while another holds a
// whole free segment that serves it.  S1 caches 128 MiB and goes idle; four
// other streams' 128 MiB come out of it, and S1 keeps nothing.
TEST_CASE("cross-stream: what one stream keeps cached goes to the others before the cache grows") {
  for (const bool on : {true, false}) {
    INFO("cross_stream_reuse " << on);
    AllocFixture f(on ? Config{} : reuse_off());
    std::vector<DevicePtr> s1;
    for (int i = 0; i < 8; ++i) s1.push_back(f.malloc(16 * MiB, kS1));  // a 16 MiB segment each
    for (DevicePtr p : s1) f.free(p);
    std::vector<DevicePtr> others;
    for (StreamId s : {kS2, kS3, StreamId{0x4000}, StreamId{0x5000}})
      for (int i = 0; i < 2; ++i) others.push_back(f.malloc(16 * MiB, s));
    std::size_t cached_on_s1 = 0;
    for (const SegmentInfo& seg : f.alloc->snapshot())
      if (seg.stream == kS1) cached_on_s1 += seg.size;
    if (on) {
      CHECK(f.reserved() == static_cast<std::int64_t>(128 * MiB));
      CHECK(f.backend.alloc_calls == 8);
      CHECK(cached_on_s1 == 0);
      CHECK(f.stats().num_cross_stream_reuses == 8);
      CHECK(f.backend.order_waits == 8);
    } else {
      CHECK(f.reserved() == static_cast<std::int64_t>(256 * MiB));
      CHECK(cached_on_s1 == 128 * MiB);
    }
    for (DevicePtr p : others) f.free(p);
  }
}

TEST_CASE("cross-stream: off, each stream grows for itself and nothing is ordered") {
  AllocFixture f(reuse_off());
  const DevicePtr a = f.malloc(3 * MiB, kS1);
  f.free(a);
  const DevicePtr b = f.malloc(3 * MiB, kS2);
  CHECK(b != a);
  CHECK(f.backend.alloc_calls == 2);
  CHECK(f.backend.order_records == 0);
  CHECK(f.backend.order_waits == 0);
  CHECK(f.stats().num_cross_stream_reuses == 0);
  CHECK(f.reserved() == static_cast<std::int64_t>(40 * MiB));
}

TEST_CASE("cross-stream: a block of a segment its stream still uses stays that stream's by default") {
  AllocFixture f;
  const DevicePtr keep = f.malloc(4 * MiB, kS1);
  const DevicePtr a = f.malloc(4 * MiB, kS1);
  f.free(a);  // S1: [keep | 16 MiB free]
  CHECK(f.malloc(4 * MiB, kS2) != a);
  CHECK(f.backend.alloc_calls == 2);
  CHECK(f.backend.order_records == 0);
  f.free(keep);
}

TEST_CASE("cross-stream: blocks: a block of a segment its stream still uses is lent, and its free waits for the borrower") {
  AllocFixture f(lend());
  const DevicePtr keep = f.malloc(4 * MiB, kS1);  // S1 keeps the head of its segment
  const DevicePtr a = f.malloc(4 * MiB, kS1);
  const std::uint64_t freed_at = f.backend.now();
  f.free(a);
  const DevicePtr b = f.malloc(4 * MiB, kS2);  // S1's free tail, lent
  CHECK(b == a);
  CHECK(f.backend.alloc_calls == 1);
  check_waited(f.backend, kS2, kS1, freed_at);
  const auto snap = f.alloc->snapshot();
  REQUIRE(snap.size() == 1);
  CHECK(snap[0].stream == kS1);  // still S1's segment
  // S2 frees it: S2's kernels may still use it, so S1 does not get it back
  // until an event on S2 completes...
  const int records = f.backend.event_records;
  f.free(b);
  CHECK(f.backend.event_records == records + 1);
  const DevicePtr c = f.malloc(4 * MiB, kS1);
  CHECK(c != a);
  f.free(c);
  // ...then S1 reuses it at once, in its own order.
  f.backend.complete_events_on(kS2);
  const int waits = f.backend.order_waits;
  CHECK(f.malloc(4 * MiB, kS1) == a);
  CHECK(f.backend.order_waits == waits);
  f.free(keep);
}

TEST_CASE("cross-stream: blocks: a held block freed on one stream reaches another only after the wait") {
  AllocFixture f(lend());
  const DevicePtr keep = f.malloc(4096, kS1);
  const DevicePtr a = f.malloc(512, kS1);
  const std::uint64_t freed_at = f.backend.now();
  f.free(a);  // held: busy predecessor, free successor
  const DevicePtr b = f.malloc(512, kS2);
  CHECK(b == a);  // the held block, settled into S1's free tail, lent
  CHECK(f.backend.alloc_calls == 1);
  check_waited(f.backend, kS2, kS1, freed_at);
  f.free(b);
  f.free(keep);
}

TEST_CASE("cross-stream: the smallest whole free segment of all other streams; blocks: then a lent best fit") {
  for (const bool lending : {false, true}) {
    INFO("blocks " << lending);
    AllocFixture f(lending ? lend() : Config{});
    const DevicePtr s1_keep = f.malloc(2 * MiB, kS1);
    const DevicePtr s1_tail = f.malloc(18 * MiB, kS1);  // S1: [2 live | 18 free] after the free
    const DevicePtr s3 = f.malloc(18 * MiB + 512, kS3);  // S3's own 20 MiB segment (>= 10 MiB: 2 MiB steps)
    const DevicePtr s4 = f.malloc(25 * MiB, 0x4000);    // and a 26 MiB one of another stream
    f.free(s3);
    f.free(s4);
    f.free(s1_tail);
    CHECK(f.malloc(18 * MiB, kS2) == s3);  // whole 20 MiB first: it moves
    CHECK(f.malloc(18 * MiB, kS2) == s4);  // then whole 26 MiB
    const DevicePtr third = f.malloc(18 * MiB, kS2);
    if (lending) {
      CHECK(third == s1_tail);  // the split one, lent
      CHECK(f.backend.alloc_calls == 3);
    } else {
      CHECK(third != s1_tail);  // grows
      CHECK(f.backend.alloc_calls == 4);
    }
    CHECK(f.stats().num_cross_stream_reuses == (lending ? 3 : 2));
    f.free(s1_keep);
  }
}

TEST_CASE("cross-stream: max_split_size rules hold for other streams' blocks too") {
  Config cfg;
  cfg.max_split_size = 40 * MiB;
  AllocFixture f(cfg);
  const DevicePtr big = f.malloc(60 * MiB, kS1);  // oversize
  f.free(big);
  const DevicePtr small = f.malloc(8 * MiB, kS2);  // may not split S1's oversize block
  CHECK(small != big);
  CHECK(f.stats().num_cross_stream_reuses == 0);
  const DevicePtr fits = f.malloc(50 * MiB, kS2);  // oversize, within max_non_split_rounding (20 MiB)
  CHECK(fits == big);
  CHECK(f.stats().num_cross_stream_reuses == 1);
  f.free(small);
  f.free(fits);
}

TEST_CASE("cross-stream: never while a graph capture is in flight") {
  AllocFixture f;
  const DevicePtr a = f.malloc(3 * MiB, kS1);
  f.free(a);
  SECTION("the backend refuses fences and orders alike (the shim's capture)") {
    f.backend.refuse_fences(true);
  }
  SECTION("the backend refuses orders") { f.backend.refuse_orders(true); }
  const DevicePtr b = f.malloc(3 * MiB, kS2);
  CHECK(b != a);  // grows instead
  CHECK(f.backend.alloc_calls == 2);
  CHECK(f.backend.order_records == 0);  // not even a record on S1
  CHECK(f.backend.order_waits == 0);
  CHECK(f.stats().num_cross_stream_reuses == 0);
  // Once the capture is over, the next miss may take S1's block.
  f.backend.refuse_fences(false);
  f.backend.refuse_orders(false);
  CHECK(f.malloc(3 * MiB, kS3) == a);
  CHECK(f.stats().num_cross_stream_reuses == 1);
}

TEST_CASE("cross-stream: a donor the backend cannot name is passed over; a requester that cannot wait takes nothing") {
  AllocFixture f;
  const DevicePtr a = f.malloc(3 * MiB, kS1);   // S1: a whole free 20 MiB segment
  const DevicePtr c = f.malloc(25 * MiB, kS3);  // S3: a whole free 26 MiB one
  f.free(a);
  f.free(c);
  SECTION("donor") {
    f.backend.unnameable(kS1);
    const DevicePtr b = f.malloc(3 * MiB, kS2);
    CHECK(b == c);  // S1's is the best fit, but only S3 can be ordered after
    CHECK(f.backend.order_waits == 1);
    CHECK(f.backend.order_refusals == 1);
    check_waited(f.backend, kS2, kS3, 0);
    // S1 is not asked again.
    f.malloc(3 * MiB, 0x4000);
    CHECK(f.backend.order_refusals == 1);
  }
  SECTION("requester") {
    f.backend.unnameable(kS2);
    const DevicePtr b = f.malloc(3 * MiB, kS2);
    CHECK(b != a);
    CHECK(b != c);
    CHECK(f.backend.order_waits == 0);
    CHECK(f.backend.order_refusals == 1);
    CHECK(f.stats().num_cross_stream_reuses == 0);
    // Nor is it tried again for that stream (no record for nothing).
    const int records = f.backend.order_records;
    f.malloc(30 * MiB, kS2);
    CHECK(f.backend.order_records == records);
    CHECK(f.backend.order_refusals == 1);
  }
  SECTION("the backend cannot order streams at all") {
    f.backend.orders_unsupported(true);
    CHECK(f.malloc(3 * MiB, kS2) != a);
    f.backend.orders_unsupported(false);
    CHECK(f.malloc(3 * MiB, kS2) != a);  // asked once, off for good
    CHECK(f.stats().num_cross_stream_reuses == 0);
  }
}

TEST_CASE("cross-stream: a destroyed stream's blocks are taken by no other stream until its handle asks again") {
  AllocFixture f;
  const DevicePtr a = f.malloc(3 * MiB, kS1);
  f.free(a);
  REQUIRE(f.alloc->retire_stream(kS1) == kSuccess);  // a waits for an event on S1
  f.backend.complete_all_events();
  const DevicePtr b = f.malloc(3 * MiB, kS2);  // S2's own 20 MiB segment: [3 | 17 free]
  CHECK(b != a);  // no event can be recorded on a destroyed stream
  CHECK(f.backend.order_records == 0);
  // A new stream with S1's handle misses: the handle is live again.
  f.malloc(30 * MiB, kS1);
  const DevicePtr c = f.malloc(18 * MiB, kS3);  // S1's 20 MiB, not S2's 17
  CHECK(c == a);
  CHECK(f.backend.order_log.back().donor == kS1);
  f.free(b);
}

TEST_CASE("cross-stream: tagged requests take only their tag's memory") {
  AllocFixture f;
  const DevicePtr a = f.malloc(3 * MiB, kS1);
  f.free(a);
  DevicePtr p = 0;
  REQUIRE(f.alloc->malloc_tagged(&p, 3 * MiB, kS2, 7) == kSuccess);
  f.alloc->validate();
  CHECK(p != a);
  CHECK(f.stats().num_cross_stream_reuses == 0);
}

TEST_CASE("cross-stream: expandable segments: none move; blocks: lends a block of another stream's reservation") {
  {
    Config cfg;
    cfg.expandable_segments = true;
    AllocFixture f(cfg, 1 * GiB);
    f.free(f.malloc(30 * MiB, kS1));
    f.malloc(30 * MiB, kS2);  // a reservation never moves: S2 maps its own
    CHECK(f.reserved() == static_cast<std::int64_t>(80 * MiB));
    CHECK(f.stats().num_cross_stream_reuses == 0);
  }
  Config cfg = lend();
  cfg.expandable_segments = true;
  AllocFixture f(cfg, 1 * GiB);
  const DevicePtr a = f.malloc(30 * MiB, kS1);  // S1 maps two 20 MiB pages
  const std::uint64_t freed_at = f.backend.now();
  f.free(a);
  const DevicePtr b = f.malloc(30 * MiB, kS2);
  CHECK(b == a);  // lent: S2 has no pages mapped
  CHECK(f.reserved() == static_cast<std::int64_t>(40 * MiB));
  check_waited(f.backend, kS2, kS1, freed_at);
  f.free(b);  // waits for an event on S2, then S1's again
  f.backend.complete_events_on(kS2);
  CHECK(f.malloc(30 * MiB, kS1) == a);
}

TEST_CASE("cross-stream: the counter is an accumulated count") {
  AllocFixture f;
  f.free(f.malloc(3 * MiB, kS1));
  f.malloc(3 * MiB, kS2);
  CHECK(f.stats().num_cross_stream_reuses == 1);
  f.alloc->reset_accumulated_stats();
  CHECK(f.stats().num_cross_stream_reuses == 0);
}

// A request server on the fake backend: N streams, each serving requests of
// three blocks (256 B to 32 MiB, log-uniform), streams taking turns, every
// request freed on its stream before that stream's next; the device
// completes all events every `complete_every` rounds (it catches up with
// the host now and then).  Every address handed out is checked against the
// ranges not yet safe for its stream (reuse_oracle.h).  `one_stream`: the
// same requests all on one stream, what the allocator holds with no stream
// boundaries at all.
namespace {

struct ServerOutcome {
  std::int64_t peak_reserved;
  std::size_t peak_live;  // the most bytes (rounded) live at once
  std::int64_t reuses;
  std::int64_t idle_reuses;
  std::int64_t orders;  // order_streams waits
};

std::size_t log_uniform(std::mt19937_64& rng, std::size_t lo, std::size_t hi) {
  std::uniform_real_distribution<double> u(std::log(static_cast<double>(lo)), std::log(static_cast<double>(hi)));
  return static_cast<std::size_t>(std::exp(u(rng)));
}

ServerOutcome serve(const Config& cfg, std::uint64_t seed, unsigned complete_every = 4, bool one_stream = false) {
  constexpr int kStreams = 16, kRounds = 60;
  AllocFixture f(cfg, 64 * GiB);
  ReuseOracle oracle(f.backend);
  std::mt19937_64 rng(seed);
  struct Live {
    DevicePtr p;
    std::size_t size;
  };
  std::vector<std::vector<Live>> held(kStreams);
  std::size_t live = 0, peak_live = 0;
  for (int r = 0; r < kRounds; ++r) {
    for (int s = 0; s < kStreams; ++s) {
      const StreamId sid = one_stream ? 0x10000 : 0x10000 * static_cast<StreamId>(s + 1);
      auto& mine = held[static_cast<std::size_t>(s)];
      // The previous request's blocks, freed on the stream (stream-ordered).
      for (const Live& l : mine) {
        oracle.freeing(l.p, l.size, sid, {});
        f.free(l.p);
        live -= round_size(l.size, cfg);
      }
      mine.clear();
      for (int k = 0; k < 3; ++k) {
        const std::size_t size = log_uniform(rng, 256, 32 * MiB);
        const DevicePtr p = f.malloc(size, sid);
        const std::string early = oracle.check(p, size, sid);
        INFO(early);
        REQUIRE(early.empty());
        mine.push_back({p, size});
        live += round_size(size, cfg);
      }
      peak_live = std::max(peak_live, live);
    }
    if (rng() % complete_every == 0) f.backend.complete_all_events();
  }
  const DeviceStats st = f.stats();
  return {st.reserved_bytes[StatType::aggregate].peak, peak_live, st.num_cross_stream_reuses,
          st.num_idle_cross_stream_reuses, f.backend.order_waits};
}

}  // namespace

TEST_CASE("cross-stream: a server's 16 streams hold about what one stream would, not several times it") {
  std::int64_t one_total = 0, on_total = 0, off_total = 0;
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    const ServerOutcome one = serve(Config{}, seed, 4, true);
    const ServerOutcome on = serve(Config{}, seed);
    const ServerOutcome off = serve(reuse_off(), seed);
    INFO("seed " << seed << ": peak live " << on.peak_live / MiB << " MiB; reserved: one stream "
                 << one.peak_reserved / MiB << " MiB, 16 streams " << on.peak_reserved / MiB << " MiB (" << on.reuses
                 << " reuses), without cross-stream reuse " << off.peak_reserved / MiB << " MiB");
    CHECK(on.reuses > 0);
    CHECK(off.reuses == 0);
    CHECK(on.peak_reserved * 10 < off.peak_reserved * 6);
    one_total += one.peak_reserved;
    on_total += on.peak_reserved;
    off_total += off.peak_reserved;
  }
  INFO("reserved, summed over the seeds: one stream " << one_total / MiB << " MiB, 16 streams " << on_total / MiB
                                                      << " MiB, without cross-stream reuse " << off_total / MiB);
  // Measured: 1,662, 2,378 and 5,848 MiB.
  CHECK(on_total * 10 < one_total * 15);
  CHECK(off_total > 2 * on_total);
}

// The same server with the device catching up every round: a steal whose
// donor's mark has completed takes idle memory with no order, every other
// steal costs one, and the oracle (serve) finds nothing handed out early.
// (Here the device completes only at the end of a round, so the memory
// stolen most is freed in the same round: 100 of 555 steals are idle.)
TEST_CASE("cross-stream: a server whose device keeps up takes idle memory with no order") {
  std::int64_t reuses = 0, idle = 0, orders = 0;
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    const ServerOutcome on = serve(Config{}, seed, 1);
    reuses += on.reuses;
    idle += on.idle_reuses;
    orders += on.orders;
  }
  INFO(idle << " of " << reuses << " cross-stream reuses idle, " << orders << " orders");
  CHECK(idle > 0);
  CHECK(orders == reuses - idle);
}

// A busy block that a pending mark of its stream already covers (recorded
// after its free, by an earlier steal): the steal waits on that mark, one
// driver call and no new record, for the donor's work up to the mark only.
TEST_CASE("cross-stream: a busy block covered by a pending mark of its stream is taken after that mark") {
  AllocFixture f;
  ReuseOracle oracle(f.backend);
  const DevicePtr x = f.malloc(16 * MiB, kS1);
  const DevicePtr y = f.malloc(16 * MiB, kS1);
  const std::uint64_t freed_at = f.backend.now();
  for (DevicePtr p : {x, y}) {
    oracle.freeing(p, 16 * MiB, kS1, {});
    f.free(p);
  }
  const DevicePtr a = f.malloc(16 * MiB, kS2);  // ordered: S1's mark, recorded here, covers x and y
  CHECK(oracle.check(a, 16 * MiB, kS2).empty());
  REQUIRE(f.backend.order_records == 1);
  const std::uint64_t marked_at = f.backend.order_log.back().recorded_at;
  SECTION("the mark is pending: waited on, not recorded again") {
    const int queries = f.backend.event_queries;
    const DevicePtr b = f.malloc(16 * MiB, kS3);
    CHECK(oracle.check(b, 16 * MiB, kS3).empty());
    CHECK((b == x || b == y));
    CHECK(b != a);
    check_waited(f.backend, kS3, kS1, freed_at);
    CHECK(f.backend.order_log.back().recorded_at == marked_at);
    CHECK(f.backend.order_records == 1);
    CHECK(f.backend.mark_waits == 1);
    CHECK(f.backend.event_queries == queries + 1);  // the mark, found busy, once
    CHECK(f.stats().num_marked_cross_stream_reuses == 1);
    CHECK(f.stats().num_idle_cross_stream_reuses == 0);
    CHECK(f.backend.alloc_calls == 2);
  }
  SECTION("the taker cannot wait now (a capture): no steal, the cache grows") {
    f.backend.refuse_orders(true);
    const DevicePtr b = f.malloc(16 * MiB, kS3);
    CHECK(oracle.check(b, 16 * MiB, kS3).empty());
    CHECK(b != x);
    CHECK(b != y);
    CHECK(f.backend.mark_waits == 0);
    CHECK(f.stats().num_cross_stream_reuses == 1);
    CHECK(f.backend.alloc_calls == 3);
  }
}
