// reuse_path.cpp — the last freed block, held unmerged for the next request
// of its size.
//
// A program that frees and reallocates one size in a loop makes the eager
// path split a block off its segment's free tail at every malloc and merge
// it back at every free: two bin updates and a Block made and dropped per
// pair.  Instead, a free whose block would merge with its free successor
// only (its predecessor being busy) leaves the block out of the bins, in
// held_, and counts nothing yet: the statistics count the block live until
// it is settled (then the free and the merge are counted) or reused (then
// only the accumulated counts move); readers are given them as if settled.  For
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
//
// The hold and the reuse run on every cached pair, so they are inline, in
// reuse_path.h; the merge that settles a held block is here.
#include "reuse_path.h"

namespace cachalloc {

// The free and the merge that the held block's free skipped;
// settle_held() in caching_allocator.h calls it when a block is held.
void CachingAllocator::merge_held() {
  Block* block = held_;
  held_ = nullptr;
  count_held_free(stats_, block);
  live_.erase(block->ptr);
  BlockPool& pool = pool_for(block->segment->small);
  pool.blocks.erase(block->next);
  absorb(block, block->next);
  pool.blocks.insert(block);
}

// The statistics of the held block's free as the eager path counts them:
// count_free, deactivate, and return_to_pool's merge with the successor
// (which stops being an inactive split block of its own; the merged block
// is one if its segment stays split).
void CachingAllocator::count_held_free(AllocatorStats& s, const Block* block) const {
  const bool small = block->segment->small;
  const auto bytes = static_cast<std::int64_t>(block->size);
  s.allocation.decrease(small, 1);
  s.allocated_bytes.decrease(small, bytes);
  s.requested_bytes.decrease(small, static_cast<std::int64_t>(block->requested));
  if (block->size >= config_.max_split_size) s.oversize_allocations.decrease(1);
  s.active.decrease(small, 1);
  s.active_bytes.decrease(small, bytes);
  const Block* tail = block->next;
  if (block->prev != nullptr || tail->next != nullptr) {
    s.inactive_split_bytes.increase(small, bytes);
  } else {
    s.inactive_split.decrease(small, 1);
    s.inactive_split_bytes.decrease(small, static_cast<std::int64_t>(tail->size));
  }
}

}  // namespace cachalloc
