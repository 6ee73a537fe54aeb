// front_path.cpp — the front's locked halves (front.h): creation of a
// thread's cache, adoption of freed blocks, fenced frees, detaching,
// flushing, statistic merges and a cache's retirement at its thread's exit.
// thread_cache.h states the design and its invariants; the lock-free halves
// (take, give) are inline there and in front.h, and the registry of
// threads' caches (the thread-exit hook that calls back into retire) is
// thread_cache.cpp.  A free the cache does not take goes on to the core's
// rules with the block already found (free_path.h): one lookup per free.
#include <algorithm>
#include <mutex>
#include <new>

#include "free_path.h"

namespace cachalloc {

Front::Front(CachingAllocator& core, const Config& config)
    : core_(core),
      serial_(next_allocator_serial()),
      layer_on_(config.thread_cache_bytes != 0),
      tc_events_(layer_on_ ? &kTcNever : &kTcAlways),
      divisions_(config.roundup_power2_divisions) {}

const std::atomic<bool> Front::kTcNever{false};
const std::atomic<bool> Front::kTcAlways{true};

// Under the allocator's lock (set_observer).  The caches send no trace
// events, so while the observer may want them the layer reads its flag.
void Front::set_observer_flag(const std::atomic<bool>* flag, bool has_observer) {
  const std::atomic<bool>* f = &kTcNever;
  if (!layer_on_) {
    f = &kTcAlways;
  } else if (has_observer) {
    f = flag != nullptr ? flag : &kTcAlways;
  }
  tc_events_.store(f, std::memory_order_relaxed);
}

// A miss because the cache's reserved ids ran out: more, and again.
bool Front::malloc_cached_slow(DevicePtr* out, std::size_t size, StreamId stream, ThreadCache* tc) {
  {
    std::lock_guard lock(core_.mutex_);
    std::lock_guard tl(tc->mutex);
    ++core_.stats_.num_thread_cache_locked_allocs;
    if (tc->next_id == tc->id_end) reserve_ids(tc);
    if (tc->fence_count != 0) reclaim_thread_fences(tc);
    merge_deltas(tc);
  }
  std::lock_guard tl(tc->mutex);
  Block* b = tc->take(round_size(size, divisions_), size, stream);
  if (b == nullptr) return false;
  *out = b->ptr;
  return true;
}

// ------------------------------------------------------------ locked halves

ThreadCache* Front::create_thread_cache() {
  if (!prepare_thread_cache([](ThreadCache* tc) { tc->front->retire(tc); })) return nullptr;
  auto* tc = new (std::nothrow) ThreadCache(this, serial_, core_.config_.thread_cache_bytes);
  if (tc == nullptr) return nullptr;
  {
    std::lock_guard g(thread_cache_registry());
    // Caches of allocators that died since go now (their blocks went back
    // when the allocator orphaned them).
    drop_orphaned_thread_caches();
    std::lock_guard lock(core_.mutex_);
    tc->next_in_alloc = tcs_;
    tcs_ = tc;
    ++tcs_count_;
    rebatch_thread_caches();
    std::lock_guard tl(tc->mutex);
    reserve_ids(tc);
  }
  link_thread_cache(tc, serial_);
  return tc;
}

// Both locks held.
void Front::reserve_ids(ThreadCache* tc) {
  tc->next_id = core_.next_id_ + 1;
  core_.next_id_ += ThreadCache::kIdBatch;
  tc->id_end = core_.next_id_ + 1;
}

// The program frees `block` (live, plain): into `tc` when the free is
// immediately safe on the block's stream and the cache has room.
// Whether a live block is of a kind the caches take (thread_cache.h (b)).
bool Front::adoptable(const Block* block) const {
  const Segment* seg = block->segment;
  return seg->small && !seg->expandable && block->size <= ThreadCache::kMaxBlock &&
         block->size < core_.config_.max_split_size && !block->exported && block->stream_uses.empty() &&
         block->owner == 0;
}

bool Front::adopt(Block* block, StreamId stream, ThreadCache* tc) {
  if (!adoptable(block) || (stream != kAnyStream && stream != block->stream)) return false;
  std::lock_guard tl(tc->mutex);
  if (!take_ownership(block, tc)) return false;
  set_phase(*block, BlockPhase::tc_cached);
  const std::size_t bin = ThreadCache::bin_of(block->size);
  block->free_next = tc->bins[bin];
  tc->bins[bin] = block;
  return true;
}

// Both locks held: `block` (live, adoptable) becomes `tc`'s, freed for the
// program (counted now: the block stays allocated for the core; the caller
// sets its phase, tc_cached or tc_waiting).  False when the cache has no
// room.
bool Front::take_ownership(Block* block, ThreadCache* tc) {
  if (tc->owned_bytes + block->size > tc->limit) return false;
  merge_deltas(tc);
  if (tc->id_end - tc->next_id < ThreadCache::kIdBatch / 2) reserve_ids(tc);
  CACHALLOC_ASSERT(block->phase() == BlockPhase::allocated && block->tc == nullptr,
                   "a thread cache takes a plain live block");
  block->tc = tc;
  tc->owned_bytes += block->size;
  const auto bytes = static_cast<std::int64_t>(block->size);
  core_.stats_.allocation.decrease(true, 1);
  core_.stats_.allocated_bytes.decrease(true, bytes);
  core_.stats_.active.decrease(true, 1);
  core_.stats_.active_bytes.decrease(true, bytes);
  core_.stats_.requested_bytes.decrease(true, static_cast<std::int64_t>(block->requested));
  return true;
}

// free_cached's locked half: the block goes into the thread's cache when
// adopt() allows, else it is freed as free() would (after recording
// `stream`), the block found once.  tc null: the layer is off, or no cache
// could be made.
Status Front::free_adopt(DevicePtr ptr, StreamId stream, ThreadCache* tc) {
  std::lock_guard lock(core_.mutex_);
  Status st = kSuccess;
  Block* block = core_.find_freed(ptr, &st);  // (detaches a thread-owned block)
  if (block == nullptr) return st;
  if (tc != nullptr && adopt(block, stream, tc)) return kSuccess;
  // As record_stream(): a free on another stream waits for it.
  if (stream != kAnyStream && stream != block->stream &&
      std::find(block->stream_uses.begin(), block->stream_uses.end(), stream) == block->stream_uses.end())
    block->stream_uses.push_back(stream);
  return core_.free_found(block, {});
}

// ------------------------------------------------- fenced frees (point (g))

// free_cached_fenced's locked half, for a block the cache did not hand out:
// adopted into its waiting list when it may be, else free_deferred().  tc
// null: the layer is off, or no cache could be made.
Status Front::free_deferred_adopt(DevicePtr ptr, ThreadCache* tc) {
  std::lock_guard lock(core_.mutex_);
  Status st = kSuccess;
  Block* block = core_.find_freed(ptr, &st);  // (detaches a thread-owned block)
  if (block == nullptr) return st;
  if (tc != nullptr && adoptable(block)) {
    std::lock_guard tl(tc->mutex);
    if (take_ownership(block, tc)) {
      tc->hold(block);  // active and deferred again, through the deltas
      if (tc->fence_due()) fence_waiting(tc);
      return kSuccess;
    }
  }
  return core_.defer_live(block);
}

// A fence over the calling thread's waiting frees (free_cached_fenced, when
// `batch` of them wait).
void Front::fence_thread_batch(ThreadCache* tc) {
  std::lock_guard lock(core_.mutex_);
  std::lock_guard tl(tc->mutex);
  fence_waiting(tc);
}

void Front::fence_cached_frees() {
  if (ThreadCache* tc = find_thread_cache(serial_); tc != nullptr) fence_thread_batch(tc);
}

// Both locks held: one fence over `tc`'s waiting blocks.  Where none can be
// recorded (all of the cache's fences in flight, or the backend failed) the
// blocks go to the core's deferred list, which has its own fallbacks; during
// a capture (kNotReady) they keep waiting.  Whether a fence was recorded.
bool Front::fence_waiting(ThreadCache* tc) {
  if (tc->waiting == nullptr) return false;
  Status st = kNotSupported;
  FenceId fence = 0;
  DeviceBackend::FenceCost cost;
  if (tc->fence_count < ThreadCache::kMaxFences) st = core_.backend_->fence_record(&fence, &cost);
  if (st == kNotReady) return false;
  if (st != kSuccess) {
    hand_over_held(tc, false);
    return false;
  }
  core_.ledger_.note_fence(cost);
  tc->fences[(tc->fence_head + tc->fence_count) % ThreadCache::kMaxFences] = {fence, tc->waiting, tc->waiting_count};
  ++tc->fence_count;
  tc->waiting = nullptr;
  tc->waiting_count = 0;
  tc->waiting_bytes = 0;
  tc->batch = thread_fence_batch();
  return true;
}

// Frees per thread fence, under the allocator's mutex: the ledger's fence_batch_min (20
// per driver event), at least kMinBatch, and kMinBatch more per thread cache
// of this allocator (up to kMaxBatchThreads = 8 of them: at 16, a batch of
// 1,024 small blocks and the one behind its fence filled the 1 MiB cache, and
// every pair took the allocator's lock).  Every thread's fence
// takes the allocator's lock and makes a driver call that records on all the
// context's streams, so with T threads each fencing its own frees the fences
// come T times as often and cost more each (one stream per thread is the
// common arrangement): on the H100, throughput of plain pairs with each
// thread on its own stream stopped rising after 2-4 threads (tree 2755350,
// BENCHMARKS.md Archive) at a batch of 64.  Scaling the batch keeps the fences per
// second of all threads together about those of one thread.  What waits is
// still bounded by the cache's bytes (fence_due: an eighth of its limit).
std::size_t Front::thread_fence_batch() const {
  const std::size_t threads = std::clamp<std::size_t>(tcs_count_, 1, ThreadCache::kMaxBatchThreads);
  return std::max(core_.ledger_.fence_batch_min(), ThreadCache::kMinBatch * threads);
}

// Under the allocator's mutex, when a cache comes or goes: every cache's batch from the
// new count (a cache's fields change under its own lock).
void Front::rebatch_thread_caches() {
  const std::size_t batch = thread_fence_batch();
  for (ThreadCache* tc = tcs_; tc != nullptr; tc = tc->next_in_alloc) {
    std::lock_guard tl(tc->mutex);
    tc->batch = batch;
  }
}

// Both locks held: `tc`'s completed fences, oldest first, put their blocks
// into the bins (a fence recorded later completes later on every stream, so
// the first one not done ends the walk).  Whether any block came back.
bool Front::reclaim_thread_fences(ThreadCache* tc) {
  bool freed = false;
  while (tc->fence_count != 0) {
    const ThreadCache::Fenced f = tc->fences[tc->fence_head];
    const Status st = core_.backend_->fence_query(f.fence);
    if (st == kNotReady) {
      ++core_.stats_.num_thread_fence_polls_not_ready;
      break;
    }
    if (st != kSuccess && core_.backend_->fence_synchronize(f.fence) != kSuccess &&
        core_.backend_->synchronize_device() != kSuccess)
      break;
    core_.backend_->fence_destroy(f.fence);
    tc->fence_head = (tc->fence_head + 1) % ThreadCache::kMaxFences;
    --tc->fence_count;
    for (Block* b = f.blocks; b != nullptr;) {
      Block* next = b->free_next;
      set_phase(*b, BlockPhase::tc_cached);
      tc->held_count.down(1);
      tc->held_bytes.down(static_cast<std::int64_t>(b->size));
      const std::size_t bin = ThreadCache::bin_of(b->size);
      b->free_next = tc->bins[bin];
      tc->bins[bin] = b;
      b = next;
    }
    freed = true;
  }
  if (tc->fence_due()) fence_waiting(tc);
  return freed;
}

// Both locks held: a block `tc` owns and the program freed (cached, waiting
// or fenced) leaves it, no longer allocated for the core either.
void Front::disown(ThreadCache* tc, Block* b) {
  CACHALLOC_ASSERT(b->tc == tc && tc->owned_bytes >= b->size, "a thread cache disowns a block it owns");
  b->tc = nullptr;
  set_phase(*b, BlockPhase::detached);
  core_.live_.erase(b->ptr);
  tc->owned_bytes -= b->size;
}

// Both locks held: `tc`'s waiting blocks (and, with fenced_too, those behind
// its fences, which are destroyed) leave it for the core's deferred list:
// the core's next fence, recorded later still, covers them.  They stay
// active and deferred in the statistics (the deltas merged first).
// Returns how many blocks moved.
std::size_t Front::hand_over_held(ThreadCache* tc, bool fenced_too) {
  merge_deltas(tc);
  std::size_t n = 0;
  auto move = [&](Block* list) {
    for (Block* b = list; b != nullptr;) {
      Block* next = b->free_next;
      disown(tc, b);
      core_.ledger_.enqueue_deferred(b);
      ++n;
      b = next;
    }
  };
  move(tc->waiting);
  tc->waiting = nullptr;
  tc->waiting_count = 0;
  tc->waiting_bytes = 0;
  for (; fenced_too && tc->fence_count != 0; --tc->fence_count) {
    const ThreadCache::Fenced f = tc->fences[tc->fence_head];
    core_.backend_->fence_destroy(f.fence);
    move(f.blocks);
    tc->fence_head = (tc->fence_head + 1) % ThreadCache::kMaxFences;
  }
  return n;
}

// A thread-owned block leaves its cache (the allocator's lock held): a
// handed-out block becomes a plain live block (returned); a cached one is
// freed in the program's view (nullptr: the caller's ptr names no live
// block).
Block* Front::detach(Block* block) {
  ThreadCache* tc = block->tc;
  std::lock_guard tl(tc->mutex);
  if (block->phase() != BlockPhase::tc_out) return nullptr;
  merge_deltas(tc);  // the core's counters then hold the block as the program does
  tc->erase_out(block);
  tc->owned_bytes -= block->size;
  block->tc = nullptr;
  set_phase(*block, BlockPhase::allocated);
  return block;
}

// Both locks held.
void Front::merge_deltas(ThreadCache* tc) {
  auto merge = [](PoolStats& p, const ThreadDelta& d) { p.adjust(true, d.current, d.allocated, d.peak); };
  merge(core_.stats_.allocation, tc->count);
  merge(core_.stats_.active, tc->count);
  merge(core_.stats_.allocated_bytes, tc->bytes);
  merge(core_.stats_.active_bytes, tc->bytes);
  merge(core_.stats_.requested_bytes, tc->requested);
  merge(core_.stats_.active, tc->held_count);
  merge(core_.stats_.active_bytes, tc->held_bytes);
  merge_stat(core_.stats_.deferred_free_bytes, tc->held_bytes);
  core_.stats_.num_deferred_frees += tc->deferred_frees;
  tc->count = tc->bytes = tc->requested = tc->held_count = tc->held_bytes = ThreadDelta{};
  tc->deferred_frees = 0;
}

// A cache's delta into a plain Stat (deferred_free_bytes).
void Front::merge_stat(Stat& s, const ThreadDelta& d) {
  if (s.current + d.peak > s.peak) s.peak = s.current + d.peak;
  s.current += d.current;
  s.allocated += d.allocated;
  s.freed += d.allocated - d.current;
}

void Front::merge_all_deltas() {
  for (ThreadCache* tc = tcs_; tc != nullptr; tc = tc->next_in_alloc) {
    std::lock_guard tl(tc->mutex);
    merge_deltas(tc);
  }
}

void Front::add_deltas(AllocatorStats& s) const {
  for (const ThreadCache* tc = tcs_; tc != nullptr; tc = tc->next_in_alloc) {
    s.allocation.adjust(true, tc->count.current, tc->count.allocated, tc->count.peak);
    s.active.adjust(true, tc->count.current, tc->count.allocated, tc->count.peak);
    s.allocated_bytes.adjust(true, tc->bytes.current, tc->bytes.allocated, tc->bytes.peak);
    s.active_bytes.adjust(true, tc->bytes.current, tc->bytes.allocated, tc->bytes.peak);
    s.requested_bytes.adjust(true, tc->requested.current, tc->requested.allocated, tc->requested.peak);
    s.active.adjust(true, tc->held_count.current, tc->held_count.allocated, tc->held_count.peak);
    s.active_bytes.adjust(true, tc->held_bytes.current, tc->held_bytes.allocated, tc->held_bytes.peak);
    merge_stat(s.deferred_free_bytes, tc->held_bytes);
    s.num_deferred_frees += tc->deferred_frees;
  }
}

void Front::lock_all() const {
  for (const ThreadCache* tc = tcs_; tc != nullptr; tc = tc->next_in_alloc) tc->mutex.lock();
}
void Front::unlock_all() const {
  for (const ThreadCache* tc = tcs_; tc != nullptr; tc = tc->next_in_alloc) tc->mutex.unlock();
}

// Whether the program holds `b` (allocated for the core); the allocator's
// lock held.
bool Front::program_live(const Block* b) const {
  if (!b->is_allocated() || b->phase() == BlockPhase::owner_held) return false;
  if (b->tc == nullptr) [[likely]] return true;
  std::lock_guard tl(b->tc->mutex);
  return b->phase() == BlockPhase::tc_out;
}

// Every cache's cached blocks back to the pools (and, with out_too, its
// handed-out blocks become plain live blocks).  Whether any block came back.
bool Front::flush(bool out_too) {
  std::size_t n = 0;
  for (ThreadCache* tc = tcs_; tc != nullptr; tc = tc->next_in_alloc) n += flush_one(tc, out_too);
  return n != 0;
}

std::size_t Front::flush_one(ThreadCache* tc, bool out_too) {
  std::lock_guard tl(tc->mutex);
  std::size_t n = hand_over_held(tc, true);  // (merges the deltas)
  for (Block*& head : tc->bins) {
    for (Block* b = head; b != nullptr;) {
      Block* next = b->free_next;
      b->free_next = nullptr;
      disown(tc, b);
      core_.return_to_pool(b);  // its free and inactivity were counted at adoption
      ++n;
      b = next;
    }
    head = nullptr;
  }
  if (out_too) {
    tc->for_each_out([&](DevicePtr, Block* b) {
      b->tc = nullptr;
      set_phase(*b, BlockPhase::allocated);
      tc->owned_bytes -= b->size;
    });
    tc->out = LiveMap{};
    tc->recent = nullptr;
  }
  return n;
}

void Front::retire(ThreadCache* tc) {
  std::lock_guard lock(core_.mutex_);
  flush_one(tc, true);
  for (ThreadCache** link = &tcs_; *link != nullptr; link = &(*link)->next_in_alloc)
    if (*link == tc) {
      *link = tc->next_in_alloc;
      --tcs_count_;
      rebatch_thread_caches();
      break;
    }
  std::lock_guard tl(tc->mutex);
  tc->front = nullptr;
}

// The allocator is going: every cache gives its blocks back and forgets it
// (its thread frees it later, at exit or its next cache creation).
void Front::orphan() {
  std::lock_guard g(thread_cache_registry());
  std::lock_guard lock(core_.mutex_);
  for (ThreadCache* tc = tcs_; tc != nullptr; tc = tc->next_in_alloc) {
    flush_one(tc, true);
    std::lock_guard tl(tc->mutex);
    tc->front = nullptr;
  }
  tcs_ = nullptr;
  tcs_count_ = 0;
}

}  // namespace cachalloc
