// release_path.cpp — giving memory back to the device.
//
// Only a whole free segment (one unsplit block) can go back, or one whose
// blocks are free or retained after an IPC export (release_if_idle).  Three
// callers of the first kind:
// the out-of-memory path (one segment big enough, then everything),
// empty_cache(), and garbage collection, which returns the segments idle
// longest once reserved memory passes garbage_collection_threshold.
#include <algorithm>
#include <vector>

#include "caching_allocator.h"

namespace cachalloc {

void CachingAllocator::release_segment(Block* block) {
  CACHALLOC_ASSERT(!block->is_split() && block->phase() == BlockPhase::free && block->size == block->segment->size,
                   "only a whole free segment is released");
  pool_for(block->segment->small).blocks.erase(block);
  free_segment(block->segment);
}

// Gives a segment whose blocks are all out of use back to the device and
// forgets it.  The caller has taken its blocks out of the pools.
void CachingAllocator::free_segment(Segment* seg) {
  const bool small = seg->small;
  const Status st = backend_->segment_free(seg->base);
  (void)st;  // the memory is unusable either way; the driver reports its own errors
  ++stats_.num_device_free;
  stats_.segment.decrease(small, 1);
  stats_.reserved_bytes.decrease(small, static_cast<std::int64_t>(seg->size));
  if (seg->size >= config_.max_split_size) stats_.oversize_segments.decrease(1);
  notify(TraceKind::segment_unmap, seg->base, seg->size, seg->stream);
  segments_.erase(seg->base);
  for (Block* b = seg->head; b != nullptr;) {
    Block* next = b->next;
    drop_block(b);
    b = next;
  }
  delete seg;
}

// A freed block that an IPC handle describes: an importer may still map it,
// so it is never reused; it stays active (like a pending free) until its
// whole segment goes back to the driver, which keeps exported memory alive
// for importers after cuMemFree.
void CachingAllocator::retain(Block* block) {
  block->exported = false;
  set_phase(*block, BlockPhase::retained);
  block->stream_uses.clear();
  ++block->segment->retained;
  release_if_idle(block->segment);
}

// Releases `seg` when nothing in it is allocated or waiting on events: what
// is left is free or retained memory.
// An expandable segment keeps retained pages mapped until the context dies
// (it is one reservation for many blocks; its pages are not exported
// through IPC, only through dma-buf ranges).
void CachingAllocator::release_if_idle(Segment* seg) {
  if (seg->expandable) return;
  for (const Block* b = seg->head; b != nullptr; b = b->next)
    if (b->is_allocated() || b->pending_events != 0) return;
  const bool small = seg->small;
  for (Block* b = seg->head; b != nullptr; b = b->next) {
    const auto bytes = static_cast<std::int64_t>(b->size);
    if (b->phase() == BlockPhase::retained) {
      stats_.active.decrease(small, 1);
      stats_.active_bytes.decrease(small, bytes);
    } else {
      pool_for(small).blocks.erase(b);
      if (b->is_split()) {
        stats_.inactive_split.decrease(small, 1);
        stats_.inactive_split_bytes.decrease(small, bytes);
      }
    }
  }
  free_segment(seg);
}

Status CachingAllocator::release_after_context_death() {
  std::lock_guard lock(mutex_);
  front_.flush(true);
  Status first_error = kSuccess;
  auto note = [&](Status st) {
    if (st != kSuccess && first_error == kSuccess) first_error = st;
  };
  // release_remap's old addresses: their work died too.
  while (const RetiringRuns* r = ledger_.oldest_retiring()) {
    for (const auto& [seg, run] : r->runs) {
      note(backend_->vm_unmap(run.old_at, run.bytes));
      if (run.handle != 0) note(backend_->vm_release(run.handle));
    }
    ledger_.pop_retired();
  }
  for (Segment* seg : expandable_) {
    for (std::size_t i = 0; i < seg->handles.size();) {
      const std::size_t n = std::max<std::size_t>(seg->run_pages[i], 1);
      if (seg->handles[i] != 0) {
        note(backend_->vm_unmap(seg->base + i * seg->page, n * seg->page));
        note(backend_->vm_release(seg->handles[i]));
        std::fill_n(seg->handles.begin() + static_cast<std::ptrdiff_t>(i), n, 0);
        seg->run_pages[i] = 0;
      }
      i += n;
    }
    note(backend_->vm_release_range(seg->base, seg->size));
  }
  expandable_.clear();
  return first_error;
}

std::vector<DevicePtr> CachingAllocator::live_block_addresses() const {
  std::lock_guard lock(mutex_);
  std::vector<DevicePtr> out;
  // (The held block keeps its entry while free: reuse_path.h.)
  live_.for_each([&](DevicePtr ptr, const Block* block) {
    if (front_.program_live(block)) out.push_back(ptr);
  });
  return out;
}

std::size_t CachingAllocator::live_blocks_on_streams_except(StreamId except) const {
  std::lock_guard lock(mutex_);
  std::size_t n = 0;
  live_.for_each([&](DevicePtr, const Block* block) { n += block->stream != except && front_.program_live(block); });
  return n;
}

// Releases the smallest whole free segment of at least `size` bytes, from
// either pool and any stream: once returned, its stream no longer matters.
bool CachingAllocator::release_one_cached(std::size_t size) {
  Block* best = nullptr;
  for (BlockPool* pool : {&small_pool_, &large_pool_})
    for (Block* b : pool->blocks.all())
      if (!b->is_split() && !b->segment->expandable && b->size >= size && (best == nullptr || b->size < best->size))
        best = b;
  if (best == nullptr) return false;
  release_segment(best);
  return true;
}

void CachingAllocator::release_all_cached() {
  for (BlockPool* pool : {&small_pool_, &large_pool_}) {
    std::vector<Block*> whole;
    for (Block* b : pool->blocks.all())
      if (!b->is_split() && !b->segment->expandable) whole.push_back(b);
    for (Block* b : whole) release_segment(b);
  }
  if (!expandable_.empty()) unmap_all_free_pages();
}

// PyTorch's policy: age = pool lookups since the block became free; release
// whole large segments older than the average age until reserved memory is
// back under the threshold or nothing old enough is left.
void CachingAllocator::collect_garbage() {
  const auto threshold = static_cast<std::size_t>(config_.garbage_collection_threshold *
                                                  static_cast<double>(allowed_bytes_));
  const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes[StatType::aggregate].current);
  if (reserved <= threshold) return;
  const std::size_t target = reserved - threshold;

