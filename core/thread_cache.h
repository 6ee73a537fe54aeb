// thread_cache.h — per-thread front caches: a cached pair without the
// allocator's lock.
//
// Many host threads allocating from one context all took its one mutex
// (caching_allocator.h) and shared its cache lines, so aggregate throughput
// fell as threads were added.  Like mimalloc's per-thread heaps and
// tcmalloc's per-CPU caches, each thread now owns a small front cache per
// allocator (CACHALLOC_CONF thread_cache_kb, bytes per thread and context;
// 0 = off).  Its own lock is taken by its thread on every operation and by
// other threads only on rare paths (flushes, statistics, queries,
// validate()), so it is never contended in the common case and its cache
// lines stay with its thread.
//
// Ownership.  A block is "thread-owned" (Block::tc != nullptr) from the
// moment its thread's free adopts it (Front::adopt, under the allocator's
// lock) until a flush or detach gives it back (also under that lock).
// While thread-owned it is, for the core, an allocated block
// (Block::is_allocated()), in the live map, never split, merged or pooled.
// Its phase (block.h) tracks its program-level state, changed by the owner
// under the thread cache's lock:
//   * tc_cached: freed in the program's view, in a bin of the cache, ready
//     to be handed out again to the owning thread;
//   * tc_out: handed out again by the cache, live for the program, listed
//     in the cache's out map for the owner's next free.
//
// Correctness points (docs/DESIGN.md, "Per-thread front caches"):
//  (a) Freed means freed: query() / is_live() / live_block_addresses()
//      read the phase under the cache's lock, so pointer attributes, address
//      ranges and IPC answer "not allocated" for a cached block.  A handout
//      writes a fresh id (from a range reserved under the allocator's lock,
//      unique per allocator) and the new requested size under the cache's
//      lock, which those readers also take: no torn identity.
//  (b) Only immediately safe frees enter: the shim calls the cached free
//      only where it would have called allocator.free() (free_sync rule
//      "stream", no capture in flight), and adoption refuses blocks with
//      recorded streams, exported blocks, expandable or large-pool blocks,
//      and frees naming another stream than the block's.  A cached block is
//      reused only for a request on its own stream (the bins are searched
//      by stream), exactly as the core's pool would.  record_stream,
//      mark_exported and frees from other threads first detach an out
//      block (it becomes a plain live block) under both locks.
//  (c) Statistics: adoption counts the program's free in the core's
//      counters (under the allocator's lock).  Handouts and frees of the
//      cache change per-cache deltas (current, accumulated, and the highest
//      current reached since the last merge), merged into the core's
//      counters whenever the allocator's lock is taken for this cache and
//      added (on a copy) by stats() and validate().  Totals are exact at any
//      read.  Peak: a merge raises the peak to the core's current plus the
//      highest delta the cache reached since its last merge, so with one
//      thread the peak is exact; with several, a peak reached while other
//      threads held unmerged handouts may be missed or overstated by at
//      most those threads' cache bytes (thread_cache_kb each).
//  (d) Flushes (cached blocks back to the pools): thread exit (pthread key
//      destructor: also gives back out blocks and frees the cache; not run
//      for the main thread at exit(), when nothing must happen), empty_cache,
//      a miss that would grow the cache (before new memory is asked for, so
//      the OOM path sees them too), reclaim (cudaMemGetInfo), retire_stream,
//      snapshots, context death and the allocator's destruction (which also
//      orphans the cache: the thread never touches a dead allocator's
//      blocks, matched by a serial unique per allocator, never by address).
//      During a graph capture the shim bypasses the layer
//      (thread_cache_eligible).  After fork() only the forking thread
//      exists; CUDA is unusable in such a child, and the shim does not serve
//      it, so the other threads' caches are never touched there.  Nor are
//      the forking thread's own: a pthread_atfork child handler (registered
//      before the first cache exists) empties its slot, so its exit hook,
//      however it leaves, and its allocations find no cache, and gives the
//      registry's mutex a fresh state; the copies are leaked.  Any of the
//      parent's locks may be held by a thread that does not exist in the
//      child (issue 34: the exit hook waited on the allocator's lock).  No
//      cost on the hot path: the handler runs once per fork.
//  (e) validate() checks every cache (check_thread_caches).
//  (g) Fenced frees.  With non-blocking streams alive a plain cuMemFree is
//      made safe by a fence (shim/free_policy.h, core/ledger_fences.cpp).  The
//      owner's cache takes those frees too (give_fenced): the block waits
//      in the cache's `waiting` list (phase tc_waiting: freed
//      for the program, still active in the statistics and counted in
//      deferred_free_bytes, as the core counts its own deferred blocks);
//      once `batch` frees wait, the owner records one fence over them under
//      the allocator's lock (fence_thread_batch) and a miss of its cache
//      polls its fences, oldest first (reclaim_thread_fences).  Only a
//      completed fence moves blocks into the bins: a waiting block is never
//      handed out.  A flush hands waiting and fenced blocks over to the
//      core's deferred list (their fences destroyed): the core's next fence
//      is recorded later still, so covers them too.  Where no fence can be
//      recorded (a failure, the cache's fences all in flight) the waiting
//      blocks are handed over the same way.
//  (f) Nothing is created before a thread's first adopted free: a process
//      that never touches CUDA has no cache, no key, no destructor.
//
// Lock order: the registry mutex (thread exit, allocator destruction,
// cache creation) -> the allocator's mutex -> a thread cache's mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "block.h"
#include "fast_mutex.h"
#include "live_map.h"
#include "stats.h"
#include "types.h"

