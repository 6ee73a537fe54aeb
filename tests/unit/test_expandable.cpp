// test_expandable.cpp — expandable segments: one reservation per pool and
// stream, pages mapped on demand and unmapped on release.
#include <random>
#include <vector>

#include "alloc_fixture.h"
#include "size_policy.h"

using namespace cachalloc;
using namespace cachalloc::testing;

namespace {

Config expandable() {
  Config c;
  c.expandable_segments = true;
  return c;
}

}  // namespace

TEST_CASE("expandable: a small request maps one 2 MiB page of a reservation") {
  AllocFixture f(expandable(), 1 * GiB);
  f.malloc(1000);
  const auto s = f.stats();
  CHECK(s.segment[StatType::small_pool].current == 1);
  CHECK(s.reserved_bytes[StatType::small_pool].current == static_cast<std::int64_t>(2 * MiB));
  CHECK(s.num_device_alloc == 1);
  CHECK(f.backend.live_reservations() == 1);
  CHECK(f.backend.used() == 2 * MiB);
}

TEST_CASE("expandable: a freed block grows in place into newly mapped pages") {
  AllocFixture f(expandable(), 1 * GiB);
  const DevicePtr a = f.malloc(30 * MiB);  // two 20 MiB pages
  CHECK(f.reserved() == static_cast<std::int64_t>(40 * MiB));
  f.free(a);
  const DevicePtr b = f.malloc(50 * MiB);  // the 40 MiB free block + one more page
  CHECK(b == a);
  CHECK(f.reserved() == static_cast<std::int64_t>(60 * MiB));
  CHECK(f.stats().segment[StatType::large_pool].current == 1);
  CHECK(f.backend.live_mappings() == 2);  // a run of two pages, then one of one
  CHECK(f.stats().num_device_alloc == 2);
}

TEST_CASE("expandable: empty_cache unmaps free pages, keeps live ones, drops empty reservations") {
  AllocFixture f(expandable(), 1 * GiB);
  const DevicePtr a = f.malloc(20 * MiB);
  const DevicePtr c = f.malloc(10 * MiB);  // page 1
  const DevicePtr b = f.malloc(25 * MiB);  // the rest of page 1 and page 2
  f.free(a);
  f.free(c);
  CHECK(f.alloc->releasable_bytes() == 20 * MiB);  // only page 0 lies wholly inside the free block
  f.empty_cache();
  CHECK(f.reserved() == static_cast<std::int64_t>(40 * MiB));
  CHECK(f.backend.live_mappings() == 2);
  const auto snap = f.alloc->snapshot();
  REQUIRE(snap.size() == 1);
  CHECK(snap[0].expandable);
  CHECK(snap[0].blocks[0].state == BlockState::unmapped);
  CHECK(snap[0].blocks[1].state == BlockState::inactive);  // the 10 MiB of page 1 before b
  CHECK(snap[0].blocks[2].state == BlockState::allocated);
  f.free(b);
  f.empty_cache();
  CHECK(f.reserved() == 0);
  CHECK(f.backend.live_mappings() == 0);
  CHECK(f.backend.live_reservations() == 0);
  CHECK(f.stats().segment[StatType::aggregate].current == 0);
  CHECK(f.backend.used() == 0);
}

// The pages of a block freed on its stream may still be used by kernels
// that stream enqueued before the free; cuMemUnmap does not wait for them.
TEST_CASE("expandable: empty_cache synchronizes the device before unmapping free pages") {
  AllocFixture f(expandable(), 1 * GiB);
  const DevicePtr a = f.malloc(40 * MiB, 0x1);
  f.backend.launch_work();  // a kernel on stream 1 still writes a
  f.free(a);
  const int syncs = f.backend.device_syncs;
  f.empty_cache();  // (the fake throws on an unmap while that kernel may run)
  CHECK(f.backend.device_syncs == syncs + 1);
  CHECK(f.reserved() == 0);
  CHECK(f.stats().num_sync_all_streams >= 1);
}

TEST_CASE("expandable: the out-of-memory retry synchronizes the device before unmapping") {
  AllocFixture f(expandable(), 100 * MiB);
  const DevicePtr a = f.malloc(60 * MiB, 0x1);
  f.backend.launch_work();
  f.free(a);
  f.malloc(60 * MiB, 0x2);  // stream 1's pages go back first, once the device is idle
  CHECK(f.stats().num_alloc_retries >= 1);
  CHECK(f.reserved() == static_cast<std::int64_t>(60 * MiB));
}

