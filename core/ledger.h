// ledger.h — the ledger: every block of one allocator that waits on
// something before it may be reused (a room of CachingAllocator, which owns
// one Ledger as it owns a Front, front.h).  What waits, and on what:
//  * pending stream uses (ledger_events.cpp): a block freed after other
//    streams used it waits for one event per stream (pending_), or, where
//    neither an event nor a device synchronization could be had, for the
//    next synchronization that succeeds (unsynced_);
//  * deferred frees (ledger_fences.cpp): a free with no stream waits in the
//    deferred list, then in a batch behind one fence for every stream;
//  * retiring runs (ledger_retiring.cpp): release_remap's old addresses of
//    runs mapped again elsewhere wait for a fence before they are unmapped;
//  * owner tokens (ledger_owners.cpp): blocks the program freed while a
//    graph capture's token holds them (owner_held) wait for the token.
//
// Invariants (checked by validate(), validate_lists.cpp, one named check
// each):
//  * A block's pending_events is exactly the number of entries naming it in
//    the event queues, unsynced_, the deferred list and the fence batches:
//    above 0 while pending, exactly 1 while deferred, 0 otherwise.
//  * Those lists name only blocks of live segments (blocks are recycled: a
//    stale entry would complete the next new block early).
//  * pending_count_ is the events queued plus the blocks in unsynced_, so
//    that idle() is one load (every malloc asks it).
//  * deferred_count_ and deferred_bytes_ are the deferred list's; a fence
//    batch's count and bytes are its list's, fenced_count_ and
//    fenced_bytes_ their sums; every deferred block is in exactly one of
//    those lists, and deferred_free_bytes counts their bytes (and the
//    thread caches' waiting ones, thread_cache.h).
//  * The retiring pages of the segments (Segment::retiring) are exactly
//    those of the runs in retiring_.
//  * owners_ lists, per open token, the owner_held blocks held for it, each
//    once and in its own token's entry only; their bytes are
//    capture_held_bytes.
// And one of the backend, relied on, not checked: fences complete in record
// order, and so do the events of one stream; the first one not complete
// ends every walk.
//
// What it may touch.  Its lists and counters; of a block it lists, the
// fields of its wait (pending_events, the free_next link, stream_uses
// cleared at a deferral, owner, and the phase: detached -> pending or
// deferred, deferred -> pending, allocated <-> owner_held); the backend's
// events, fences and device synchronization; the allocator's statistics
// (stats_: the counts of waits and fences, deferred_free_bytes and
// capture_held_bytes; allocated_bytes read only); the allocator's event
// pool (acquire_event, recycle_event: left with the allocator, because the
// steal path's order_after takes its events there too); and one entry back
// into the allocator, CachingAllocator::deactivate, for a block whose wait
// is over (into its pool, merged).  Nothing else: it looks up no block and
// touches no pool, segment or live map.  The unmapping of a retired run and
// the merge of its block are the segments' business (remap_release.cpp,
// retire_remapped and merge_retired).
//
// What may touch it.  The allocator, with its lock held, through the
// public section below (its retire_stream parks free blocks itself:
// record_pending_event, then out of their bins and pending); the front
// (front_path.cpp), through the allocator: enqueue_deferred (a thread
// cache's hand-over), note_fence and fence_batch_min (its own fences' cost
// and batch); validate() (Validator, a friend) reads everything.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "allocator_stats.h"
#include "backend.h"
#include "block.h"
#include "config.h"

