// front.h — the front: one allocator's per-thread caches and their
// hand-over to the core (a room of CachingAllocator, which owns one Front).
//
// Invariants (thread_cache.h states them with their reasons, points (a)-(g)):
//  * A block is thread-owned (Block::tc set) from its adoption (adopt,
//    free_deferred_adopt) to its disown, detach or flush, each under the
//    allocator's lock and the cache's; while owned the core counts it
//    allocated and never pools, splits or merges it.
//  * The list of caches (tcs_, tcs_count_) changes under the allocator's
//    lock only; a cache's fields under its own lock; lock order: the
//    registry mutex -> the allocator's mutex -> a cache's mutex.
//  * The hits (malloc_cached, free_cached, give_cached, give_cached_fenced)
//    take only the calling thread's cache lock: no allocator lock, no
//    driver call, no heap call; everything else is one out-of-line call.
//  * The caches send no trace events: tc_usable() reads false while the
//    observer wants them (tc_events_), and then every operation takes the
//    core's locked path.
//  * Per-cache statistic deltas merge into the core's counters whenever the
//    allocator's lock is taken for that cache; readers add them on a copy.
//
// What it may touch.  Its caches and their registry (thread_cache.h).  Of
// the core (CachingAllocator, which makes it a friend): the allocator's
// mutex, its configuration (read only), stats_, the id counter next_id_,
// the live map (a disowned block leaves it), the backend (its caches'
// fences), and the core's entries for blocks it lets go: return_to_pool (a
// flush), find_freed / free_found / defer_live (a free its cache does not
// take, free_path.h, free_path.cpp).  Of the ledger (ledger.h), through the
// core: enqueue_deferred (a hand-over), note_fence and fence_batch_min (its
// fences' cost and batch).  Nothing else: pools and segments are the
// core's, the blocks that wait the ledger's.
//
// What may touch it.  The program's side (the shim, through
// CachingAllocator::front()) calls the public hot halves; the core calls
// the section "the core's side" with its lock held, nothing private.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "allocator_stats.h"
#include "backend.h"
#include "block.h"
#include "config.h"
#include "size_policy.h"
#include "thread_cache.h"

namespace cachalloc {

class CachingAllocator;

class Front {
 public:
  // `core` owns this front and outlives it; `config` is the core's.
  Front(CachingAllocator& core, const Config& config);
  Front(const Front&) = delete;
  Front& operator=(const Front&) = delete;

  // ---- the program's side (the hot halves inline, below the class)

  // malloc_cached: true (and *out set) when the calling thread's cache had
  // a block of the request's rounded size on `stream`; false changes
  // nothing (call CachingAllocator::malloc()).  kMaySlow false: the hit
  // alone, no locked half (which may make driver calls: the shim's caller
  // without a current context, driver_ops.cpp).
  template <bool kMaySlow = true>
  bool malloc_cached(DevicePtr* out, std::size_t size, StreamId stream);
  // A free that is immediately safe in the order of `stream` (kAnyStream:
  // the block's own; a plain free under free_sync stream): through the
  // thread's cache when it may keep the block, else as record_stream(ptr,
  // stream) + free().  Same statuses as CachingAllocator::free().
  // `give_tried`: the caller's give_cached / give_cached_fenced(ptr) just
  // missed on this thread, and would again (only the owner thread hands
  // blocks out of its cache): the cache's lock is not taken a second time.
  Status free_cached(DevicePtr ptr, StreamId stream, bool give_tried = false);
  // free_deferred() through the thread's cache: the block waits there for a
  // fence the thread records over a batch of its frees (thread_cache.h,
  // point (g)), else as free_deferred().  Same statuses as free().
  Status free_cached_fenced(DevicePtr ptr, bool give_tried = false);
  // The hits alone of free_cached(ptr, kAnyStream) and free_cached_fenced(),
  // for a caller that does not know yet whether `ptr` is this allocator's
  // (the shim's cuMemFree, before it asks the driver for the current
  // context): whether the calling thread's cache handed `ptr` out and took
  // it back.  A miss (kNotMine / false) changes nothing.  kFenceDue: kept,
  // and the caller calls fence_cached_frees() with this allocator's context
  // current (a fence records driver events).  give_cached(ptr, stream): the
  // hit of free_cached(ptr, stream), `stream` the block's own.
  bool give_cached(DevicePtr ptr, StreamId stream = kAnyStream);
  ThreadCache::GiveFenced give_cached_fenced(DevicePtr ptr);
  void fence_cached_frees();