TEST_CASE("expandable: nothing to unmap, no synchronization; a failed one keeps the pages") {
  AllocFixture f(expandable(), 1 * GiB);
  const DevicePtr a = f.malloc(10 * MiB);
  f.malloc(5 * MiB);  // shares a's page: nothing whole to unmap once a is free
  f.free(a);
  int syncs = f.backend.device_syncs;
  f.empty_cache();
  CHECK(f.backend.device_syncs == syncs);
  const DevicePtr b = f.malloc(40 * MiB, 0x1);
  f.backend.launch_work();
  f.free(b);
  f.backend.fail_call_at(0);  // the synchronization fails: the device may still use b's pages
  f.empty_cache();
  CHECK(f.backend.fault_fired());
  CHECK(f.reserved() == static_cast<std::int64_t>(60 * MiB));
  CHECK(f.backend.live_mappings() == 2);
  syncs = f.backend.device_syncs;
  f.empty_cache();  // it succeeds now: b's run goes
  CHECK(f.backend.device_syncs == syncs + 1);
  CHECK(f.reserved() == static_cast<std::int64_t>(20 * MiB));
}

Config release_before_peak() {
  Config c = expandable();
  c.release_before_peak = true;
  return c;
}

TEST_CASE("release_before_peak: another stream's free run goes back before the mapped peak would rise") {
  for (const bool on : {false, true}) {
    INFO(on);
    AllocFixture f(on ? release_before_peak() : expandable(), 1 * GiB);
    const DevicePtr a = f.malloc(40 * MiB, 0x1);
    f.backend.launch_work();  // a kernel on stream 1 still uses a
    f.free(a);
    const int syncs = f.backend.device_syncs;
    f.malloc(40 * MiB, 0x2);
    const auto s = f.stats();
    CHECK(f.reserved() == static_cast<std::int64_t>(on ? 40 * MiB : 80 * MiB));
    CHECK(s.reserved_bytes[StatType::aggregate].peak == static_cast<std::int64_t>(on ? 40 * MiB : 80 * MiB));
    CHECK(s.num_peak_releases == (on ? 1 : 0));
    CHECK(s.peak_release_bytes == static_cast<std::int64_t>(on ? 40 * MiB : 0));
    CHECK(f.backend.device_syncs == syncs + (on ? 1 : 0));  // the device first: the kernel may still run
  }
}

TEST_CASE("release_before_peak: nothing goes back below the high-water mark; the smallest run that covers goes first") {
  AllocFixture f(release_before_peak(), 1 * GiB);
  const DevicePtr a = f.malloc(20 * MiB, 0x1);
  const DevicePtr b = f.malloc(60 * MiB, 0x2);
  const DevicePtr d = f.malloc(20 * MiB, 0x4);  // high-water mark 100 MiB
  f.free(a);
  f.free(b);
  f.free(d);
  f.free(f.malloc(10 * MiB, 0x1));  // served from a's run: no grow, nothing released
  CHECK(f.stats().num_peak_releases == 0);
  f.malloc(20 * MiB, 0x3);  // 100 + 20 > 100: a 20 MiB run goes (a's or d's), not b's 60
  CHECK(f.stats().num_peak_releases == 1);
  CHECK(f.stats().peak_release_bytes == static_cast<std::int64_t>(20 * MiB));
  CHECK(f.reserved() == static_cast<std::int64_t>(100 * MiB));
  CHECK(f.backend.live_mappings() == 3);  // b's run, one of a's and d's, the new one
}

Config release_remap() {
  Config c = release_before_peak();
  c.release_remap = true;
  return c;
}