namespace cachalloc {

class CachingAllocator;

// release_remap (remap_release.cpp): a run detached from its free block,
// still mapped at old_at; handle 0 once it is owned at its new address.
struct DetachedRun {
  DevicePtr old_at;
  std::size_t bytes;
  MemHandle handle;
};
// Old addresses of runs mapped again elsewhere, unmapped once `fence` completes.
struct RetiringRuns {
  FenceId fence;
  std::vector<std::pair<Segment*, DetachedRun>> runs;
};

class Ledger {
 public:
  // `core` owns this ledger and outlives it; `stats` are the core's.
  Ledger(CachingAllocator& core, DeviceBackend* backend, const Config& config, AllocatorStats& stats)
      : joins_possible_(config.fence_join),
        fence_wait_max_(config.fence_wait_max),
        fence_join_frees_(config.fence_join_frees),
        core_(core),
        backend_(backend),
        stats_(stats) {}
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;

  // ---- pending stream uses (ledger_events.cpp)

  // Whether no block waits for an event or a device synchronization.
  bool idle() const { return pending_count_ == 0; }
  // A freed block (detached, waiting for nothing yet) waits for work
  // enqueued so far on each of `streams`: an event on each, else a device
  // synchronization; it goes to its pool at once when nothing is left to
  // wait for.
  void park_until(Block* block, std::span<const StreamId> streams);
  // Records an event on `stream` that `block` waits for (the caller sets
  // its phase); false (and nothing changed) when none could be had.
  bool record_pending_event(Block* block, StreamId stream);
  // Completes the events (and unsynced blocks) that are done, without
  // waiting.  Whether any block went back to its pool.
  bool process_events();
  // Waits for everything: the deferred list is put behind a fence, and
  // every fence and event waited for (before memory is released).  A wait
  // that fails, and a device synchronization after it, keep the blocks.
  void synchronize();

  // ---- deferred frees and their fences (ledger_fences.cpp)

  // A block the program freed with no stream (detached, counted freed):
  // deferred until a fence recorded after now completes.  The waiting bytes
  // are bounded here (bound_waiting).
  void defer(Block* block);
  // Into the deferred list, counted by the caller (a thread cache's
  // hand-over merged its own statistics already).
  void enqueue_deferred(Block* block);
  // On a cache miss for `size` bytes: what completed events and fences
  // give back, a fence recorded when the deferred list is worth one.
  // Whether any block went back to its pool.
  bool reclaim_pending(std::size_t size);
  // Whether frees wait in the deferred list, or behind fences.
  bool any_deferred() const { return deferred_ != nullptr || !fences_.empty(); }
  bool deferred_unfenced() const { return deferred_ != nullptr; }
  // A miss (`small` pool, `size` bytes) about to grow: joins every waiting
  // free when that is worth it (join_fences).  Whether they went back.
  bool join_for(bool small, std::size_t size);
  // A miss about to grow while more bytes wait behind fences than the
  // program has allocated: waits for the oldest fence.  Whether it did (the
  // caller looks for its block, and asks again).
  bool wait_oldest_fence(std::size_t size);
  // Before cudaMemGetInfo: the deferred list behind a fence, and what
  // completed so far back to the pools.
  void reclaim();
  // A fence was recorded (here or by a thread cache): its statistics, and
  // its cost for the next batch size.
  void note_fence(const DeviceBackend::FenceCost& cost);
  // About 20 frees per event of a fence, so that recording and querying it
  // cost at most ~0.1 driver calls per free; but at most 160 frees: with
  // PyTorch's pool of ~128 non-blocking streams alive a fence takes 129
  // events, and batches of 2,580 frees held back gigabytes (measured:
  // docs/BENCHMARKS.md).  Memory wins over the call budget there.
  static constexpr std::size_t kFreesPerFenceEvent = 20;
  std::size_t fence_batch_min() const {
    return kFreesPerFenceEvent * static_cast<std::size_t>(events_per_fence_ < 8 ? events_per_fence_ : 8);
  }
  // Bytes that may wait for a fence before one is recorded at the free.
  std::size_t deferred_bytes_limit() const { return deferred_bytes_limit_; }
  void set_deferred_bytes_limit(std::size_t bytes) { deferred_bytes_limit_ = bytes; }

  // ---- retiring runs (ledger_retiring.cpp)