namespace cachalloc {

class Front;

// Per-cache statistic deltas not yet merged into the allocator's counters:
// `current` and `allocated` move as PoolStats' would, `peak` is the highest
// `current` since the last merge (for the peak).
struct ThreadDelta {
  std::int64_t current = 0;
  std::int64_t allocated = 0;
  std::int64_t peak = 0;
  void up(std::int64_t v) { count_increase(*this, v); }
  void down(std::int64_t v) { current -= v; }
};

struct alignas(64) ThreadCache {  // its own lines: written on every pair
  // Blocks of 512 B .. 64 KiB (exact sizes, 512 B apart), cached per size;
  // each bin a list through Block::free_next, newest first.
  static constexpr std::size_t kGrain = 512;
  static constexpr std::size_t kBins = 128;
  static constexpr std::size_t kMaxBlock = kGrain * kBins;
  // Ids reserved per trip to the allocator's lock.
  static constexpr std::uint64_t kIdBatch = 1024;

  ThreadCache(Front* f, std::uint64_t serial, std::size_t limit) : front(f), alloc_serial(serial), limit(limit) {}

  static std::size_t bin_of(std::size_t size) { return size / kGrain - 1; }

  mutable FastMutex mutex;
  // The allocator's front (front.h); null once the allocator is gone
  // (written under the registry mutex and this mutex).  The owner matches
  // caches by alloc_serial only.
  Front* front;
  const std::uint64_t alloc_serial;
  const std::size_t limit;  // bytes the cache may own (cached + out)