TEST_CASE("release_remap: another stream's free run moves to the grow, with no host wait and no new memory") {
  AllocFixture f(release_remap(), 1 * GiB);
  f.backend.allow_joins(true);
  const DevicePtr a = f.malloc(40 * MiB, 0x1);
  f.backend.launch_work();  // a kernel on stream 1 still uses a
  f.free(a);
  const std::uint64_t freed_at = f.backend.now();
  const int syncs = f.backend.device_syncs, creates = f.backend.alloc_calls;
  const std::size_t used = f.backend.used();
  const DevicePtr b = f.malloc(40 * MiB, 0x2);  // (an unmap under the kernel would throw)
  CHECK(b != a);
  CHECK(f.backend.device_syncs == syncs);  // no host wait
  CHECK(f.backend.alloc_calls == creates);  // a's physical run, mapped again at b
  CHECK(f.backend.used() == used);
  CHECK(f.backend.fence_joins == 1);
  CHECK(f.backend.device_ordered_after(freed_at));  // b's first use runs after a's last
  const auto s = f.stats();
  CHECK(f.reserved() == static_cast<std::int64_t>(40 * MiB));
  CHECK(s.reserved_bytes[StatType::aggregate].peak == static_cast<std::int64_t>(40 * MiB));
  CHECK(s.num_peak_releases == 1);
  CHECK(s.peak_release_bytes == static_cast<std::int64_t>(40 * MiB));
  CHECK(s.num_peak_remaps == 1);
  CHECK(s.peak_remap_bytes == static_cast<std::int64_t>(40 * MiB));
  CHECK(f.backend.mapped(a));  // the old address stays mapped until the fence shows the kernel done

  SECTION("a grow of the donor's stream does not map over the retiring range") {
    const DevicePtr c = f.malloc(40 * MiB, 0x1);  // a new peak, nothing free to take: fresh pages
    CHECK(c != a);
    CHECK(f.backend.mapped(a));
    f.free(c);
  }
  SECTION("the old address goes once the fence completes") {
    f.backend.complete_all_events();
    f.free(f.malloc(1024, 0x3));  // a grow (a small-pool page: no donor there) polls the fences
    CHECK_FALSE(f.backend.mapped(a));
    CHECK(f.backend.used() == used + 2 * MiB);  // a's memory is b's alone now
    const DevicePtr c = f.malloc(40 * MiB, 0x1);  // stream 1's range may be mapped again
    CHECK(c == a);
    // (no free run fits a remap, so the synchronizing path gave stream 3's
    // small page back first)
    CHECK(f.backend.used() == used + 40 * MiB);
    f.free(c);
  }
  SECTION("empty_cache waits for the fence and gives everything free back") {
    f.free(b);
    f.empty_cache();
    CHECK(f.backend.live_mappings() == 0);
    CHECK(f.backend.used() == 0);
  }
}

TEST_CASE("release_remap: a free run of the grow's own reservation moves too") {
  AllocFixture f(release_remap(), 1 * GiB);
  f.backend.allow_joins(true);
  const DevicePtr a = f.malloc(20 * MiB, 0x1);
  const DevicePtr b = f.malloc(20 * MiB, 0x1);  // keeps a from being the free tail
  f.backend.launch_work();                       // a kernel still uses a
  f.free(a);
  const int syncs = f.backend.device_syncs, creates = f.backend.alloc_calls;
  const std::size_t used = f.backend.used();
  const DevicePtr c = f.malloc(40 * MiB, 0x1);  // larger than a: a grow past the high-water mark
  CHECK(c != a);
  CHECK(f.backend.device_syncs == syncs);       // no host wait
  CHECK(f.backend.alloc_calls == creates + 1);  // a's run moved, one fresh page for the rest
  CHECK(f.backend.used() == used + 20 * MiB);
  CHECK(f.reserved() == static_cast<std::int64_t>(60 * MiB));
  CHECK(f.stats().peak_release_bytes == static_cast<std::int64_t>(20 * MiB));
  CHECK(f.stats().peak_remap_bytes == static_cast<std::int64_t>(20 * MiB));
  CHECK(f.backend.mapped(a));  // retiring until the fence shows the kernel done
  f.backend.complete_all_events();
  f.free(f.malloc(1024, 0x3));  // a grow polls the fences
  CHECK_FALSE(f.backend.mapped(a));
  f.free(c);
  f.free(b);
  f.empty_cache();
  CHECK(f.backend.live_mappings() == 0);
  CHECK(f.backend.used() == 0);
}

TEST_CASE("release_remap: where the runs that fit cover less than the synchronizing path gives back, it serves") {
  AllocFixture f(release_remap(), 1 * GiB);
  f.backend.allow_joins(true);
  const DevicePtr a = f.malloc(20 * MiB, 0x1);
  const DevicePtr b = f.malloc(60 * MiB, 0x2);
  f.backend.launch_work();
  f.free(a);
  f.free(b);
  const int syncs = f.backend.device_syncs;
  f.malloc(40 * MiB, 0x3);  // a's 20 MiB fits the grow but leaves it 20 MiB over the mark; b's run covers it
  CHECK(f.backend.device_syncs == syncs + 1);
  CHECK(f.stats().num_peak_remaps == 0);
  CHECK_FALSE(f.backend.mapped(b));
  CHECK(f.reserved() == static_cast<std::int64_t>(60 * MiB));  // the mark: nothing mapped past it
  CHECK(f.stats().reserved_bytes[StatType::aggregate].peak == static_cast<std::int64_t>(80 * MiB));
}

