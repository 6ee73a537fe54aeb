// address_query.cpp — what the allocator says about an address.
//
// The driver calls that reveal an allocation (cuMemGetAddressRange,
// cuPointerGetAttribute(s), cuIpcGetMemHandle) must describe the program's
// block, not the segment that cachalloc carved it from: a program that
// memsets "its" range must not reach a neighbour.  query() answers for any
// address; mark_exported() records that an IPC handle describes a block, so
// that its memory is not handed to anyone else after the free while an
// importer may still map it (the driver keeps freed exported memory alive).
#include "caching_allocator.h"

namespace cachalloc {

Status CachingAllocator::query(DevicePtr ptr, AddressInfo* out) const {
  std::lock_guard lock(mutex_);
  auto it = segments_.upper_bound(ptr);
  if (it == segments_.begin()) return kNotOwned;
  const Segment* seg = (--it)->second;
  if (ptr >= seg->base + seg->size) return kNotOwned;
  *out = AddressInfo{};
  out->segment = seg->base;
  out->segment_size = seg->size;
  out->expandable = seg->expandable;
  out->tag = seg->tag;
  if (seg->tag != kUntagged) {
    auto ts = tags_.find(seg->tag);
    out->paused = ts != tags_.end() && ts->second.paused;
  }
  // The common query names a block's start: one hash lookup.  An interior
  // pointer walks the segment's blocks (address order).
  const Block* b = find_live(ptr);
  if (b == nullptr) {
    b = seg->head;
    while (b != nullptr && ptr >= b->ptr + b->size) b = b->next;
  }
  if (b == nullptr || !b->is_allocated()) return kSuccess;
  // A thread-owned block: its program state and identity under its cache's
  // lock (thread_cache.h, point (a)).
  std::unique_lock<FastMutex> tl;
  if (b->tc != nullptr) [[unlikely]] {
    tl = std::unique_lock(b->tc->mutex);
    if (b->phase() != BlockPhase::tc_out) return kSuccess;
  }
  if (ptr >= b->ptr + b->requested) return kSuccess;
  out->live = true;
  out->block = b->ptr;
  out->requested = b->requested;
  out->id = b->id;
  out->exported = b->exported;
  return kSuccess;
}

Status CachingAllocator::mark_exported(DevicePtr block, std::uint64_t id) {
  std::lock_guard lock(mutex_);
  Block* b = find_live(block);
  if (b != nullptr && b->tc != nullptr) b = front_.detach(b);  // exported memory is never cached
  if (b == nullptr || b->id != id) return inside_segment(block) ? kInvalidValue : kNotOwned;
  if (b->segment->expandable) return kNotSupported;
  b->exported = true;
  return kSuccess;
}

std::size_t CachingAllocator::mark_range_exported(DevicePtr lo, DevicePtr hi) {
  std::lock_guard lock(mutex_);
  std::size_t marked = 0;
  auto it = segments_.upper_bound(lo);  // from the segment holding lo (or the one before) on
  if (it != segments_.begin()) --it;
  for (; it != segments_.end() && it->second->base < hi; ++it)
    for (Block* b = it->second->head; b != nullptr; b = b->next)
      if (b->is_allocated() && b->ptr < hi && lo < b->ptr + b->size) {
        if (b->tc != nullptr && front_.detach(b) == nullptr) continue;  // cached: freed
        b->exported = true;
        ++marked;
      }
  return marked;
}

}  // namespace cachalloc
