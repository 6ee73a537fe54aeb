// ledger_events.cpp — blocks waiting for other streams' work (ledger.h).
//
// A block freed on its own stream, with no other stream recorded, needs no
// wait: later work on that stream is ordered after the program's last use
// (free_path.cpp).  Otherwise it is parked here: one event per other
// stream, and the block returns to its pool (merged with free neighbours)
// only when all of them have completed.  Events are queried lazily, at the
// next malloc (process_events), and recycled through the allocator's event
// pool.  Where no event can be had the device is synchronized instead, and
// where even that fails the block waits in unsynced_ for the next
// synchronization that succeeds: never reused early.
#include "caching_allocator.h"

namespace cachalloc {

void Ledger::park_until(Block* block, std::span<const StreamId> streams) {
  CACHALLOC_ASSERT(block->phase() == BlockPhase::detached && block->pending_events == 0,
                   "a parked block was just freed and waits for nothing yet");
  for (StreamId s : streams) {
    if (record_pending_event(block, s)) {
      if (block->phase() != BlockPhase::pending) set_phase(*block, BlockPhase::pending);
      continue;
    }
    // Without an event we cannot tell when `s` is done with the block:
    // wait for the whole device instead, which covers every stream.
    const bool had_events = block->pending_events > 0;
    if (backend_->synchronize_device() != kSuccess) {
      // Nothing bounds the block's last use: parked until a device
      // synchronization succeeds (settle_unsynced), never reused early.
      ++block->pending_events;
      if (block->phase() != BlockPhase::pending) set_phase(*block, BlockPhase::pending);
      park_unsynced(block);
      return;
    }
    // Into its pool before the events complete: a neighbour they free must
    // merge with the block there, not absorb it while it is in no pool.
    if (!had_events) core_.deactivate(block);
    synchronize();  // completes (and so deactivates) the block if it had events
    ++stats_.num_sync_all_streams;
    return;
  }
  if (block->pending_events == 0) core_.deactivate(block);
}

bool Ledger::record_pending_event(Block* block, StreamId stream) {
  Status err = kSuccess;
  const EventId event = core_.acquire_event(&err);
  if (err == kSuccess) err = backend_->event_record(event, stream);
  if (err != kSuccess) {
    if (event != 0) core_.recycle_event(event);
    return false;
  }
  ++block->pending_events;
  pending_[stream].push_back({event, block});
  ++pending_count_;
  return true;
}

// A pending block whose pending count already stands for its entry here.
void Ledger::park_unsynced(Block* block) {
  unsynced_.push_back(block);
  ++pending_count_;
}

// Completes events in record order per stream; stops at the first one not
// done on each stream (later ones on that stream cannot be done earlier).
// Returns whether any block became free.
bool Ledger::process_events() {
  bool freed = settle_unsynced();
  if (pending_count_ == unsynced_.size()) return freed;  // no event queued
  for (auto& [stream, queue] : pending_) {
    while (!queue.empty()) {
      const PendingEvent& front = queue.front();
      const Status st = backend_->event_query(front.event);
      if (st == kNotReady) break;
      // An error other than not-ready: wait for the event (or the device)
      // instead; when even that fails the block stays parked.
      if (st != kSuccess && !wait_event(front.event)) break;
      Block* block = front.block;
      core_.recycle_event(front.event);
      queue.pop_front();
      freed = event_done(block) || freed;
    }
  }
  return freed;
}

// One of `block`'s events completed (its entry gone): back to its pool once
// it waits for nothing more.
bool Ledger::event_done(Block* block) {
  CACHALLOC_ASSERT(block->phase() == BlockPhase::pending && block->pending_events > 0,
                   "a completed event names a pending block (no stale entry of a recycled one)");
  --pending_count_;
  if (--block->pending_events != 0) return false;
  core_.deactivate(block);
  return true;
}

void Ledger::synchronize() {
  settle_unsynced();
  flush_deferred();
  wait_fences();
  if (pending_count_ == unsynced_.size()) return;  // no event queued
  ++stats_.num_sync_all_streams;
  for (auto& [stream, queue] : pending_) {
    while (!queue.empty()) {
      const PendingEvent pe = queue.front();
      if (!wait_event(pe.event)) break;
      core_.recycle_event(pe.event);
      queue.pop_front();
      event_done(pe.block);
    }
  }
}

// Waits for `event`, or for the whole device when that fails; false when
// neither could be waited for (then nothing is known about the work).
bool Ledger::wait_event(EventId event) {
  if (backend_->event_synchronize(event) == kSuccess) return true;
  return backend_->synchronize_device() == kSuccess;
}

bool Ledger::settle_unsynced() {
  if (unsynced_.empty() || backend_->synchronize_device() != kSuccess) return false;
  ++stats_.num_sync_all_streams;
  std::vector<Block*> blocks = std::move(unsynced_);
  unsynced_.clear();
  pending_count_ -= blocks.size();
  for (Block* b : blocks) {
    CACHALLOC_ASSERT(b->phase() == BlockPhase::pending && b->pending_events > 0, "an unsynced block is pending");
    if (--b->pending_events == 0) core_.deactivate(b);
  }
  return true;
}

}  // namespace cachalloc
