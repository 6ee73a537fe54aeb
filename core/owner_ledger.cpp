// owner_ledger.cpp — blocks held for an owner token (a graph capture's).
//
// A CUDA graph keeps using the addresses its capture saw at every replay,
// so a block the program frees during a capture, or allocates during one
// and frees later, must not be handed to anyone else while a graph or an
// executable graph made from that capture lives (PyTorch keeps such blocks
// in the capture's private pool).  The core knows no graphs: the shim
// issues one token per set of captures in flight (shim/graph_owners.h) and
// releases it when the last graph derived from them is destroyed.
//
// A held block stays allocated for the core: the live map, the statistics
// (capture_held_bytes besides) and pause/resume treat it as live, so its
// pages come back at the same addresses after a resume, as the graph
// expects.  For the program it is freed: is_live and query say so, and a
// second free is kInvalidValue.  Release frees the blocks behind a fence:
// the graph's last launch, on whichever stream, may still run.
#include "caching_allocator.h"

namespace cachalloc {

void CachingAllocator::open_owner(std::uint64_t token) {
  std::lock_guard lock(mutex_);
  owners_.try_emplace(token);
}

// With the lock held, from find_freed: `block` (live, not thread-owned,
// owner set) is held when its owner's entry lives; else its owner is gone
// and the mark is dropped (false: free it as usual).
bool CachingAllocator::hold_for_owner_locked(Block* block) {
  auto it = owners_.find(block->owner);
  if (it == owners_.end()) {
    block->owner = 0;
    return false;
  }
  set_phase(*block, BlockPhase::owner_held);
  it->second.push_back(block);
  stats_.capture_held_bytes.increase(static_cast<std::int64_t>(block->size));
  notify(TraceKind::free, block->ptr, block->size, block->stream);
  return true;
}

Status CachingAllocator::hold_for(DevicePtr ptr, std::uint64_t token) {
  std::lock_guard lock(mutex_);
  owners_.try_emplace(token);
  settle_held();
  Block* block = find_live(ptr);
  if (block == nullptr) return inside_segment(ptr) ? kInvalidValue : kNotOwned;
  if (block->tc != nullptr && (block = front_.detach(block)) == nullptr) return kInvalidValue;
  if (block->phase() == BlockPhase::owner_held) return kInvalidValue;
  // `token` replaces an older owner: the shim passes a token whose
  // captures include that owner's live ones (owner_of, graph_owners.h).
  block->owner = token;
  hold_for_owner_locked(block);
  return kSuccess;
}

Status CachingAllocator::mark_owner(DevicePtr ptr, std::uint64_t token) {
  std::lock_guard lock(mutex_);
  owners_.try_emplace(token);
  Block* block = find_live(ptr);
  if (block == nullptr) return inside_segment(ptr) ? kInvalidValue : kNotOwned;
  if (block->tc != nullptr && (block = front_.detach(block)) == nullptr) return kInvalidValue;
  if (block->owner == 0) block->owner = token;
  return kSuccess;
}

std::size_t CachingAllocator::release_owner(std::uint64_t token) {
  std::lock_guard lock(mutex_);
  auto it = owners_.find(token);
  if (it == owners_.end()) return 0;
  std::vector<Block*> held = std::move(it->second);
  owners_.erase(it);
  std::size_t bytes = 0;
  for (Block* b : held) {
    set_phase(*b, BlockPhase::allocated);
    b->owner = 0;
    stats_.capture_held_bytes.decrease(static_cast<std::int64_t>(b->size));
    bytes += b->size;
    defer_live(b);  // behind a fence over all the context's work
  }
  return bytes;
}

std::uint64_t CachingAllocator::owner_of(DevicePtr ptr) const {
  std::lock_guard lock(mutex_);
  const Block* block = find_live(ptr);
  if (block == nullptr || block->owner == 0 || owners_.find(block->owner) == owners_.end()) return 0;
  return block->owner;
}

std::size_t CachingAllocator::owner_held_bytes() const {
  std::lock_guard lock(mutex_);
  return static_cast<std::size_t>(stats_.capture_held_bytes.current);
}

}  // namespace cachalloc
