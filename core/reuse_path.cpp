// reuse_path.cpp — the last freed block, held unmerged for the next request
// of its size.
//
// A program that frees and reallocates one size in a loop makes the eager
// path split a block off its segment's free tail at every malloc and merge
// it back at every free: two bin updates and a Block made and dropped per
// pair.  Instead, a free whose block would merge with its free successor
// only (its predecessor being busy) leaves the block out of the bins, in
// held_, and updates every statistic as the merge would have.  For
// everything else the held block and its successor are one free block M.
//
// The next operation either
//  * is a malloc that the eager path would serve by carving exactly the
//    held block out of M again (reuse_held): same stream and size, M the
//    best fit, M split — then the block is handed out as it lies, with the
//    split's statistics, and the successor is left as the split's tail; or
//  * is anything else, which settles the held block first (settle_held:
//    the merge the free skipped), so that it finds the bins exactly as the
//    eager path would have left them.
// Addresses, statistics, snapshots and every later choice are therefore
// those of the eager path.  Only blocks freed on their own stream with no
// other use are held (free_locked's common case): a block that waits for
// events or a fence is never free, so never held, and never handed out
// early.  Expandable segments and segments holding exported memory keep
// the eager path.
#include "caching_allocator.h"
#include "size_policy.h"

namespace cachalloc {

// Whether `block` (just freed, out of the active count) may be held: it
// would merge with its successor only.
inline bool CachingAllocator::holdable(const Block* block) const {
  const Segment* seg = block->segment;
  if (seg->expandable || seg->retained != 0) return false;
  const Block* next = block->next;
  if (next == nullptr || !next->is_free()) return false;
  return block->prev == nullptr || !block->prev->is_free();
}

// deactivate() (free_path.cpp) for a block freed on its own stream with
// nothing to wait for: it may be held unmerged for the next request of its
// size instead of going back to its pool.
void CachingAllocator::deactivate_or_hold(Block* block) {
  const bool small = block->segment->small;
  stats_.active.decrease(small, 1);
  stats_.active_bytes.decrease(small, static_cast<std::int64_t>(block->size));
  if (holdable(block)) [[likely]] {
    hold(block);  // keeps its live-map entry
    return;
  }
  live_.erase(block->ptr);
  return_to_pool(block);
}

// Holds `block` instead of merging it with its free successor; the
// statistics change exactly as return_to_pool's merge would change them.
void CachingAllocator::hold(Block* block) {
  BlockPool& pool = pool_for(block->segment->small);
  const Block* tail = block->next;
  // return_to_pool: the successor stops being an inactive split block of
  // its own; the merged block is one if its segment stays split.
  if (block->prev != nullptr || tail->next != nullptr) {
    stats_.inactive_split_bytes.increase(pool.small, static_cast<std::int64_t>(block->size));
  } else {
    stats_.inactive_split.decrease(pool.small, 1);
    stats_.inactive_split_bytes.decrease(pool.small, static_cast<std::int64_t>(tail->size));
  }
  block->gc_stamp = pool.lookups;  // as the merged block's
  held_ = block;
}

// The held block, live again, for a request of `size` bytes (`rounded`
// after rounding) on `stream` from `pool`, if the eager path would carve
// exactly it: take_free_block would pick the merged block (best fit,
// max_split_size rules) and carve would split it there.  nullptr otherwise
// (the caller settles and searches).
//
// Statistics: the free that held the block and this malloc change nothing
// else in between (every other operation settles first, and so does a peak
// reset), so each statistic but the requested bytes returns to the value it
// had before that free, which its peak already covers: restore(), no peak
// compared.  The block is below max_split_size (merged is), so no oversize
// count.
Block* CachingAllocator::reuse_held(BlockPool& pool, std::size_t rounded, std::size_t size, StreamId stream) {
  Block* block = held_;
  if (block->size != rounded || block->stream != stream || block->segment->small != pool.small) return nullptr;
  Block* tail = block->next;
  const std::size_t merged = rounded + tail->size;
  // (size < merged < max_split: take_free_block accepts the merged block.)
  if (merged >= config_.max_split_size || !should_split(merged, rounded, pool)) return nullptr;
  if (!held_is_best_fit(rounded)) return nullptr;
  if (config_.garbage_collection_threshold > 0.0) ++pool.lookups;  // take_free_block's count
  held_ = nullptr;
  // carve: the tail is the split's new free block, the most recently
  // inserted of its size.
  tail->gc_stamp = pool.lookups;
  if (tail->free_prev != nullptr && tail->free_prev->size == tail->size) [[unlikely]] {
    pool.blocks.erase(tail);
    pool.blocks.insert(tail);
  }
  // count_split, undoing hold()'s merge statistics.
  const bool small = pool.small;
  const auto bytes = static_cast<std::int64_t>(rounded);
  if (block->prev != nullptr || tail->next != nullptr) {
    stats_.inactive_split_bytes.decrease(small, bytes);
  } else {
    stats_.inactive_split.restore(small, 1);
    stats_.inactive_split_bytes.restore(small, static_cast<std::int64_t>(tail->size));
  }
  // activate().
  block->allocated = true;
  block->requested = size;
  block->id = ++next_id_;  // (its live-map entry stayed: hold())
  stats_.allocation.restore(small, 1);
  stats_.allocated_bytes.restore(small, bytes);
  stats_.active.restore(small, 1);
  stats_.active_bytes.restore(small, bytes);
  stats_.requested_bytes.increase(small, static_cast<std::int64_t>(size));  // may differ from the last request
  return block;
}

// Whether best fit for `size` on the held block's stream, over the bins as
// the eager path has them (the merged block in place of the successor),
// is the merged block: no other free block lies in [size, merged).  A
// block of exactly the merged size loses to it (the most recently freed
// comes first).  Conservative when the successor hides others behind it.
bool CachingAllocator::held_is_best_fit(std::size_t size) const {
  const Block* tail = held_->next;
  const StreamBins* bins = held_->segment->bins;
  if (bins->count() == 1) return true;  // the successor alone
  const Block* other = bins->best_fit(size);
  return other == nullptr || (other != tail && other->size >= size + tail->size);
}

// The merge that the held block's free skipped (statistics already count
// it); settle_held() in caching_allocator.h calls it when a block is held.
void CachingAllocator::merge_held() {
  Block* block = held_;
  held_ = nullptr;
  live_.erase(block->ptr);
  BlockPool& pool = pool_for(block->segment->small);
  pool.blocks.erase(block->next);
  absorb(block, block->next);
  pool.blocks.insert(block);
}

}  // namespace cachalloc