TEST_CASE("release_remap: a run larger than the grow is not moved; the synchronizing path serves") {
  AllocFixture f(release_remap(), 1 * GiB);
  f.backend.allow_joins(true);
  const DevicePtr a = f.malloc(60 * MiB, 0x1);
  f.backend.launch_work();
  f.free(a);
  const int syncs = f.backend.device_syncs;
  f.malloc(20 * MiB, 0x2);  // moving a's 60 MiB would keep 40 MiB more mapped than giving it back
  CHECK(f.backend.device_syncs == syncs + 1);
  CHECK(f.backend.fence_joins == 0);
  CHECK(f.stats().num_peak_releases == 1);
  CHECK(f.stats().num_peak_remaps == 0);
  CHECK_FALSE(f.backend.mapped(a));
  CHECK(f.reserved() == static_cast<std::int64_t>(20 * MiB));
}

TEST_CASE("release_remap: a moved run given back by the synchronizing path frees its memory before the grow maps") {
  AllocFixture f(release_remap(), 1 * GiB);
  f.backend.allow_joins(true);
  const DevicePtr a = f.malloc(40 * MiB, 0x1);
  f.backend.launch_work();
  f.free(a);
  f.free(f.malloc(40 * MiB, 0x2));  // a's run moves there; a's address retires
  REQUIRE(f.stats().num_peak_remaps == 1);
  REQUIRE(f.backend.mapped(a));
  f.malloc(20 * MiB, 0x3);  // the 40 MiB run does not fit a 20 MiB grow: the synchronizing path
  CHECK_FALSE(f.backend.mapped(a));
  CHECK(f.backend.used() == 20 * MiB);  // (the run's memory was gone before the fresh page came)
  CHECK(f.backend.peak_used() == 40 * MiB);
}

TEST_CASE("release_remap: the memory fraction counts the moved runs out first") {
  Config c = release_remap();
  c.per_process_memory_fraction = 0.4;  // 80 of 200 MiB
  AllocFixture f(c, 200 * MiB);
  f.backend.allow_joins(true);
  const DevicePtr a = f.malloc(20 * MiB, 0x1);
  f.malloc(40 * MiB, 0x3);
  f.backend.launch_work();
  f.free(a);
  DevicePtr p = 0;
  CHECK(f.try_malloc(40 * MiB, 0x2, &p) == kSuccess);  // a's run moves, 20 MiB fresh: 80 MiB, the limit
  CHECK(f.stats().num_peak_remaps == 1);
  CHECK(f.reserved() == static_cast<std::int64_t>(80 * MiB));
  CHECK(f.try_malloc(20 * MiB, 0x2, &p) == kOutOfMemory);  // and not past it
}

TEST_CASE("release_remap: without joins, release_before_peak's synchronizing path serves") {
  AllocFixture f(release_remap(), 1 * GiB);  // (the fake refuses joins unless allowed)
  const DevicePtr a = f.malloc(40 * MiB, 0x1);
  f.backend.launch_work();
  f.free(a);
  const int syncs = f.backend.device_syncs;
  f.malloc(40 * MiB, 0x2);
  CHECK(f.backend.device_syncs == syncs + 1);
  CHECK(f.backend.fence_joins == 0);
  CHECK(f.stats().num_peak_releases == 1);
  CHECK_FALSE(f.backend.mapped(a));
}

TEST_CASE("expandable: unmapped holes are mapped again on demand") {
  AllocFixture f(expandable(), 1 * GiB);
  const DevicePtr a = f.malloc(40 * MiB);
  const DevicePtr b = f.malloc(20 * MiB);
  f.free(a);
  f.empty_cache();  // pages 0-1 unmapped, b keeps page 2
  CHECK(f.reserved() == static_cast<std::int64_t>(20 * MiB));
  const DevicePtr c = f.malloc(40 * MiB);
  CHECK(c == a);
  CHECK(f.reserved() == static_cast<std::int64_t>(60 * MiB));
  f.free(b);
  f.free(c);
}

