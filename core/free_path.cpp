// free_path.cpp — from a live block back to a pool.
//
// A block freed on its own stream, with no other stream recorded, goes back
// at once: later work on that stream is ordered after the program's last
// use.  Otherwise it is parked in the ledger (ledger_events.cpp): one event
// per other stream, and the block returns here (deactivate, merged with
// free neighbours) only when all of them have completed.  A free with no
// stream (free_deferred) waits in the ledger for a fence
// (ledger_fences.cpp).
#include <algorithm>
#include <vector>

#include "free_path.h"

namespace cachalloc {

// Here, not in caching_allocator.cpp: free_locked and the hold
// (reuse_path.h) inline into them.
Status CachingAllocator::free(DevicePtr ptr) {
  std::lock_guard lock(mutex_);
  return free_locked(ptr, {});
}

Status CachingAllocator::free_fenced(DevicePtr ptr, std::span<const StreamId> streams) {
  std::lock_guard lock(mutex_);
  return free_locked(ptr, streams);
}

[[gnu::always_inline]] inline Status CachingAllocator::free_locked(DevicePtr ptr,
                                                                   std::span<const StreamId> fence_streams) {
  Status st = kSuccess;
  Block* block = find_freed(ptr, &st);
  return block != nullptr ? free_found(block, fence_streams) : st;
}

// free_locked for a block other streams used, or that a fence must cover.
void CachingAllocator::free_used_elsewhere(Block* block, std::span<const StreamId> fence_streams) {
  // Streams whose pending work must finish before reuse: recorded uses plus
  // the caller's fence, minus the block's own stream (ordered already).
  std::vector<StreamId> wait_on = std::move(block->stream_uses);
  block->stream_uses.clear();
  for (StreamId s : fence_streams)
    if (std::find(wait_on.begin(), wait_on.end(), s) == wait_on.end()) wait_on.push_back(s);
  std::erase(wait_on, block->stream);
  if (wait_on.empty()) {
    deactivate(block);
  } else {
    ledger_.park_until(block, wait_on);
  }
}

Status CachingAllocator::free_deferred(DevicePtr ptr) {
  std::lock_guard lock(mutex_);
  Status st = kSuccess;
  Block* block = find_freed(ptr, &st);
  if (block == nullptr) return st;
  return defer_live(block);
}

// The program frees `block` (live): counted, out of the live map, deferred.
Status CachingAllocator::defer_live(Block* block) {
  block = count_free(block);
  if (block == nullptr) return kSuccess;  // exported: retained
  live_.erase(block->ptr);
  ledger_.defer(block);
  return kSuccess;
}

Status CachingAllocator::retire_stream(StreamId stream) {
  std::lock_guard lock(mutex_);
  front_.flush(false);  // blocks cached on it wait too
  settle_held();  // its blocks wait too, merged as the bins would hold them
  // No other stream takes its blocks from now on (steal_path.cpp).
  for (BlockPool* pool : {&small_pool_, &large_pool_})
    if (StreamBins* bins = pool->blocks.find(stream)) bins->retired = true;
  drop_mark(stream);
  for (BlockPool* pool : {&small_pool_, &large_pool_}) {
    for (Block* b : pool->blocks.on_stream(stream)) {
      if (!ledger_.record_pending_event(b, stream)) {
        // No event: wait for the device instead; what is still cached is
        // then safe to reuse on any stream.
        backend_->synchronize_device();
        ++stats_.num_sync_all_streams;
        return kSuccess;
      }
      reactivate(b);
      set_phase(*b, BlockPhase::pending);
    }
  }
  return kSuccess;
}

// Free -> pending (the inverse of deactivate): out of the pool, counted
// active until its events complete, as a block freed with events outstanding.
void CachingAllocator::reactivate(Block* block) {
  BlockPool& pool = pool_for(block->segment->small);
  pool.blocks.erase(block);
  if (block->is_split()) {
    stats_.inactive_split.decrease(pool.small, 1);
    stats_.inactive_split_bytes.decrease(pool.small, static_cast<std::int64_t>(block->size));
  }
  stats_.active.increase(pool.small, 1);
  stats_.active_bytes.increase(pool.small, static_cast<std::int64_t>(block->size));
}

// Active -> free: the block leaves the active count and joins its pool.
void CachingAllocator::deactivate(Block* block) {
  const bool small = block->segment->small;
  stats_.active.decrease(small, 1);
  stats_.active_bytes.decrease(small, static_cast<std::int64_t>(block->size));
  return_to_pool(block);
}

void CachingAllocator::return_to_pool(Block* block) {
  CACHALLOC_ASSERT(block != held_ && block->is_mapped(), "a block returns to its pool mapped, not held");
  settle_held();  // a held neighbour merges as the pool would have it
  BlockPool& pool = pool_for(block->segment->small);
  const bool small = pool.small;
  std::int64_t inactive_blocks_delta = 0;
  std::int64_t inactive_bytes_delta = 0;
  for (Block* neighbour : {block->prev, block->next}) {
    const std::size_t absorbed = try_merge(block, neighbour, pool);
    if (absorbed > 0) {
      --inactive_blocks_delta;
      inactive_bytes_delta -= static_cast<std::int64_t>(absorbed);
    }
  }
  if (block->is_split()) {
    ++inactive_blocks_delta;
    inactive_bytes_delta += static_cast<std::int64_t>(block->size);
  }
  if (inactive_blocks_delta > 0) stats_.inactive_split.increase(small, inactive_blocks_delta);
  if (inactive_blocks_delta < 0) stats_.inactive_split.decrease(small, -inactive_blocks_delta);
  if (inactive_bytes_delta > 0) stats_.inactive_split_bytes.increase(small, inactive_bytes_delta);
  if (inactive_bytes_delta < 0) stats_.inactive_split_bytes.decrease(small, -inactive_bytes_delta);
  block->gc_stamp = pool.lookups;
  pool.blocks.insert(block);
  // The last busy block of a segment that holds retained (exported) memory:
  // the whole segment goes back to the driver now.
  if (block->segment->retained != 0) [[unlikely]] release_if_idle(block->segment);
}

// Absorbs a free neighbour `src` into `dst`; returns the bytes absorbed.
std::size_t CachingAllocator::try_merge(Block* dst, Block* src, BlockPool& pool) {
  if (src == nullptr || !src->is_free()) return 0;
  pool.blocks.erase(src);
  return absorb(dst, src);
}

// Unlinks the neighbour `src` (detached from its bin, or unmapped) and
// extends `dst` over it.
std::size_t CachingAllocator::absorb(Block* dst, Block* src) {
  CACHALLOC_ASSERT(src->segment == dst->segment && (dst->prev == src || dst->next == src),
                   "absorb merges two neighbours of one segment");
  CACHALLOC_ASSERT(src->is_mapped() == dst->is_mapped(), "absorb merges two mapped or two unmapped blocks");
  if (dst->prev == src) {
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (dst->prev != nullptr) dst->prev->next = dst;
    else dst->segment->head = dst;
  } else {
    dst->next = src->next;
    if (dst->next != nullptr) dst->next->prev = dst;
  }
  const std::size_t absorbed = src->size;
  dst->size += absorbed;
  drop_block(src);
  return absorbed;
}

EventId CachingAllocator::acquire_event(Status* err) {
  if (!spare_events_.empty()) {
    EventId e = spare_events_.back();
    spare_events_.pop_back();
    *err = kSuccess;
    return e;
  }
  EventId e = 0;
  *err = backend_->event_create(&e);
  return *err == kSuccess ? e : 0;
}

void CachingAllocator::recycle_event(EventId event) { spare_events_.push_back(event); }

}  // namespace cachalloc
