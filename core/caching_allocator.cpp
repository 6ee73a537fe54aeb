// caching_allocator.cpp — construction, the locked public entry points,
// lookups, statistics and snapshots.  The algorithms live in
// allocation_path.cpp, free_path.cpp and release_path.cpp (malloc() and
// free() too, beside the paths they run inline), and in the rooms: the
// front (front_path.cpp) and the ledger (ledger_*.cpp).
#include "caching_allocator.h"

#include <algorithm>

namespace cachalloc {

CachingAllocator::CachingAllocator(DeviceBackend* backend, const Config& config, int device)
    : front_(*this, config), backend_(backend), config_(config), device_(device),
      ledger_(*this, backend, config, stats_) {
  std::size_t free_bytes = 0;
  if (backend_->mem_info(&free_bytes, &device_total_) != kSuccess) device_total_ = 0;
  allowed_bytes_ = static_cast<std::size_t>(config_.per_process_memory_fraction *
                                            static_cast<double>(device_total_));
  stats_.max_split_size = static_cast<std::int64_t>(config_.max_split_size);
  // Deferred frees may hold back 1/64 of what the allocator may use (at
  // least 256 MiB) before a free records a fence by itself: a loop over a
  // few large buffers then fences every few frees instead of growing the
  // cache by a segment per free.
  ledger_.set_deferred_bytes_limit(std::max<std::size_t>(256 * MiB, allowed_bytes_ / 64));
}

CachingAllocator::~CachingAllocator() {
  // Live blocks belong to the program; only what is cached goes back.  The
  // shim never destroys allocators at process exit (the driver may be gone).
  // Thread caches give their blocks back and forget this allocator first.
  front_.orphan();
  std::lock_guard lock(mutex_);
  settle_held();
  ledger_.synchronize();
  release_all_cached();
  drop_all_marks();
  for (EventId e : spare_events_) backend_->event_destroy(e);
  for (auto& [tag, ts] : tags_) free_backup_storage(ts);  // host buffers, backup files
  if (staging_ != nullptr) backend_->host_free(staging_);
  release_orphans();
  // (Live blocks too, in whatever phase: deleted, not recycled.)
  for (auto& [base, seg] : segments_) {
    for (Block* b = seg->head; b != nullptr;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
    delete seg;
  }
  for (Block* b : spare_blocks_) delete b;
}

// A block object, detached: the caller places it (block.h's table).
Block* CachingAllocator::make_block() {
  Block* b = nullptr;
  if (spare_blocks_.empty()) {
    b = new Block;
  } else {
    b = spare_blocks_.back();
    spare_blocks_.pop_back();
  }
  set_phase(*b, BlockPhase::detached);
  return b;
}

// Blocks are recycled, not deleted: splits and merges are the hot path.
// make_block() callers set what they need; a dropped block is reset here
// field by field (its stream_uses vector keeps its capacity).  Only a
// block out of every list and map goes: detached (merged away, released),
// retained or unmapped (block.h).
void CachingAllocator::drop_block(Block* block) {
  CACHALLOC_ASSERT(block != held_, "the held block is settled before it is dropped");
  set_phase(*block, BlockPhase::spare);
  block->ptr = 0;
  block->size = block->requested = 0;
  block->stream = 0;
  block->segment = nullptr;
  block->prev = block->next = nullptr;
  block->pending_events = 0;
  block->exported = false;
  block->id = block->gc_stamp = 0;
  block->stream_uses.clear();
  block->free_prev = block->free_next = nullptr;
  block->tc = nullptr;
  block->owner = 0;
  spare_blocks_.push_back(block);
}

Status CachingAllocator::record_stream(DevicePtr ptr, StreamId stream) {
  std::lock_guard lock(mutex_);
  Block* block = find_live(ptr);
  // A thread-owned block becomes a plain live one: its free must now wait.
  if (block != nullptr && block->tc != nullptr) [[unlikely]]
    if ((block = front_.detach(block)) == nullptr) return kInvalidValue;
  if (block == nullptr) return inside_segment(ptr) ? kInvalidValue : kNotOwned;
  // Use on the block's own stream needs no event: stream order covers it.
  if (stream == block->stream) return kSuccess;
  if (std::find(block->stream_uses.begin(), block->stream_uses.end(), stream) == block->stream_uses.end())
    block->stream_uses.push_back(stream);
  return kSuccess;
}

// ------------------------------------------------------------ owner tokens
// The lookups of the owner tokens' entry points; the ledger keeps the
// tokens and their blocks (ledger_owners.cpp says what holding means).

void CachingAllocator::open_owner(std::uint64_t token) {
  std::lock_guard lock(mutex_);
  ledger_.open_owner(token);
}

Status CachingAllocator::hold_for(DevicePtr ptr, std::uint64_t token) {
  std::lock_guard lock(mutex_);
  ledger_.open_owner(token);
  settle_held();
  Block* block = find_live(ptr);
  if (block == nullptr) return inside_segment(ptr) ? kInvalidValue : kNotOwned;
  if (block->tc != nullptr && (block = front_.detach(block)) == nullptr) return kInvalidValue;
  if (block->phase() == BlockPhase::owner_held) return kInvalidValue;
  // `token` replaces an older owner: the shim passes a token whose
  // captures include that owner's live ones (owner_of, graph_owners.h).
  block->owner = token;
  ledger_.hold_for_owner(block);  // (its entry is open: held)
  notify(TraceKind::free, block->ptr, block->size, block->stream);
  return kSuccess;
}

Status CachingAllocator::mark_owner(DevicePtr ptr, std::uint64_t token) {
  std::lock_guard lock(mutex_);
  ledger_.open_owner(token);
  Block* block = find_live(ptr);
  if (block == nullptr) return inside_segment(ptr) ? kInvalidValue : kNotOwned;
  if (block->tc != nullptr && (block = front_.detach(block)) == nullptr) return kInvalidValue;
  if (block->owner == 0) block->owner = token;
  return kSuccess;
}

std::size_t CachingAllocator::release_owner(std::uint64_t token) {
  std::lock_guard lock(mutex_);
  std::size_t bytes = 0;
  for (Block* b : ledger_.release_owner(token, &bytes)) defer_live(b);  // behind a fence over all the context's work
  return bytes;
}

std::uint64_t CachingAllocator::owner_of(DevicePtr ptr) const {
  std::lock_guard lock(mutex_);
  const Block* block = find_live(ptr);
  if (block == nullptr || block->owner == 0 || !ledger_.owner_open(block->owner)) return 0;
  return block->owner;
}

std::size_t CachingAllocator::owner_held_bytes() const {
  std::lock_guard lock(mutex_);
  return static_cast<std::size_t>(stats_.capture_held_bytes.current);
}

// ------------------------------------------------------------------ lookups

bool CachingAllocator::owns(DevicePtr ptr) const {
  std::lock_guard lock(mutex_);
  return inside_segment(ptr);
}

bool CachingAllocator::is_live(DevicePtr ptr) const {
  std::lock_guard lock(mutex_);
  const Block* b = find_live(ptr);
  return b != nullptr && front_.program_live(b);
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  front_.flush(false);
  settle_held();  // the held block's segment may be whole once merged
  ledger_.synchronize();
  release_all_cached();
  notify(TraceKind::empty_cache, 0, 0, 0);
}

void CachingAllocator::empty_tag_cache(TagId tag) {
  if (tag == kUntagged) return;
  std::lock_guard lock(mutex_);
  settle_held();
  ledger_.synchronize();  // the tag's frees waiting on events come back first
  unmap_all_free_pages(&tag);
  notify(TraceKind::empty_cache, 0, 0, 0);
}

void CachingAllocator::reclaim() {
  std::lock_guard lock(mutex_);
  front_.flush(false);  // memory pressure: idle threads' blocks count as releasable
  ledger_.reclaim();
}

void CachingAllocator::set_tag_memory_margin(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  tag_memory_margin_ = bytes;
}

std::size_t CachingAllocator::releasable_bytes() const {
  std::lock_guard lock(mutex_);
  std::size_t total = 0;
  for (const auto& [base, seg] : segments_) {
    if (seg->expandable) {
      total += unmappable_bytes(seg);
      continue;
    }
    // A segment with no live block is releasable: its blocks are free or
    // only wait on events, which empty_cache() completes before releasing.
    bool any_live = false;
    for (const Block* b = seg->head; b != nullptr && !any_live; b = b->next) any_live = b->is_allocated();
    if (!any_live) total += seg->size;
  }
  return total;
}

DeviceStats CachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  front_.lock_all();
  DeviceStats s = settled_stats();
  front_.unlock_all();
  return s;
}

// (The thread caches' locks held: their unmerged deltas count.)
DeviceStats CachingAllocator::settled_stats() const {
  if (held_ == nullptr && !front_.any()) return stats_.get();
  AllocatorStats s = stats_;
  if (held_ != nullptr) count_held_free(s, held_);
  front_.add_deltas(s);
  return s.get();
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard lock(mutex_);
  // The reuse of a held block moves no current and compares only the peaks
  // its free and reuse could reach, which is exact only while no peak was
  // lowered since its free.  Thread caches' deltas merge first, likewise.
  settle_held();
  front_.merge_all_deltas();
  stats_.reset_peak();
}

void CachingAllocator::reset_accumulated_stats() {
  std::lock_guard lock(mutex_);
  settle_held();  // its free counts before the reset (its reuse only adds to the counts)
  front_.merge_all_deltas();  // so do the thread caches' deltas
  stats_.reset_accumulated();
  accumulated_reset_ = true;
}

void CachingAllocator::set_observer(AllocatorObserver* observer) {
  std::lock_guard lock(mutex_);
  observer_ = observer;
  front_.set_observer_flag(observer != nullptr ? observer->events_flag() : nullptr, observer != nullptr);
}

std::vector<SegmentInfo> CachingAllocator::snapshot() {
  std::lock_guard lock(mutex_);
  front_.flush(true);  // their blocks then read as the program holds them
  settle_held();  // a snapshot shows free blocks merged, as the statistics count them
  std::vector<SegmentInfo> out;
  out.reserve(segments_.size());
  for (const auto& [base, seg] : segments_) {
    SegmentInfo info{seg->base, seg->size, seg->stream, seg->small, seg->expandable, {}};
    info.tag = seg->tag;
    info.paused_bytes = seg->paused_pages * seg->page;
    for (const Block* b = seg->head; b != nullptr; b = b->next) {
      const BlockPhase phase = b->phase();
      const BlockState state = phase == BlockPhase::unmapped ? BlockState::unmapped
                               : b->is_allocated()          ? BlockState::allocated
                               : b->pending_events || phase == BlockPhase::retained ? BlockState::pending_free
                                                            : BlockState::inactive;
      info.blocks.push_back({b->ptr, b->size, b->is_allocated() ? b->requested : 0, state, b->stream});
    }
    out.push_back(std::move(info));
  }
  return out;
}

bool CachingAllocator::inside_segment(DevicePtr ptr) const {
  auto it = segments_.upper_bound(ptr);
  if (it == segments_.begin()) return false;
  --it;
  return ptr < it->second->base + it->second->size;
}

void CachingAllocator::send_event(TraceKind kind, DevicePtr ptr, std::size_t size, StreamId stream) {
  // (A held block's free is not counted in stats_ yet: hold() notifies it.)
  const std::int64_t held = held_ != nullptr ? static_cast<std::int64_t>(held_->size) : 0;
  const TraceEvent event{kind, ptr, size, stream, stats_.allocated_bytes[StatType::aggregate].current - held,
                         stats_.reserved_bytes[StatType::aggregate].current};
  observer_->on_event(device_, event);
}

}  // namespace cachalloc