TEST_CASE("expandable: device OOM unmaps other streams' free pages and retries") {
  AllocFixture f(expandable(), 100 * MiB);
  const DevicePtr a = f.malloc(60 * MiB, 0x1);
  f.free(a);
  f.malloc(60 * MiB, 0x2);  // 60 MiB more than the device has: stream 1's pages go first
  CHECK(f.stats().num_alloc_retries >= 1);
  CHECK(f.reserved() == static_cast<std::int64_t>(60 * MiB));
  CHECK(f.stats().num_ooms == 0);
  DevicePtr p = 0;
  CHECK(f.try_malloc(60 * MiB, 0x3, &p) == kOutOfMemory);
  CHECK(f.stats().num_ooms == 1);
}

TEST_CASE("expandable: the memory fraction caps mapped bytes") {
  Config c = expandable();
  c.per_process_memory_fraction = 0.5;
  AllocFixture f(c, 200 * MiB);
  f.malloc(60 * MiB);
  DevicePtr p = 0;
  CHECK(f.try_malloc(60 * MiB, 0, &p) == kOutOfMemory);
  CHECK(f.reserved() == static_cast<std::int64_t>(60 * MiB));
}

TEST_CASE("expandable: a failed page map is rolled back") {
  AllocFixture f(expandable(), 1 * GiB);
  f.backend.fail_next_allocs(1);
  const DevicePtr a = f.malloc(30 * MiB);  // the first page fails to map; the retry maps both
  CHECK(f.backend.used() == static_cast<std::size_t>(f.reserved()));
  CHECK(f.stats().num_alloc_retries == 1);
  f.free(a);
}

TEST_CASE("expandable: a growth of many pages maps runs of up to 64 MiB and grants access once") {
  AllocFixture f(expandable(), 1 * GiB);
  const DevicePtr a = f.malloc(190 * MiB);  // ten 20 MiB pages: runs of 3, 3, 3 and 1
  CHECK(f.reserved() == static_cast<std::int64_t>(200 * MiB));
  CHECK(f.backend.alloc_calls == 4);
  CHECK(f.backend.live_mappings() == 4);
  CHECK(f.stats().num_device_alloc == 4);
  CHECK(f.backend.own_access_calls == 1);
  // Every byte of the growth is accessible (the fake throws otherwise).
  const std::uint64_t first = 0x1234, last = 0x5678;
  f.backend.write(a, &first, sizeof first);
  f.backend.write(a + 190 * MiB - sizeof last, &last, sizeof last);
  std::uint64_t x = 0, y = 0;
  f.backend.read(a, &x, sizeof x);
  f.backend.read(a + 190 * MiB - sizeof y, &y, sizeof y);
  CHECK(x == first);
  CHECK(y == last);
  f.free(a);
  f.empty_cache();
  CHECK(f.backend.live_mappings() == 0);
  CHECK(f.backend.live_handles() == 0);
  CHECK(f.stats().num_device_free == 4);
}

TEST_CASE("expandable: a run holding a live block stays mapped; whole free runs go back") {
  AllocFixture f(expandable(), 1 * GiB);
  const DevicePtr a = f.malloc(60 * MiB);  // pages 0-2: one run
  f.free(a);
  const DevicePtr b = f.malloc(10 * MiB);  // carved from the run's start
  const DevicePtr c = f.malloc(60 * MiB);  // the run's 50 free MiB + page 3, its own run
  CHECK(b == a);
  CHECK(c == a + 10 * MiB);
  f.free(c);
  // 50 free MiB hold two whole pages (1 and 2) and page 3, but only page 3
  // is a whole run: pages 1-2 share their run with b.
  CHECK(f.alloc->releasable_bytes() == 20 * MiB);
  f.empty_cache();
  CHECK(f.reserved() == static_cast<std::int64_t>(60 * MiB));
  CHECK(f.backend.live_mappings() == 1);
  f.free(b);
  f.empty_cache();
  CHECK(f.reserved() == 0);
  CHECK(f.backend.used() == 0);
}

TEST_CASE("expandable: a run that fails to map mid-growth rolls back the runs before it") {
  AllocFixture f(expandable(), 1 * GiB);
  const DevicePtr keep = f.malloc(10 * MiB);  // a first run, which must survive
  f.backend.fail_call_at(4);  // create, map (run 1), create, map (run 2), create (run 3): fails
  DevicePtr p = 0;
  const Status st = f.try_malloc(190 * MiB, 0, &p);  // 180 more MiB: runs of 3, 3 and 3 pages
  CHECK(f.backend.fault_fired());
  if (st == kSuccess) f.free(p);  // the out-of-memory retry may succeed; either way nothing leaks
  f.empty_cache();
  CHECK(f.backend.live_mappings() == 1);
  CHECK(f.backend.used() == 20 * MiB);
  CHECK(f.reserved() == static_cast<std::int64_t>(20 * MiB));
  f.free(keep);
}