  std::vector<Block*> candidates;
  std::uint64_t total_age = 0;
  for (Block* b : large_pool_.blocks.all())
    if (!b->is_split() && !b->segment->expandable) {
      candidates.push_back(b);
      total_age += large_pool_.lookups - b->gc_stamp;
    }
  std::size_t reclaimed = 0;
  bool freed_any = true;
  while (reclaimed < target && freed_any && !candidates.empty()) {
    const std::uint64_t age_threshold = total_age / candidates.size();
    freed_any = false;
    for (auto it = candidates.begin(); it != candidates.end() && reclaimed < target;) {
      Block* b = *it;
      const std::uint64_t age = large_pool_.lookups - b->gc_stamp;
      if (age < age_threshold) {
        ++it;
        continue;
      }
      reclaimed += b->size;
      total_age -= age;
      freed_any = true;
      it = candidates.erase(it);
      release_segment(b);
    }
  }
}

void CachingAllocator::report_oom(std::size_t requested, std::size_t rounded, StreamId stream) {
  ++stats_.num_ooms;
  notify(TraceKind::oom, 0, requested, stream);
  if (observer_ == nullptr) return;
  OomReport r;
  r.requested = requested;
  r.rounded = rounded;
  r.stream = stream;
  backend_->mem_info(&r.device_free, &r.device_total);
  r.allowed = allowed_bytes_;
  r.tag_margin = serving_tag_ != kUntagged ? tag_memory_margin_ : 0;
  r.allocated = static_cast<std::size_t>(stats_.allocated_bytes[StatType::aggregate].current);
  r.reserved = static_cast<std::size_t>(stats_.reserved_bytes[StatType::aggregate].current);
  for (BlockPool* pool : {&small_pool_, &large_pool_})
    for (const Block* b : pool->blocks.all())
      if (b->size > r.largest_free_block) r.largest_free_block = b->size;
  observer_->on_oom(device_, r);
}

}  // namespace cachalloc