  // Guarded by `mutex`:
  Block* bins[kBins] = {};
  // Handed-out blocks: the newest in `recent` (a pair frees what it just
  // got: no hash), the others in `out` by address.
  Block* recent = nullptr;
  LiveMap out;
  std::size_t owned_bytes = 0;  // cached + out + waiting + fenced
  std::uint64_t next_id = 0;   // [next_id, id_end) reserved from the allocator
  std::uint64_t id_end = 0;
  ThreadDelta count;           // allocation and active
  ThreadDelta bytes;           // allocated_bytes and active_bytes
  ThreadDelta requested;       // requested_bytes
  // Fenced frees (point (g)): blocks waiting for a fence, then behind one.
  struct Fenced {
    FenceId fence;
    Block* blocks;
    std::size_t count;
  };
  static constexpr std::size_t kMaxFences = 4;
  Block* waiting = nullptr;    // not yet behind a fence, through free_next
  std::size_t waiting_count = 0;
  std::size_t waiting_bytes = 0;
  Fenced fences[kMaxFences] = {};  // oldest at fence_head
  std::size_t fence_head = 0;
  std::size_t fence_count = 0;
  // Waiting frees worth a fence: the ledger's fence_batch_min (20 per
  // driver event of a fence), but at least kMinBatch, since a thread's own
  // frees are cheap to hold (small blocks, under an eighth of the cache) and
  // each fence costs a trip to the allocator's lock and a later poll.
  static constexpr std::size_t kMinBatch = 64;
  static constexpr std::size_t kMaxBatchThreads = 8;   // batch: Front::thread_fence_batch
  std::size_t batch = kMinBatch;
  // A fence is due once `batch` frees wait, or an eighth of the cache's
  // bytes (large blocks, or large batches: the cache must not fill with
  // waiting and fenced ones — kMaxFences batches behind fences and one
  // waiting stay within 5/8 of it — or its pairs fall back to the lock).
  bool fence_due() const { return waiting_count >= batch || waiting_bytes >= limit / 8; }
  ThreadDelta held_count;      // waiting + fenced blocks: active
  ThreadDelta held_bytes;      // active_bytes and deferred_free_bytes
  std::int64_t deferred_frees = 0;  // num_deferred_frees not yet merged

  // The allocator's list (guarded by its mutex) and the thread's list
  // (touched by the owner thread only, and by the registry at thread exit).
  ThreadCache* next_in_alloc = nullptr;
  ThreadCache* next_in_thread = nullptr;

  // The handed-out blocks, as one set.
  Block* find_out(DevicePtr ptr) const {
    if (recent != nullptr && recent->ptr == ptr) [[likely]] return recent;
    return out.size() != 0 ? out.find(ptr) : nullptr;
  }
  void erase_out(Block* b) {
    if (b == recent) {
      recent = nullptr;
    } else {
      out.erase(b->ptr);
    }
  }
  // Inline on the hit path; the map insert behind one call (left to the
  // compiler, the whole function went out of line: +25 instructions a pair).
  [[gnu::always_inline]] void insert_out(Block* b) {
    if (recent != nullptr) [[unlikely]] park_recent();
    recent = b;
  }
  [[gnu::noinline]] void park_recent() { out.insert(recent->ptr, recent); }
  std::size_t out_count() const { return out.size() + (recent != nullptr); }
  template <class Fn>
  void for_each_out(Fn&& fn) const {
    if (recent != nullptr) fn(recent->ptr, recent);
    out.for_each(fn);
  }