  // ---- the core's side (the allocator's lock held unless said otherwise)

  // Whether any thread has a cache of this allocator.
  bool any() const { return tcs_ != nullptr; }
  // A thread-owned block leaves its cache: a handed-out block becomes a
  // plain live block (returned); a cached one is freed in the program's
  // view (nullptr: the caller's ptr names no live block).
  Block* detach(Block* block);
  // Whether the program holds `b` (allocated for the core).
  bool program_live(const Block* b) const;
  // Every cache's cached blocks back to the pools (with out_too, its
  // handed-out blocks become plain live blocks).  Whether any came back.
  bool flush(bool out_too);
  void merge_all_deltas();
  void add_deltas(AllocatorStats& s) const;  // the caches' locks held
  void lock_all() const;
  void unlock_all() const;
  // The observer's events flag (set_observer): nullptr for no observer.
  void set_observer_flag(const std::atomic<bool>* flag, bool has_observer);
  // The allocator is going (its lock not held: taken here, after the
  // registry's): every cache gives its blocks back and forgets it.
  void orphan();

 private:
  friend class Validator;  // validate_lists.cpp: check_thread_caches

  // Whether the calling thread may use its cache now: two relaxed loads.
  // tc_events_ points at a flag that reads true while the layer must not
  // serve: kTcAlways when the layer is off (thread_cache_kb 0) or the
  // observer wants every event, the observer's own flag while its interest
  // can change, kTcNever without an observer.  Observers live as long as
  // the process (the flags too).
  [[gnu::always_inline]] bool tc_usable() const {
    return !tc_events_.load(std::memory_order_relaxed)->load(std::memory_order_relaxed);
  }

  // Locked halves (front_path.cpp), one call from the hot halves each.
  bool malloc_cached_slow(DevicePtr* out, std::size_t size, StreamId stream, ThreadCache* tc);
  ThreadCache* create_thread_cache();
  Status free_adopt(DevicePtr ptr, StreamId stream, ThreadCache* tc);
  Status free_deferred_adopt(DevicePtr ptr, ThreadCache* tc);
  void fence_thread_batch(ThreadCache* tc);
  void retire(ThreadCache* tc);  // thread exit (thread_cache.cpp's hook)

  // Adoption (both locks held unless said otherwise).
  bool adoptable(const Block* block) const;
  bool adopt(Block* block, StreamId stream, ThreadCache* tc);  // takes tc's lock
  bool take_ownership(Block* block, ThreadCache* tc);
  void reserve_ids(ThreadCache* tc);

  // Fenced frees, point (g).
  bool fence_waiting(ThreadCache* tc);
  bool reclaim_thread_fences(ThreadCache* tc);
  std::size_t thread_fence_batch() const;
  void rebatch_thread_caches();
  std::size_t hand_over_held(ThreadCache* tc, bool fenced_too);

  // Giving blocks back and merging statistics.
  ThreadCache* own_cache();
  static bool give_locked(ThreadCache* tc, DevicePtr ptr, StreamId stream);
  static ThreadCache::GiveFenced give_fenced_locked(ThreadCache* tc, DevicePtr ptr);
  void disown(ThreadCache* tc, Block* b);
  std::size_t flush_one(ThreadCache* tc, bool out_too);
  void merge_deltas(ThreadCache* tc);
  static void merge_stat(Stat& s, const ThreadDelta& d);

  static const std::atomic<bool> kTcNever;
  static const std::atomic<bool> kTcAlways;

