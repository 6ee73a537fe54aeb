// test_thread_cache.cpp — the per-thread front caches (core/thread_cache.h):
// what a cached block is for the program (freed, fresh identity when handed
// out again), exact statistics, stream keys, flushes (empty_cache, a miss
// that would grow, thread exit, the allocator's death), detaching by
// record_stream and by frees from other threads, and threads hammering one
// allocator while validate() runs beside them; fenced frees (point (g)):
// waiting in the cache behind the thread's own fences, checked by the reuse
// oracle.  validate() after each step.
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "alloc_fixture.h"
#include "reuse_oracle.h"

using namespace cachalloc;
using namespace cachalloc::testing;

namespace {

constexpr StreamId kS = 7;

DevicePtr cached_malloc(AllocFixture& f, std::size_t size, StreamId stream = kS) {
  DevicePtr p = 0;
  REQUIRE(f.alloc->front().malloc_cached(&p, size, stream));
  f.alloc->validate();
  return p;
}

void cached_free(AllocFixture& f, DevicePtr p, StreamId stream = kAnyStream) {
  REQUIRE(f.alloc->front().free_cached(p, stream) == kSuccess);
  f.alloc->validate();
}

AddressInfo query(AllocFixture& f, DevicePtr p) {
  AddressInfo info;
  REQUIRE(f.alloc->query(p, &info) == kSuccess);
  return info;
}

std::int64_t agg(const StatArray& a, bool peak = false) {
  return peak ? a[StatType::aggregate].peak : a[StatType::aggregate].current;
}

// Runs worker(0 .. n-1) on n threads while another thread runs validate()
// and stats() all the while; an invariant broken counts in `errors`.
template <class Worker>
void run_checked(AllocFixture& f, int n, Worker& worker, std::atomic<int>& errors) {
  std::atomic<bool> done{false};
  std::thread checker([&] {
    while (!done.load()) {
      try {
        f.alloc->validate();
        (void)f.alloc->stats();
      } catch (const InvariantError& e) {
        FAIL_CHECK(e.what());
        ++errors;
      }
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back(worker, i);
  for (auto& t : threads) t.join();
  done = true;
  checker.join();
}

}  // namespace

TEST_CASE("a freed block waits in the thread's cache and comes back with a fresh identity") {
  AllocFixture f;
  const DevicePtr p = f.malloc(1000, kS);
  const std::uint64_t first_id = query(f, p).id;
  cached_free(f, p);
  // Freed in the program's view: no live range, not live, not listed.
  CHECK_FALSE(query(f, p).live);
  CHECK_FALSE(f.alloc->is_live(p));
  CHECK(f.alloc->live_block_addresses().empty());
  CHECK(agg(f.stats().allocated_bytes) == 0);
  CHECK(agg(f.stats().allocation) == 0);
  CHECK(agg(f.stats().active) == 0);
  CHECK(agg(f.stats().requested_bytes) == 0);
  // A double free is refused and changes nothing.
  CHECK(f.alloc->front().free_cached(p, kAnyStream) == kInvalidValue);
  CHECK(f.alloc->free(p) == kInvalidValue);
  f.alloc->validate();

  const DevicePtr q = cached_malloc(f, 700);
  CHECK(q == p);
  const AddressInfo info = query(f, q);
  CHECK(info.live);
  CHECK(info.requested == 700);
  CHECK(info.id != first_id);
  CHECK(f.alloc->is_live(q));
  CHECK(agg(f.stats().allocated_bytes) == 1024);
  CHECK(agg(f.stats().requested_bytes) == 700);
  // Past the new requested size the driver would say "not allocated".
  AddressInfo tail;
  REQUIRE(f.alloc->query(q + 800, &tail) == kSuccess);
  CHECK_FALSE(tail.live);
  cached_free(f, q);
  CHECK_FALSE(query(f, q).live);
}

TEST_CASE("thread-cached pairs keep the statistics exact") {
  AllocFixture f;
  const DevicePtr big = f.malloc(4 * MiB, kS);
  const DevicePtr p = f.malloc(512, kS);
  cached_free(f, p);
  constexpr int kPairs = 3000;  // more than one id reservation
  for (int i = 0; i < kPairs; ++i) {
    INFO("pair " << i);
    const DevicePtr q = cached_malloc(f, 100 + i % 400);
    cached_free(f, q);
  }
  const DeviceStats s = f.stats();
  const Stat& alloc = s.allocation[StatType::aggregate];
  CHECK(alloc.current == 1);
  CHECK(alloc.allocated == kPairs + 2);
  CHECK(alloc.freed == kPairs + 1);
  CHECK(agg(s.allocated_bytes) == static_cast<std::int64_t>(4 * MiB));
  // One thread: the peak is exact (the big block plus one small block).
  CHECK(agg(s.allocated_bytes, true) == static_cast<std::int64_t>(4 * MiB + 512));
  CHECK(agg(s.active_bytes, true) == static_cast<std::int64_t>(4 * MiB + 512));
  CHECK(s.requested_bytes[StatType::aggregate].allocated ==
        static_cast<std::int64_t>(4 * MiB + 512) + [] {
          std::int64_t t = 0;
          for (int i = 0; i < kPairs; ++i) t += 100 + i % 400;
          return t;
        }());
  // Resets see the caches' deltas merged first.
  f.alloc->reset_peak_stats();
  f.alloc->reset_accumulated_stats();
  f.alloc->validate();
  CHECK(agg(f.stats().allocated_bytes, true) == static_cast<std::int64_t>(4 * MiB));
  const DevicePtr q = cached_malloc(f, 512);
  CHECK(f.stats().allocation[StatType::aggregate].allocated == 1);
  CHECK(agg(f.stats().allocated_bytes, true) == static_cast<std::int64_t>(4 * MiB + 512));
  cached_free(f, q);
  f.free(big);
}

TEST_CASE("a cached block is reused only on the stream it was freed safe for") {
  AllocFixture f;
  const DevicePtr p = f.malloc(512, kS);
  cached_free(f, p);
  DevicePtr q = 0;
  CHECK_FALSE(f.alloc->front().malloc_cached(&q, 512, kS + 1));
  CHECK_FALSE(f.alloc->front().malloc_cached(&q, 2048, kS));  // another size: a miss
  f.alloc->validate();
  CHECK(cached_malloc(f, 512, kS) == p);
  // A free naming another stream is no immediately safe free: it waits for
  // that stream (an event), not in the cache.
  CHECK(f.alloc->front().free_cached(p, kS + 1) == kSuccess);
  f.alloc->validate();
  CHECK_FALSE(f.alloc->front().malloc_cached(&q, 512, kS));
  CHECK(f.backend.live_events() >= 1);
}

// The bin walk looks at a few blocks only (ThreadCache::take): with five or
// more blocks of other streams ahead of the one it would want, the walk
// ends on another stream's block, and that block must not be handed out
// (another stream may still use it: no event orders the two).
TEST_CASE("a size bin led by five or more blocks of other streams never hands one of them out") {
  for (int ahead : {4, 5, 6, 9}) {
    INFO(ahead << " blocks of other streams ahead in the bin");
    AllocFixture f;
    std::map<DevicePtr, StreamId> stream_of;
    const DevicePtr mine = f.malloc(512, kS);  // the oldest in the bin
    stream_of[mine] = kS;
    std::vector<DevicePtr> others;
    for (int i = 0; i < ahead; ++i) {
      const StreamId s = kS + 1 + static_cast<StreamId>(i);
      const DevicePtr p = f.malloc(512, s);
      stream_of[p] = s;
      others.push_back(p);
    }
    cached_free(f, mine);
    for (DevicePtr p : others) cached_free(f, p);  // each freed safe for its own stream
    // A stream with no cached block: always a miss, however long the bin.
    DevicePtr q = 0;
    CHECK_FALSE(f.alloc->front().malloc_cached(&q, 512, kS + 100));
    f.alloc->validate();
    // kS: its own block or a miss, never another stream's.
    if (f.alloc->front().malloc_cached(&q, 512, kS)) {
      CHECK(stream_of.at(q) == kS);
      cached_free(f, q);
    }
    f.alloc->validate();
    // Each other stream: its own block (the newest ones lie within the walk).
    for (auto it = others.rbegin(); it != others.rend(); ++it) {
      const StreamId s = stream_of.at(*it);
      if (f.alloc->front().malloc_cached(&q, 512, s)) {
        CHECK(stream_of.at(q) == s);
        CHECK(q == *it);
      }
      f.alloc->validate();
    }
  }
}

// A destroyed stream's handle may come back for a stream created later,
// which would reuse "in stream order" what the old one freed while its last
// work still runs (DESIGN.md, retire_stream).  A block the thread's cache
// holds for the old stream waits for that work like a pooled one.
TEST_CASE("a retired stream's blocks in a thread's cache wait for its last work") {
  AllocFixture f;
  const DevicePtr p = f.malloc(512, kS);
  cached_free(f, p);
  REQUIRE(f.alloc->retire_stream(kS) == kSuccess);
  f.alloc->validate();
  // A new stream with the old handle: not the block, by the cache or the core.
  DevicePtr q = 0;
  if (f.alloc->front().malloc_cached(&q, 512, kS)) CHECK(q != p);
  f.alloc->validate();
  const DevicePtr r = f.malloc(512, kS);
  CHECK(r != p);
  // Once the old stream's work is done (its event), the block is reusable.
  f.backend.complete_events_on(kS);
  bool reused = false;
  for (int i = 0; i < 8192 && !reused; ++i) reused = f.malloc(512, kS) == p;  // (best fit may pick r's segment first)
  CHECK(reused);
}

TEST_CASE("record_stream and export turn a handed-out block into a plain one") {
  AllocFixture f;
  const DevicePtr p = f.malloc(512, kS);
  cached_free(f, p);
  const DevicePtr q = cached_malloc(f, 512);
  REQUIRE(f.alloc->record_stream(q, kS + 1) == kSuccess);
  f.alloc->validate();
  cached_free(f, q);  // waits for stream kS+1: not cached
  DevicePtr r = 0;
  CHECK_FALSE(f.alloc->front().malloc_cached(&r, 512, kS));

  const DevicePtr a = f.malloc(512, kS);
  cached_free(f, a);
  const DevicePtr b = cached_malloc(f, 512);
  REQUIRE(f.alloc->mark_exported(b, query(f, b).id) == kSuccess);
  f.alloc->validate();
  cached_free(f, b);  // exported: retained, never cached
  CHECK_FALSE(f.alloc->front().malloc_cached(&r, 512, kS));
}

TEST_CASE("empty_cache, snapshots and a miss that would grow flush the caches") {
  SECTION("empty_cache") {
    AllocFixture f;
    const DevicePtr p = f.malloc(512, kS);
    cached_free(f, p);
    CHECK(f.reserved() > 0);
    f.empty_cache();
    CHECK(f.reserved() == 0);
    DevicePtr q = 0;
    CHECK_FALSE(f.alloc->front().malloc_cached(&q, 512, kS));
  }
  SECTION("a miss that would grow") {
    AllocFixture f(Config{}, 2 * MiB);  // one small segment
    std::vector<DevicePtr> blocks;
    for (int i = 0; i < 32; ++i) blocks.push_back(f.malloc(64 * KiB, kS));
    // The cache takes 1 MiB (its default bound), the rest goes to the pool.
    for (DevicePtr p : blocks) cached_free(f, p);
    CHECK(f.stats().allocated_bytes[StatType::aggregate].current == 0);
    const DevicePtr a = f.malloc(1 * MiB, kS);
    const DevicePtr b = f.malloc(1 * MiB, kS);  // only the cached blocks, merged, can serve it
    CHECK(a != b);
    CHECK(f.stats().num_device_alloc == 1);
    f.free(a);
    f.free(b);
  }
  SECTION("a snapshot shows the cache's blocks as the program holds them") {
    AllocFixture f;
    const DevicePtr p = f.malloc(512, kS);
    const DevicePtr keep = f.malloc(512, kS);
    cached_free(f, p);
    const DevicePtr q = cached_malloc(f, 300);
    const DevicePtr r = f.malloc(512, kS);
    cached_free(f, r);
    bool seen_q = false;
    for (const SegmentInfo& seg : f.alloc->snapshot())
      for (const auto& b : seg.blocks) {
        if (b.ptr == q) seen_q = b.state == BlockState::allocated && b.requested == 300;
        if (b.ptr == r) CHECK(b.state != BlockState::allocated);
      }
    CHECK(seen_q);
    f.alloc->validate();
    f.free(q);
    f.free(keep);
  }
}

TEST_CASE("a free from another thread takes a handed-out block back through the lock") {
  AllocFixture f;
  const DevicePtr p = f.malloc(512, kS);
  cached_free(f, p);
  const DevicePtr q = cached_malloc(f, 512);
  std::thread([&] { CHECK(f.alloc->front().free_cached(q, kAnyStream) == kSuccess); }).join();
  f.alloc->validate();
  CHECK_FALSE(query(f, q).live);
  // The owner's cache no longer lists it: a second free is a double free.
  CHECK(f.alloc->front().free_cached(q, kAnyStream) == kInvalidValue);
  f.alloc->validate();
  CHECK(agg(f.stats().allocation) == 0);
}

TEST_CASE("a thread's cache goes back at its exit") {
  AllocFixture f;
  const DevicePtr keep = f.malloc(512, kS);
  DevicePtr handed = 0;
  std::thread([&] {
    const DevicePtr p = f.malloc(512, kS);
    REQUIRE(f.alloc->front().free_cached(p, kAnyStream) == kSuccess);
    REQUIRE(f.alloc->front().malloc_cached(&handed, 512, kS));  // still live at exit: the program's
    const DevicePtr r = f.malloc(2048, kS);
    REQUIRE(f.alloc->front().free_cached(r, kAnyStream) == kSuccess);
  }).join();
  f.alloc->validate();
  CHECK(query(f, handed).live);
  CHECK(agg(f.stats().allocated_bytes) == 1024);
  f.free(handed);  // a plain live block now
  f.free(keep);
  f.empty_cache();
  CHECK(f.reserved() == 0);
}

TEST_CASE("a cache never outlives its allocator") {
  std::atomic<int> step{0};
  auto f = std::make_unique<AllocFixture>();
  std::thread t([&] {
    const DevicePtr p = f->malloc(512, kS);
    REQUIRE(f->alloc->front().free_cached(p, kAnyStream) == kSuccess);
    step = 1;
    while (step.load() != 2) std::this_thread::yield();
    // A new allocator (perhaps at the old one's address): no cache yet.
    DevicePtr q = 0;
    CHECK_FALSE(f->alloc->front().malloc_cached(&q, 512, kS));
    const DevicePtr r = f->malloc(512, kS);
    REQUIRE(f->alloc->front().free_cached(r, kAnyStream) == kSuccess);
    CHECK(f->alloc->front().malloc_cached(&q, 512, kS));
    CHECK(q == r);
    REQUIRE(f->alloc->front().free_cached(q, kAnyStream) == kSuccess);
    step = 3;
    while (step.load() != 4) std::this_thread::yield();
  });
  while (step.load() != 1) std::this_thread::yield();
  f->alloc->validate();
  f->alloc.reset();  // the cache gives its block back and forgets it
  CHECK(f->backend.live_segments() == 0);
  f->alloc = std::make_unique<CachingAllocator>(&f->backend, Config{});
  step = 2;
  while (step.load() != 3) std::this_thread::yield();
  f->alloc->validate();
  f->alloc.reset();  // destroyed while the thread still runs
  step = 4;
  t.join();  // its exit touches no dead allocator (ASan/TSan builds check)
}

TEST_CASE("thread_cache_kb:0 turns the layer off") {
  Config c;
  c.thread_cache_bytes = 0;
  AllocFixture f(c);
  const DevicePtr p = f.malloc(512, kS);
  REQUIRE(f.alloc->front().free_cached(p, kAnyStream) == kSuccess);
  f.alloc->validate();
  DevicePtr q = 0;
  CHECK_FALSE(f.alloc->front().malloc_cached(&q, 512, kS));
  CHECK(agg(f.stats().allocation) == 0);
}

TEST_CASE("threads hammer one allocator through their caches while validate() runs") {
  AllocFixture f;
  constexpr int kThreads = 4;
  std::atomic<int> errors{0};
  // Blocks handed from one thread to the next, freed there (cross-thread).
  std::mutex hand_mutex;
  std::vector<DevicePtr> handed;
  auto worker = [&](int id) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(id) * 104729 + 1);
    std::vector<DevicePtr> mine;
    const StreamId stream = 100 + static_cast<StreamId>(id % 2);
    for (int i = 0; i < 6000; ++i) {
      const unsigned op = rng() % 10;
      if (mine.empty() || op < 5) {
        const std::size_t size = 1 + rng() % (rng() % 8 == 0 ? 256 * KiB : 8 * KiB);
        DevicePtr p = 0;
        if (!f.alloc->front().malloc_cached(&p, size, stream) && f.alloc->malloc(&p, size, stream) != kSuccess) {
          ++errors;
          continue;
        }
        AddressInfo info;
        if (f.alloc->query(p, &info) != kSuccess || !info.live || info.requested != size) ++errors;
        mine.push_back(p);
      } else if (op == 5) {
        std::lock_guard g(hand_mutex);
        handed.push_back(mine.back());
        mine.pop_back();
      } else if (op == 6) {
        DevicePtr p = 0;
        {
          std::lock_guard g(hand_mutex);
          if (!handed.empty()) {
            p = handed.back();
            handed.pop_back();
          }
        }
        if (p != 0 && f.alloc->front().free_cached(p, kAnyStream) != kSuccess) ++errors;
      } else {
        const std::size_t k = rng() % mine.size();
        if (f.alloc->front().free_cached(mine[k], rng() % 4 == 0 ? stream : kAnyStream) != kSuccess) ++errors;
        mine[k] = mine.back();
        mine.pop_back();
      }
      if (i % 1000 == 999 && id == 0) f.alloc->empty_cache();
    }
    for (DevicePtr p : mine)
      if (f.alloc->front().free_cached(p, kAnyStream) != kSuccess) ++errors;
  };
  run_checked(f, kThreads, worker, errors);
  for (DevicePtr p : handed) REQUIRE(f.alloc->front().free_cached(p, kAnyStream) == kSuccess);
  f.alloc->validate();
  CHECK(errors.load() == 0);
  const DeviceStats s = f.stats();
  CHECK(agg(s.allocation) == 0);
  CHECK(agg(s.allocated_bytes) == 0);
  CHECK(agg(s.requested_bytes) == 0);
  CHECK(s.allocation[StatType::aggregate].allocated == s.allocation[StatType::aggregate].freed);
  f.empty_cache();
  CHECK(f.reserved() == 0);
}

// ------------------------------------------------------------ fenced frees

namespace {

// A fenced free (a plain cuMemFree with non-blocking streams alive) through
// the thread's cache, told to the oracle first.
void fenced_free(AllocFixture& f, ReuseOracle& oracle, DevicePtr p, std::size_t size) {
  oracle.freeing_deferred(p, size, kS);
  REQUIRE(f.alloc->front().free_cached_fenced(p) == kSuccess);
  f.alloc->validate();
}

// An allocation through the cache or the allocator, checked by the oracle.
DevicePtr checked_malloc(AllocFixture& f, ReuseOracle& oracle, std::size_t size, bool* from_cache = nullptr) {
  DevicePtr p = 0;
  const bool cached = f.alloc->front().malloc_cached(&p, size, kS);
  if (!cached) REQUIRE(f.alloc->malloc(&p, size, kS) == kSuccess);
  f.alloc->validate();
  INFO(oracle.check(p, size, kS));
  CHECK(oracle.check(p, size, kS).empty());
  if (from_cache != nullptr) *from_cache = cached;
  return p;
}

}  // namespace

TEST_CASE("a fenced free waits in the thread's cache: freed for the program, reused only after its fence") {
  AllocFixture f;
  ReuseOracle oracle{f.backend};
  const DevicePtr p = f.malloc(1000, kS);
  fenced_free(f, oracle, p, 1024);
  CHECK(f.backend.fence_records == 0);  // one free: no fence yet, no driver call
  // Freed for the program; still active and deferred, as the core's own.
  CHECK_FALSE(query(f, p).live);
  CHECK_FALSE(f.alloc->is_live(p));
  CHECK(agg(f.stats().allocation) == 0);
  CHECK(agg(f.stats().allocated_bytes) == 0);
  CHECK(agg(f.stats().active) == 1);
  CHECK(agg(f.stats().active_bytes) == 1024);
  CHECK(f.stats().deferred_free_bytes.current == 1024);
  CHECK(f.stats().num_deferred_frees == 1);
  // A double free is refused and changes nothing.
  CHECK(f.alloc->front().free_cached_fenced(p) == kInvalidValue);
  CHECK(f.alloc->free(p) == kInvalidValue);
  f.alloc->validate();

  // Pairs: each allocation misses (everything waits), each free waits; the
  // batch's last free (kMinBatch: the fake's fences take one event) records
  // the thread's fence.
  std::vector<DevicePtr> seen{p};
  while (f.backend.fence_records == 0) {
    bool from_cache = true;
    const DevicePtr q = checked_malloc(f, oracle, 1000, &from_cache);
    CHECK_FALSE(from_cache);
    CHECK(std::find(seen.begin(), seen.end(), q) == seen.end());
    seen.push_back(q);
    fenced_free(f, oracle, q, 1024);
    REQUIRE(seen.size() <= ThreadCache::kMinBatch);
  }
  CHECK(seen.size() == ThreadCache::kMinBatch);
  CHECK(f.stats().num_fences == 1);
  CHECK(f.stats().deferred_free_bytes.current == static_cast<std::int64_t>(ThreadCache::kMinBatch * 1024));
  // Not complete: a miss polls it and takes the allocator's path.
  const DevicePtr fresh = checked_malloc(f, oracle, 1000);
  CHECK(std::find(seen.begin(), seen.end(), fresh) == seen.end());
  // Complete: the next miss moves the batch into the bins and reuses one.
  f.backend.complete_all_events();
  bool from_cache = false;
  const DevicePtr again = checked_malloc(f, oracle, 1000, &from_cache);
  CHECK(from_cache);
  CHECK(std::find(seen.begin(), seen.end(), again) != seen.end());
  CHECK(oracle.waited_reuses() >= 1);
  CHECK(f.stats().deferred_free_bytes.current == 0);
  CHECK(agg(f.stats().active) == 2);  // fresh and again
  fenced_free(f, oracle, again, 1024);
  fenced_free(f, oracle, fresh, 1024);
  f.backend.complete_all_events();
  f.empty_cache();
  CHECK(f.reserved() == 0);
  CHECK(f.stats().deferred_free_bytes.current == 0);
}

// Fenced pairs until the thread records a fence: how many frees that took.
std::size_t frees_until_fence(AllocFixture& f, ReuseOracle& oracle) {
  const auto records = f.backend.fence_records;
  std::size_t frees = 0;
  while (f.backend.fence_records == records) {
    fenced_free(f, oracle, checked_malloc(f, oracle, 1000), 1024);
    REQUIRE(++frees <= 4 * ThreadCache::kMinBatch);
  }
  return frees;
}

TEST_CASE("a thread's fence batch grows with the threads that have caches, and shrinks as they go") {
  AllocFixture f;
  ReuseOracle oracle{f.backend};
  std::atomic<int> stage{0};
  std::thread other([&] {  // a second cache of this allocator, alive until stage 2
    const DevicePtr p = f.malloc(512, kS);
    REQUIRE(f.alloc->front().free_cached(p, kAnyStream) == kSuccess);
    stage = 1;
    while (stage.load() != 2) std::this_thread::yield();
  });
  while (stage.load() != 1) std::this_thread::yield();
  fenced_free(f, oracle, f.malloc(1000, kS), 1024);  // this thread's cache: two now
  CHECK(frees_until_fence(f, oracle) + 1 == 2 * ThreadCache::kMinBatch);
  stage = 2;
  other.join();  // its cache retired: one left
  f.alloc->validate();
  f.backend.complete_all_events();
  CHECK(frees_until_fence(f, oracle) == ThreadCache::kMinBatch);
  f.backend.complete_all_events();
  f.empty_cache();
  CHECK(f.reserved() == 0);
}

TEST_CASE("a fence is due after an eighth of the cache's bytes wait, for large blocks") {
  Config cfg;
  cfg.thread_cache_bytes = 512 * KiB;  // an eighth: one 64 KiB block
  AllocFixture f(cfg);
  ReuseOracle oracle{f.backend};
  const DevicePtr a = checked_malloc(f, oracle, 64 * KiB);
  fenced_free(f, oracle, a, 64 * KiB);
  CHECK(f.backend.fence_records == 1);
  CHECK(f.stats().num_fences == 1);
}

TEST_CASE("flushes hand waiting and fenced blocks to the core's deferred list, still covered") {
  AllocFixture f;
  ReuseOracle oracle{f.backend};
  constexpr std::size_t kBlocks = ThreadCache::kMinBatch + 5;  // a batch behind the thread's fence, 5 waiting
  std::vector<DevicePtr> blocks;
  for (std::size_t i = 0; i < kBlocks; ++i) blocks.push_back(checked_malloc(f, oracle, 2000));
  for (DevicePtr p : blocks) fenced_free(f, oracle, p, 2048);
  CHECK(f.backend.fence_records == 1);
  const std::int64_t deferred = f.stats().deferred_free_bytes.current;
  CHECK(deferred == static_cast<std::int64_t>(kBlocks * 2048));
  // Still deferred (the thread's fence was destroyed; the core fences them
  // again), never handed out before a fence recorded after them completes.
  SECTION("a snapshot") {
    (void)f.alloc->snapshot();
    CHECK(f.stats().deferred_free_bytes.current == deferred);
  }
  SECTION("a stream retired") {
    REQUIRE(f.alloc->retire_stream(kS) == kSuccess);
    CHECK(f.stats().deferred_free_bytes.current == deferred);
  }
  SECTION("empty_cache (waits for every fence: nothing deferred is left)") {
    f.alloc->empty_cache();
    CHECK(f.stats().deferred_free_bytes.current == 0);
  }
  f.alloc->validate();
  CHECK(f.stats().num_deferred_frees == static_cast<std::int64_t>(kBlocks));
  for (std::size_t i = 0; i < kBlocks + 5; ++i) checked_malloc(f, oracle, 2000);
  f.backend.complete_all_events();
  for (std::size_t i = 0; i < kBlocks + 5; ++i) checked_malloc(f, oracle, 2000);
}

TEST_CASE("without a fence the waiting blocks wait (capture) or go to the core (failure)") {
  AllocFixture f;
  ReuseOracle oracle{f.backend};
  constexpr std::size_t kBlocks = ThreadCache::kMinBatch;  // a fence is due at the last free
  std::vector<DevicePtr> blocks;
  for (std::size_t i = 0; i < kBlocks; ++i) blocks.push_back(checked_malloc(f, oracle, 3000));
  SECTION("fences refused (a capture in flight): the blocks keep waiting in the cache") {
    f.backend.refuse_fences(true);
    for (DevicePtr p : blocks) fenced_free(f, oracle, p, 3072);
    CHECK(f.stats().num_fences == 0);
    for (int i = 0; i < 5; ++i) {
      bool from_cache = true;
      checked_malloc(f, oracle, 3000, &from_cache);
      CHECK_FALSE(from_cache);
    }
    f.backend.refuse_fences(false);
  }
  SECTION("the fence's record fails: the blocks join the core's deferred list") {
    f.backend.fail_next_records(1000);
    for (DevicePtr p : blocks) fenced_free(f, oracle, p, 3072);
    CHECK(f.backend.fence_records >= 1);  // tried, failed: handed over, still deferred
    CHECK(f.stats().num_fences == 0);
    CHECK(f.stats().deferred_free_bytes.current == static_cast<std::int64_t>(kBlocks * 3072));
    f.backend.fail_next_records(0);
  }
  for (std::size_t i = 0; i < kBlocks + 20; ++i) checked_malloc(f, oracle, 3000);
  f.backend.complete_all_events();
  for (std::size_t i = 0; i < kBlocks + 20; ++i) checked_malloc(f, oracle, 3000);
}

TEST_CASE("threads pair fenced frees through their caches while validate() runs") {
  AllocFixture f;
  f.backend.set_auto_complete(true);
  constexpr int kThreads = 4;
  std::atomic<int> errors{0};
  auto worker = [&](int id) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(id) * 7919 + 3);
    std::vector<DevicePtr> mine;
    for (int i = 0; i < 5000; ++i) {
      if (mine.empty() || rng() % 2 == 0) {
        const std::size_t size = 1 + rng() % (rng() % 8 == 0 ? 128 * KiB : 8 * KiB);
        DevicePtr p = 0;
        if (!f.alloc->front().malloc_cached(&p, size, kS) && f.alloc->malloc(&p, size, kS) != kSuccess) {
          ++errors;
          continue;
        }
        mine.push_back(p);
      } else {
        const std::size_t k = rng() % mine.size();
        const Status st = rng() % 3 == 0 ? f.alloc->front().free_cached(mine[k], kAnyStream) : f.alloc->front().free_cached_fenced(mine[k]);
        if (st != kSuccess) ++errors;
        mine[k] = mine.back();
        mine.pop_back();
      }
      if (i % 1000 == 999 && id == 0) f.alloc->empty_cache();
    }
    for (DevicePtr p : mine)
      if (f.alloc->front().free_cached_fenced(p) != kSuccess) ++errors;
  };
  run_checked(f, kThreads, worker, errors);
  f.alloc->validate();
  CHECK(errors.load() == 0);
  const DeviceStats s = f.stats();
  CHECK(agg(s.allocation) == 0);
  CHECK(agg(s.allocated_bytes) == 0);
  CHECK(s.num_fences >= 1);
  f.empty_cache();
  CHECK(f.reserved() == 0);
  CHECK(f.stats().deferred_free_bytes.current == 0);
}