  // The owner's hot halves (inlined into the front's malloc_cached /
  // free_cached, front_hot.h):
  // a cached block of exactly `size` bytes on `stream`, live again for a
  // request of `requested` bytes; nullptr on a miss (or when ids ran out).
  Block* take(std::size_t size, std::size_t req, StreamId stream);
  // `ptr` handed out by this cache, freed by its owner for reuse on
  // `stream` (kAnyStream: the block's own).  False: not this cache's (the
  // caller takes the allocator's path).
  bool give(DevicePtr ptr, StreamId stream);
  // `ptr` handed out by this cache, freed by its owner under the fence rule:
  // into `waiting`.  kNotMine: the caller takes the allocator's path;
  // kFenceDue: kept, and a fence is worth recording now.
  enum GiveFenced { kNotMine, kKept, kFenceDue };
  GiveFenced give_fenced(DevicePtr ptr);
  // A waiting or fenced block, as point (g) counts it.
  // (The phase is stored last, here and in take/give: an atomic store,
  // relaxed as it is, keeps the compiler from moving other memory accesses
  // across it, and placed first it cost the hit path reloads.)
  void hold(Block* b) {
    b->free_next = waiting;
    waiting = b;
    ++waiting_count;
    waiting_bytes += b->size;
    held_count.up(1);
    held_bytes.up(static_cast<std::int64_t>(b->size));
    ++deferred_frees;
    set_phase(*b, BlockPhase::tc_waiting);
  }
};

// A free that names no stream (cuMemFree): the block's own stream is the one
// whose order makes it safe.
inline constexpr StreamId kAnyStream = ~StreamId{0};

// A serial unique per allocator in the process (never 0).
std::uint64_t next_allocator_serial();

// The calling thread's cache for allocator `serial`, or nullptr (no
// creation).  One thread-local compare in the common case: the slot
// remembers the last allocator asked about, with its cache or none (a miss
// is remembered too; create_thread_cache() updates the slot).
struct ThreadSlot {
  std::uint64_t last_serial;
  ThreadCache* last;
  ThreadCache* list;
  bool key_set;
};
extern thread_local constinit ThreadSlot t_thread_slot;
ThreadCache* find_thread_cache_slow(std::uint64_t serial);
inline ThreadCache* find_thread_cache(std::uint64_t serial) {
  ThreadSlot& s = t_thread_slot;
  if (s.last_serial == serial) [[likely]] return s.last;
  return find_thread_cache_slow(serial);
}

// The registry of threads' caches (thread_cache.cpp).  It reaches an
// allocator only through `RetireThreadCache`, handed over by the allocator
// (front_path.cpp: Front::retire): at a thread's exit, under the registry
// mutex, it is called for each of the thread's caches whose allocator is
// still alive (tc->front not null).
using RetireThreadCache = void (*)(ThreadCache* tc);
// The registry mutex: first in the lock order (above).
std::mutex& thread_cache_registry();
// Readies the process for caches: the thread-exit hook (a pthread key, with
// `retire`, on the first call) and the fork child handler.  False: make no
// cache (without an exit hook it could strand memory; without the fork
// handler a forked child would retire it).
bool prepare_thread_cache(RetireThreadCache retire);
// Under the registry mutex: frees the calling thread's caches whose
// allocator died (their blocks went back when it orphaned them).
void drop_orphaned_thread_caches();
// A new cache `tc` of allocator `serial` joins the calling thread's list
// and slot; the thread's exit hook is armed on its first cache.
void link_thread_cache(ThreadCache* tc, std::uint64_t serial);

[[gnu::always_inline]] inline Block* ThreadCache::take(std::size_t size, std::size_t req, StreamId stream) {
  Block** link = &bins[bin_of(size)];
  Block* b = *link;
  // The newest block first; a few more for a thread that alternates streams.
  for (int i = 0; b != nullptr && b->stream != stream && i < 4; ++i) {
    link = &b->free_next;
    b = *link;
  }
  if (b == nullptr || b->stream != stream || next_id == id_end) return nullptr;
  *link = b->free_next;
  b->free_next = nullptr;
  b->requested = req;
  b->id = next_id++;
  insert_out(b);
  count.up(1);
  bytes.up(static_cast<std::int64_t>(b->size));
  requested.up(static_cast<std::int64_t>(req));
  set_phase(*b, BlockPhase::tc_out);
  return b;
}

[[gnu::always_inline]] inline bool ThreadCache::give(DevicePtr ptr, StreamId stream) {
  Block* b = find_out(ptr);
  if (b == nullptr || (stream != kAnyStream && stream != b->stream)) [[unlikely]] return false;
  erase_out(b);
  std::size_t bin = bin_of(b->size);
  b->free_next = bins[bin];
  bins[bin] = b;
  count.down(1);
  bytes.down(static_cast<std::int64_t>(b->size));
  requested.down(static_cast<std::int64_t>(b->requested));
  set_phase(*b, BlockPhase::tc_cached);
  return true;
}

inline ThreadCache::GiveFenced ThreadCache::give_fenced(DevicePtr ptr) {
  Block* b = find_out(ptr);
  if (b == nullptr) [[unlikely]] return kNotMine;
  erase_out(b);
  count.down(1);
  bytes.down(static_cast<std::int64_t>(b->size));
  requested.down(static_cast<std::int64_t>(b->requested));
  hold(b);
  return fence_due() ? kFenceDue : kKept;
}

}  // namespace cachalloc
