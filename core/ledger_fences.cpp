// ledger_fences.cpp — frees with no stream, made safe by batched fences
// (the ledger's deferred frees, ledger.h).
//
// A plain cuMemFree promises that the memory is safe to reuse whatever any
// stream still does with it; the driver keeps that promise by synchronizing
// the device.  Here the freed block waits in a list instead (free_deferred),
// at no driver cost.  When the cache misses and enough blocks wait — about
// 20 per driver event a fence takes (so on average at most 0.1 driver
// calls per free for recording and querying), capped at 160 so that many
// idle streams do not hold back memory — one fence is recorded for
// the whole list: it completes once all work enqueued before it, on every
// stream, has completed (DeviceBackend::fence_record).  With many streams
// alive a miss records one for 20 frees already when their bytes could
// serve it: the alternative is growing the cache (reclaim_pending).
// Fences are queried when the cache misses, oldest first; a completed fence
// returns its batch to the pools.  The bytes waiting are bounded: past
// fence_wait_max (256 MiB by default, 128 with expandable segments) the
// free joins them (bound_waiting),
// where joins are impossible past deferred_bytes_limit() it records a fence
// itself, and the out-of-memory path waits for every fence before it gives
// up.
//
// States: a deferred block is neither allocated nor free — pending_events
// is 1 and its phase is deferred — while it sits in deferred_ (not yet
// behind a fence) or in a FenceBatch (behind one); both lists link through
// Block::free_next.  Completion clears both and returns it to its pool
// (CachingAllocator::deactivate).  The allocator's side of a deferred free
// (the lookup, the statistics of the free) is free_path.cpp's free_deferred.
#include <algorithm>

#include "caching_allocator.h"