TEST_CASE("expandable: a failed access grant unmaps the whole growth") {
  AllocFixture f(expandable(), 1 * GiB);
  f.backend.fail_call_at(4);  // create, map (3 pages), create, map (2 pages), then the grant fails
  DevicePtr p = 0;
  const Status st = f.try_malloc(100 * MiB, 0, &p);
  CHECK(st != kSuccess);
  CHECK(f.backend.fault_fired());
  if (st == kSuccess) f.free(p);
  f.empty_cache();
  CHECK(f.backend.live_mappings() == 0);
  CHECK(f.backend.used() == 0);
}

namespace {

struct ScriptOutcome {
  std::int64_t peak;
  std::int64_t remaps;
  int syncs;
};

// A multi-stream script the same whatever the allocator answers (blocks
// are picked by their position in the live list, never by address):
// streams allocating and freeing blocks of 1-96 MiB, events completing now
// and then; with `kernels`, a kernel left running on a third of the new
// blocks (the fake throws where pages a running kernel uses are unmapped).
ScriptOutcome run_stream_script(std::uint64_t seed, bool remap, bool kernels) {
  Config c = release_before_peak();
  c.release_remap = remap;
  AllocFixture f(c, 8 * GiB);  // (room for every seed's peak: no OOM)
  f.backend.allow_joins(true);
  std::mt19937_64 rng(seed);
  std::vector<DevicePtr> live;
  // (the allocator is called directly and validated every 20 steps: 80
  // runs of the script stay within the unit suite's time under TSan)
  for (int step = 0; step < 400; ++step) {
    const unsigned op = rng() % 10;
    if (op < 5 || live.empty()) {
      const std::size_t size = (rng() % 2 ? 1 * MiB : 20 * MiB) + rng() % (76 * MiB);
      DevicePtr p = 0;
      REQUIRE(f.alloc->malloc(&p, size, 0x1 + rng() % 4) == kSuccess);
      live.push_back(p);
      if (kernels && rng() % 3 == 0) f.backend.launch_work_on(p, size);
    } else if (op < 9) {
      const std::size_t i = rng() % live.size();
      REQUIRE(f.alloc->free(live[i]) == kSuccess);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      f.backend.complete_all_events();
    }
    if (step % 20 == 19) f.alloc->validate();
  }
  const DeviceStats s = f.stats();
  for (DevicePtr p : live) f.free(p);
  f.empty_cache();  // (waits for the device first)
  return {s.reserved_bytes[StatType::aggregate].peak, s.num_peak_remaps, f.backend.device_syncs};
}

}  // namespace

// Run by run the two paths diverge (what one keeps mapped, the other gave
// back), so single peaks differ either way, by up to 8 % here; summed over
// the seeds release_remap must peak no higher, with fewer syncs in every
// run.  Without kernels: 0.991 of the peaks, 0.50 of the syncs (472285d's
// rule, any run that fits, gave 1.004 and fails).  With kernels running on
// blocks: 0.994 and 0.53, and no unmap under a running kernel.
TEST_CASE("release_remap: a multi-stream script peaks where the synchronizing path peaks, with fewer syncs") {
  for (const bool kernels : {false, true}) {
    std::int64_t sync_total = 0, moved_total = 0;
    for (std::uint64_t seed = 1; seed <= 20; ++seed) {
      const ScriptOutcome sync = run_stream_script(seed, false, kernels);
      const ScriptOutcome moved = run_stream_script(seed, true, kernels);
      INFO("kernels " << kernels << ", seed " << seed << ": peak " << sync.peak / MiB << " vs " << moved.peak / MiB
                      << " MiB, syncs " << sync.syncs << " vs " << moved.syncs << ", remaps " << moved.remaps);
      CHECK(moved.remaps > 0);
      CHECK(moved.syncs < sync.syncs);
      CHECK(moved.peak * 10 <= sync.peak * 11);
      sync_total += sync.peak;
      moved_total += moved.peak;
    }
    INFO("kernels " << kernels);
    CHECK(moved_total <= sync_total);
  }
}