  CachingAllocator& core_;
  const std::uint64_t serial_;  // unique per allocator in the process (caches match on it)
  const bool layer_on_;         // thread_cache_kb != 0
  std::atomic<const std::atomic<bool>*> tc_events_;
  ThreadCache* tcs_ = nullptr;  // this allocator's thread caches (under its mutex)
  std::size_t tcs_count_ = 0;   // how many (under its mutex)
  // The configuration's roundup_power2_divisions, copied: the hit rounds as
  // the core does (round_size), from the front's own fields.  Reached
  // through core_ (or a flag here and an out-of-line call), GCC kept the
  // thread's cache pointer on the stack through the hit: 3 to 7 more
  // instructions a pair (bench/callgrind-pair.sh, 512 B).
  const Power2Divisions divisions_;
};

// ------------------------------------------------------------ hot halves
// Inline in the shim's cuMemAlloc / cuMemFree.  A hit takes the calling
// thread's cache lock only; everything else is one call into
// front_path.cpp.

template <bool kMaySlow>
[[gnu::always_inline]] inline bool Front::malloc_cached(DevicePtr* out, std::size_t size, StreamId stream) {
  if (size - 1 >= ThreadCache::kMaxBlock) return false;  // size 0 too
  ThreadCache* tc = find_thread_cache(serial_);
  if (tc == nullptr || !tc_usable()) return false;
  const std::size_t rounded = round_size(size, divisions_);
  if (rounded > ThreadCache::kMaxBlock) return false;
  tc->mutex.lock();
  Block* b = tc->take(rounded, size, stream);
  // A miss worth the locked half: ids ran out, or fences may have completed.
  const bool slow = b == nullptr && (tc->next_id == tc->id_end || tc->fence_count != 0);
  tc->mutex.unlock();
  if (b != nullptr) [[likely]] {
    *out = b->ptr;
    return true;
  }
  return kMaySlow && slow && malloc_cached_slow(out, size, stream, tc);
}

// The calling thread's cache, made on its first free; null with the layer
// off.  (A fresh cache has nothing out: give() then answers no.)
[[gnu::always_inline]] inline ThreadCache* Front::own_cache() {
  if (!tc_usable()) [[unlikely]] return nullptr;
  ThreadCache* tc = find_thread_cache(serial_);
  if (tc == nullptr) [[unlikely]] tc = create_thread_cache();
  return tc;
}

[[gnu::always_inline]] inline bool Front::give_locked(ThreadCache* tc, DevicePtr ptr, StreamId stream) {
  tc->mutex.lock();
  const bool kept = tc->give(ptr, stream);
  tc->mutex.unlock();
  return kept;
}

[[gnu::always_inline]] inline ThreadCache::GiveFenced Front::give_fenced_locked(ThreadCache* tc, DevicePtr ptr) {
  tc->mutex.lock();
  const ThreadCache::GiveFenced kept = tc->give_fenced(ptr);
  tc->mutex.unlock();
  return kept;
}

// (With the layer off, tc stays null: free_adopt is then free(), with the
// stream recorded first.)
[[gnu::always_inline]] inline Status Front::free_cached(DevicePtr ptr, StreamId stream, bool give_tried) {
  ThreadCache* tc = own_cache();
  if (tc != nullptr && !give_tried && give_locked(tc, ptr, stream)) [[likely]] return kSuccess;
  return free_adopt(ptr, stream, tc);
}

[[gnu::always_inline]] inline bool Front::give_cached(DevicePtr ptr, StreamId stream) {
  if (!tc_usable()) [[unlikely]] return false;
  ThreadCache* tc = find_thread_cache(serial_);
  return tc != nullptr && give_locked(tc, ptr, stream);
}

[[gnu::always_inline]] inline ThreadCache::GiveFenced Front::give_cached_fenced(DevicePtr ptr) {
  if (!tc_usable()) [[unlikely]] return ThreadCache::kNotMine;
  ThreadCache* tc = find_thread_cache(serial_);
  return tc == nullptr ? ThreadCache::kNotMine : give_fenced_locked(tc, ptr);
}

// (With the layer off, tc stays null: free_deferred_adopt is then
// free_deferred().)
[[gnu::always_inline]] inline Status Front::free_cached_fenced(DevicePtr ptr, bool give_tried) {
  ThreadCache* tc = own_cache();
  if (tc != nullptr && !give_tried) [[likely]] {
    const ThreadCache::GiveFenced kept = give_fenced_locked(tc, ptr);
    if (kept == ThreadCache::kFenceDue) fence_thread_batch(tc);
    if (kept != ThreadCache::kNotMine) [[likely]] return kSuccess;
  }
  return free_deferred_adopt(ptr, tc);
}

}  // namespace cachalloc