namespace cachalloc {

void Ledger::defer(Block* block) {
  block->stream_uses.clear();  // the fence covers every stream
  enqueue_deferred(block);
  ++stats_.num_deferred_frees;
  stats_.deferred_free_bytes.increase(static_cast<std::int64_t>(block->size));
  if (deferred_bytes_ + fenced_bytes_ > fence_wait_max_ || deferred_bytes_ > deferred_bytes_limit_) [[unlikely]]
    bound_waiting();
}

void Ledger::enqueue_deferred(Block* block) {
  CACHALLOC_ASSERT(block->pending_events == 0 && block->tc == nullptr,
                   "a block enters the deferred list waiting for nothing else, owned by no thread cache");
  set_phase(*block, BlockPhase::deferred);
  ++block->pending_events;
  block->free_next = deferred_;
  deferred_ = block;
  ++deferred_count_;
  deferred_bytes_ += block->size;
}

// More than fence_wait_max bytes of frees wait: the free joins them (one
// fence and the device-side order, join_fences), so they are reusable at
// once and the memory a multi-stream program holds stays within that many
// bytes of what it would hold if every free were reusable at once.  With
// joins at misses only, freed blocks piled up between misses while later
// requests carved other free blocks (the side-stream program with classic
// segments peaked 15-19 % over PyTorch's own allocator, docs/BENCHMARKS.md
// section 5).  At least 20 frees must wait, so
// that the join's two driver calls stay at 0.1 per free — unless four times
// the bound waits (a few large tensors: on the side-stream program fewer
// than 20 frees held up to 1.3 GB back), where two calls are nothing beside
// the bytes.  So what waits stays under the bound plus one free while frees are
// many, and under four times the bound plus one free always.  Where no join is
// possible (no cuCtxWaitEvent, fence_join:false, a capture) a fence is
// recorded at the free once the frees not yet behind one pass
// deferred_bytes_limit(), to be reclaimed by a later miss.
void Ledger::bound_waiting() {
  const std::size_t waiting = deferred_bytes_ + fenced_bytes_;
  const bool amortized = deferred_count_ + fenced_count_ >= fence_join_frees_ || waiting / 4 > fence_wait_max_;
  if (waiting > fence_wait_max_ && amortized && joins_possible_ && backend_->fence_join_supported() && join_fences())
    return;
  if (deferred_bytes_ > deferred_bytes_limit_) issue_fence();
}

// "Worth one" (a fence at a miss for `size` bytes): a full batch
// (fence_batch_min), or — when the fence has many events (many
// non-blocking streams alive) — 20 frees holding at least `size` bytes.
// Without the second case such a program grows its cache while gigabytes
// of freed memory wait behind no fence at all, and what grows is kept for
// good; programs synchronize often (a loss read back every step), so a
// fence recorded at the miss often completes at once and serves the
// request.  The miss would otherwise grow the cache, a driver call that
// costs as much as tens of event records.
bool Ledger::reclaim_pending(std::size_t size) {
  bool freed = false;
  if (!idle()) freed = process_events();
  const bool full_batch = deferred_count_ >= fence_batch_min();
  const bool saves_growth = deferred_count_ >= kFreesPerFenceEvent && deferred_bytes_ >= size;
  // (A fence that could not be recorded synchronizes instead and frees the
  // batch at once: worth another look too.)
  if (full_batch || saves_growth) freed = issue_fence() || freed;
  if (!fences_.empty()) freed = poll_fences() || freed;
  return freed;
}

// Puts the deferred list behind a new fence.  False when no fence can be
// recorded now (a capture is in flight): the blocks keep waiting.  When the
// backend fails, the device is synchronized instead, and if even that fails
// the blocks wait for a later synchronization (unsynced_).
bool Ledger::issue_fence() {
  if (deferred_ == nullptr) return false;
  FenceId fence = 0;
  DeviceBackend::FenceCost cost;
  const Status st = backend_->fence_record(&fence, &cost);
  if (st == kNotReady) return false;
  Block* batch = deferred_;
  const std::size_t count = deferred_count_;
  const std::size_t bytes = deferred_bytes_;
  deferred_ = nullptr;
  deferred_count_ = 0;
  deferred_bytes_ = 0;
  if (st == kSuccess) [[likely]] {
    note_fence(cost);
    fences_.push_back({fence, batch, count, bytes});
    fenced_count_ += count;
    fenced_bytes_ += bytes;
    return true;
  }
  if (backend_->synchronize_device() == kSuccess) {
    ++stats_.num_sync_all_streams;
    complete_batch(batch);
    return true;
  }
  unsynced_batch(batch);
  return true;
}

void Ledger::note_fence(const DeviceBackend::FenceCost& cost) {
  ++stats_.num_fences;
  stats_.num_fence_events += cost.events;
  stats_.num_fence_stream_queries += cost.stream_queries;
  events_per_fence_ = std::max(cost.calls(), 1);
}

// Nothing bounds the last use of a batch whose fence could not be recorded
// nor the device synchronized: parked until a synchronization succeeds
// (settle_unsynced), never reused early.
void Ledger::unsynced_batch(Block* batch) {
  for (Block* b = batch; b != nullptr;) {
    Block* next = b->free_next;
    b->free_next = nullptr;
    set_phase(*b, BlockPhase::pending);  // (its one pending count now stands for unsynced_)
    stats_.deferred_free_bytes.decrease(static_cast<std::int64_t>(b->size));
    park_unsynced(b);
    b = next;
  }
}

// Completes fences oldest first; a fence recorded later completes later on
// every stream, so the first one not done ends the walk.
bool Ledger::poll_fences() {
  bool freed = false;
  while (!fences_.empty()) {
    const FenceBatch f = fences_.front();
    const Status st = backend_->fence_query(f.fence);
    if (st == kNotReady) break;
    // An error other than not-ready: wait for the fence (or the device).
    if (st != kSuccess && backend_->fence_synchronize(f.fence) != kSuccess &&
        backend_->synchronize_device() != kSuccess)
      break;
    retire_fence(f);
    freed = true;
  }
  return freed;
}

// Waits for every fence (before memory is released, or given up as out of
// memory).  A fence that cannot be waited for, nor the device, keeps its
// blocks waiting.
void Ledger::wait_fences() {
  while (!fences_.empty()) {
    const FenceBatch f = fences_.front();
    if (backend_->fence_synchronize(f.fence) != kSuccess && backend_->synchronize_device() != kSuccess) return;
    retire_fence(f);
  }
}

// The oldest fence, complete: its blocks go back to their pools.
// (By value: callers pass fences_.front(), which the pop below destroys.)
void Ledger::retire_fence(FenceBatch f) {
  fences_.pop_front();
  fenced_count_ -= f.count;
  fenced_bytes_ -= f.bytes;
  backend_->fence_destroy(f.fence);
  complete_batch(f.blocks);
}

// A miss about to grow the cache while more bytes wait behind fences than
// the program has allocated waits for the oldest fences instead, until a
// block fits or that is no longer so (the allocator's obtain_block asks
// again after each).  Without this the cache grows by all
// the memory the program frees while the host runs ahead of the device —
// in a PyTorch loop with a side stream, gigabytes beyond PyTorch's own peak
// (docs/BENCHMARKS.md) — and what grows is kept for good.  The wait is on
// an event recorded behind work already enqueued, not on the device: the
// work enqueued after it keeps the device busy meanwhile, so a loop bound
// by the device loses nothing; the host is held to a lead of about the
// program's live bytes.  (Never during a capture: the backend refuses.)
bool Ledger::wait_oldest_fence(std::size_t size) {
  if (fences_.empty() || fenced_bytes_ < size ||
      fenced_bytes_ <= static_cast<std::size_t>(stats_.allocated_bytes[StatType::aggregate].current))
    return false;
  const FenceBatch f = fences_.front();
  if (backend_->fence_synchronize(f.fence) != kSuccess) return false;
  ++stats_.num_fence_waits;
  retire_fence(f);
  return true;
}

// A miss about to grow the cache while waiting frees could serve it: one
// fence over them (if they are not all behind one yet), and all later work
// of the device — every stream, streams created later included — ordered
// after the newest fence, on the device (DeviceBackend::fence_join,
// cuCtxWaitEvent: about 0.7 us for the record and the join on an H100, no
// host wait).  Every block behind a fence is then safe to hand out at once:
// whatever uses it next is enqueued after the join, so it runs after all
// work enqueued before its free.  This is what keeps a multi-stream program
// at its live bytes — the freed memory the host ran ahead of is reused as
// soon as it is freed, as a stream-ordered allocator would reuse it — where
// growing would keep it for good.
//
// The price is ordering, not time on the host: work enqueued after the join
// on one stream waits for work enqueued before it on the others (a side
// stream's next copy waits for compute queued so far).  So a small request
// (a 2 MiB segment would serve it and 20 more) joins only once 20 frees
// wait and their bytes could serve it, amortizing the two driver calls to
// 0.1 per free; a large one, whose growth costs a 20 MiB segment or more,
// joins whenever anything waits: fewer waiting bytes than it asks for may
// still merge with free neighbours into a block that fits (measured on the
// side-stream program: peak 5.2-5.6 GiB when joins needed the bytes, against
// 4.70 for PyTorch's own allocator).  fence_join:false turns joins off (host waits for the
// oldest fence instead, wait_oldest_fence).
bool Ledger::join_for(bool small, std::size_t size) {
  if (!joins_possible_) return false;
  if (small && (deferred_count_ + fenced_count_ < fence_join_frees_ || deferred_bytes_ + fenced_bytes_ < size))
    return false;
  if (!backend_->fence_join_supported()) {  // asked before a fence is recorded for nothing
    joins_possible_ = false;
    return false;
  }
  return join_fences();
}

// Puts the deferred frees behind a fence, joins the newest fence and
// returns every fenced block to its pool.  False (nothing changed but a
// fence recorded) when no fence can be recorded or joined now.
bool Ledger::join_fences() {
  if (deferred_ != nullptr && !issue_fence()) return false;
  if (fences_.empty()) return true;  // the fence failed and the device was synchronized instead
  const Status st = backend_->fence_join(fences_.back().fence);
  if (st == kNotSupported) joins_possible_ = false;
  if (st != kSuccess) return false;
  ++stats_.num_fence_joins;
  // The newest fence covers all work enqueued before it, so the join orders
  // later work after every older fence too.
  while (!fences_.empty()) retire_fence(fences_.front());
  return true;
}

void Ledger::reclaim() {
  flush_deferred();
  poll_fences();
  if (!idle()) process_events();
}

// The blocks of a completed fence go back to their pools.  Each block's
// successor is read before the block is returned: returning it relinks it
// into a bin (and may absorb free neighbours, never a deferred one).
void Ledger::complete_batch(Block* blocks) {
  for (Block* b = blocks; b != nullptr;) {
    Block* next = b->free_next;
    b->free_next = nullptr;
    CACHALLOC_ASSERT(b->phase() == BlockPhase::deferred && b->pending_events == 1,
                     "a fenced block waits for its fence alone");
    stats_.deferred_free_bytes.decrease(static_cast<std::int64_t>(b->size));
    if (--b->pending_events == 0) core_.deactivate(b);
    b = next;
  }
}

}  // namespace cachalloc