  bool retiring() const { return !retiring_.empty(); }
  // `runs` wait for their fence (recorded and joined by the caller).
  void retire_after(RetiringRuns runs) { retiring_.push_back(std::move(runs)); }
  // The oldest runs, when their fence completed (wait: waited for first);
  // else nullptr.  The caller unmaps them, then pop_retired().
  RetiringRuns* retired(bool wait);
  // The oldest runs whatever their fence (the context died), or nullptr.
  RetiringRuns* oldest_retiring() { return retiring_.empty() ? nullptr : &retiring_.front(); }
  void pop_retired();  // destroys its fence

  // ---- owner tokens (ledger_owners.cpp)

  // The token's entry exists from now on (idempotent).
  void open_owner(std::uint64_t token) { owners_.try_emplace(token); }
  bool owner_open(std::uint64_t token) const { return owners_.find(token) != owners_.end(); }
  // `block` (live, not thread-owned, owner set) is held for its owner when
  // the owner's entry lives (true); else the mark is dropped (false).
  bool hold_for_owner(Block* block);
  // The token's entry goes: its blocks, allocated again (the caller frees
  // them), and their bytes.
  std::vector<Block*> release_owner(std::uint64_t token, std::size_t* bytes);

 private:
  friend class Validator;  // validate_lists.cpp reads every list

  struct PendingEvent {
    EventId event;
    Block* block;
  };
  // Blocks of deferred frees behind one fence, linked through free_next.
  struct FenceBatch {
    FenceId fence;
    Block* blocks;
    std::size_t count;
    std::size_t bytes;
  };

  // ledger_events.cpp
  bool wait_event(EventId event);
  bool settle_unsynced();
  void park_unsynced(Block* block);
  bool event_done(Block* block);
  // ledger_fences.cpp
  void bound_waiting();
  bool issue_fence();
  void unsynced_batch(Block* batch);
  bool poll_fences();
  void wait_fences();
  void retire_fence(FenceBatch f);
  bool join_fences();
  void flush_deferred() {
    if (deferred_ != nullptr) issue_fence();
  }
  void complete_batch(Block* blocks);

  // First: idle() is read on every malloc.
  std::size_t pending_count_ = 0;  // events in all queues, plus unsynced_'s blocks
  // Per stream, in record order.  Entries are kept when their queue empties
  // (one per stream that ever waited), so parking a block allocates nothing.
  std::unordered_map<StreamId, std::deque<PendingEvent>> pending_;
  // Blocks whose last use nothing could bound (no event recorded, and the
  // device synchronization failed too): each holds one pending count until
  // a device synchronization succeeds.
  std::vector<Block*> unsynced_;
  // Deferred frees not yet behind a fence, linked through Block::free_next;
  // then batches behind fences, oldest first.
  Block* deferred_ = nullptr;
  std::size_t deferred_count_ = 0;
  std::size_t deferred_bytes_ = 0;  // of the blocks in that list
  std::deque<FenceBatch> fences_;
  std::size_t fenced_count_ = 0;  // blocks behind fences
  std::size_t fenced_bytes_ = 0;  // and their bytes
  int events_per_fence_ = 1;      // the last fence's cost (driver calls)
  // Whether misses may join fences (fence_join, and the backend can: a
  // kNotSupported answer clears it for good).
  bool joins_possible_;
  std::size_t deferred_bytes_limit_ = 0;
  const std::size_t fence_wait_max_;    // Config::fence_wait_max
  const std::size_t fence_join_frees_;  // Config::fence_join_frees
  // release_remap's old addresses, oldest first.
  std::deque<RetiringRuns> retiring_;
  // Per open owner token, the blocks held for it (Block::owner_held).
  std::unordered_map<std::uint64_t, std::vector<Block*>> owners_;

  CachingAllocator& core_;
  DeviceBackend* const backend_;
  AllocatorStats& stats_;
};

}  // namespace cachalloc
