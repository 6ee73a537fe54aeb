// free_path.h — the first steps of every free, inline: find the block the
// program frees (one lookup per free) and count it freed.  Included by the
// files whose frees start here: free_path.cpp (free, free_fenced,
// free_deferred) and front_path.cpp (the thread caches'
// locked halves), so that a free that falls through one rule to another
// hands the block it found down instead of looking the pointer up again.
// All three run under the allocator's lock.
#pragma once

#include "reuse_path.h"

namespace cachalloc {

// `ptr`'s live block, untouched; nullptr (and *st) when there is none.
[[gnu::always_inline]] inline Block* CachingAllocator::find_freed(DevicePtr ptr, Status* st) {
  *st = kSuccess;
  if (ptr == 0) return nullptr;
  settle_held();  // at most one block is held: the last one freed
  Block* block = find_live(ptr);
  if (block == nullptr) [[unlikely]] *st = inside_segment(ptr) ? kInvalidValue : kNotOwned;
  // Thread-owned (another thread's cache, or a free the owner's cache did
  // not take): a plain live block from now on, or a double free.
  if (block != nullptr && block->tc != nullptr) [[unlikely]]
    if ((block = front_.detach(block)) == nullptr) *st = kInvalidValue;
  // Owned by a capture's token (ledger_owners.cpp): held for it, or freed
  // before (a double free), or its owner is gone and it is freed as usual.
  if (block != nullptr && block->owner != 0) [[unlikely]] {
    if (block->phase() == BlockPhase::owner_held) {
      *st = kInvalidValue;
      return nullptr;
    }
    if (ledger_.hold_for_owner(block)) {
      notify(TraceKind::free, block->ptr, block->size, block->stream);
      return nullptr;
    }
  }
  return block;
}

// Takes a live block out of the allocation statistics, leaving its
// live-map entry to the caller.  nullptr when the block was exported and
// is now retained: then nothing more is to be done.
[[gnu::always_inline]] inline Block* CachingAllocator::count_free(Block* block) {
  const bool small = block->segment->small;
  // (a held backup of the block's tag may lose its last block: pause_backup.cpp)
  if (block->segment->tag != kUntagged) [[unlikely]] note_tagged_free(block);
  const auto bytes = static_cast<std::int64_t>(block->size);
  CACHALLOC_ASSERT(block->pending_events == 0 && block->tc == nullptr,
                   "a block freed for the core waits for nothing yet and is owned by no thread cache");
  set_phase(*block, BlockPhase::detached);
  stats_.allocation.decrease(small, 1);
  stats_.allocated_bytes.decrease(small, bytes);
  stats_.requested_bytes.decrease(small, static_cast<std::int64_t>(block->requested));
  if (block->size >= config_.max_split_size) stats_.oversize_allocations.decrease(1);
  notify(TraceKind::free, block->ptr, block->size, block->stream);
  if (block->exported) [[unlikely]] {
    live_.erase(block->ptr);
    retain(block);
    return nullptr;
  }
  return block;
}

// The stream rule for a block find_freed() returned: back to its pool (or
// held, reuse_path.h) when its own stream orders its reuse, else parked
// until the other streams' events complete (free_used_elsewhere).
[[gnu::always_inline]] inline Status CachingAllocator::free_found(Block* block,
                                                                  std::span<const StreamId> fence_streams) {
  // The common case: freed on its own stream, used on no other, and it
  // would merge with its free successor only: held, counted later.
  const bool own_stream = block->stream_uses.empty() && fence_streams.empty();
  if (own_stream && !block->exported && holdable(block)) [[likely]] {
    hold(block);
    return kSuccess;
  }
  block = count_free(block);
  if (block == nullptr) return kSuccess;  // exported: retained
  live_.erase(block->ptr);
  if (own_stream) {
    deactivate(block);
    return kSuccess;
  }
  free_used_elsewhere(block, fence_streams);
  return kSuccess;
}

}  // namespace cachalloc
