// reuse_path.h — the held block's hot half, inline: the hold at a free and
// the reuse at the next malloc (reuse_path.cpp says what holding means).
// Included by allocation_path.cpp and free_path.cpp, whose public entry
// points then run a cached pair without a call inside the core.
#pragma once

#include "caching_allocator.h"
#include "size_policy.h"

namespace cachalloc {

// Whether `block` (being freed) may be held: it would merge with its
// successor only.
inline bool CachingAllocator::holdable(const Block* block) const {
  const Segment* seg = block->segment;
  if (seg->expandable || seg->retained != 0) return false;
  const Block* next = block->next;
  if (next == nullptr || !next->is_free()) return false;
  return block->prev == nullptr || !block->prev->is_free();
}

// Holds `block` (live, freed on its own stream with nothing to wait for,
// holdable) instead of merging it with its free successor.  Its free is not
// counted yet: the statistics still count it live and unmerged until
// merge_held() settles it or reuse_held() hands it out again, and readers
// see it counted (count_held_free on a copy: stats(), validate()).
//
// (The phase is stored last, here and in reuse_held: see ThreadCache::hold.)
[[gnu::always_inline]] inline void CachingAllocator::hold(Block* block) {
  block->gc_stamp = pool_for(block->segment->small).lookups;  // as the merged block's
  held_ = block;  // keeps its live-map entry
  set_phase(*block, BlockPhase::held);
  notify(TraceKind::free, block->ptr, block->size, block->stream);
}

// The held block, live again, for a request of `size` bytes (`rounded`
// after rounding) on `stream` from `pool`, if the eager path would carve
// exactly it: take_free_block would pick the merged block (best fit,
// max_split_size rules) and carve would split it there.  nullptr otherwise
// (the caller settles and searches).
//
// Statistics: the free that held the block was not counted (hold()), and
// this malloc undoes it: each statistic but the requested bytes gets back
// the value it had, so only the accumulated counts move (cycle()), and the
// peak the merge's increase of inactive split bytes would have reached
// (touch()).  The block is below max_split_size (merged is), so no
// oversize count.
[[gnu::always_inline]] inline Block* CachingAllocator::reuse_held(BlockPool& pool, std::size_t rounded,
                                                                 std::size_t size, StreamId stream) {
  Block* block = held_;
  if (block->size != rounded || block->stream != stream || block->segment->small != pool.small) return nullptr;
  Block* tail = block->next;
  const std::size_t merged = rounded + tail->size;
  // (size < merged < max_split: take_free_block accepts the merged block.)
  if (merged >= config_.max_split_size || !should_split(merged, rounded, pool)) return nullptr;
  if (!held_is_best_fit(rounded)) return nullptr;
  if (gc_on_) ++pool.lookups;  // take_free_block's count
  held_ = nullptr;
  // carve: the tail is the split's new free block, the most recently
  // inserted of its size.
  tail->gc_stamp = pool.lookups;
  if (tail->free_prev != nullptr && tail->free_prev->size == tail->size) [[unlikely]] {
    pool.blocks.erase(tail);
    pool.blocks.insert(tail);
  }
  // The free's merge and count_split undoing it.
  const bool small = pool.small;
  const auto bytes = static_cast<std::int64_t>(rounded);
  if (block->prev != nullptr || tail->next != nullptr) {
    stats_.inactive_split_bytes.touch(small, bytes);
  } else {
    stats_.inactive_split.cycle(small, 1);
    stats_.inactive_split_bytes.cycle(small, static_cast<std::int64_t>(tail->size));
  }
  // count_free and deactivate, then activate().
  block->id = ++next_id_;  // (its live-map entry stayed: hold())
  stats_.count_reuse(small, bytes);  // allocation, allocated_bytes, active, active_bytes: cycle()
  stats_.requested_bytes.replace(small, static_cast<std::int64_t>(block->requested),
                                 static_cast<std::int64_t>(size));  // may differ from the last request
  block->requested = size;
  set_phase(*block, BlockPhase::allocated);
  return block;
}

// Whether best fit for `size` on the held block's stream, over the bins as
// the eager path has them (the merged block in place of the successor),
// is the merged block: no other free block lies in [size, merged).  A
// block of exactly the merged size loses to it (the most recently freed
// comes first).  Conservative when the successor hides others behind it.
inline bool CachingAllocator::held_is_best_fit(std::size_t size) const {
  const Block* tail = held_->next;
  const StreamBins* bins = held_->segment->bins;
  if (bins->count() == 1) return true;  // the successor alone
  const Block* other = bins->best_fit(size);
  return other == nullptr || (other != tail && other->size >= size + tail->size);
}

}  // namespace cachalloc
