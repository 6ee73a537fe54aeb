// allocation_path.cpp — from a request to a live block.
//
//   malloc_locked: round; the held block again (inline), else malloc_miss.
//   malloc_miss:   obtain_block, carve, activate.
//   obtain_block:  cached best fit -> blocks whose fences have completed
//                  (looked at only now, on a miss) -> another stream's free
//                  block, ordered on the device (steal_path.cpp) -> the
//                  threads' front caches -> (garbage collection) -> new
//                  segment -> release one cached segment, retry -> release
//                  all, retry.
//   carve:         split off the tail when it is worth keeping, update stats.
//   (before all of it: the block the last free held unmerged, when the request
//   would carve exactly that block again; reuse_path.cpp)
#include <limits>

#include "reuse_path.h"

namespace cachalloc {

// A carved block becomes live: the live map, its serial, the statistics.
// (inline: malloc_locked is its only caller, on every malloc.)
inline void CachingAllocator::activate(Block* block, bool small, std::size_t requested) {
  set_phase(*block, BlockPhase::allocated);
  block->requested = requested;
  block->id = ++next_id_;
  live_.insert(block->ptr, block);
  const auto bytes = static_cast<std::int64_t>(block->size);
  stats_.allocation.increase(small, 1);
  stats_.allocated_bytes.increase(small, bytes);
  stats_.active.increase(small, 1);
  stats_.active_bytes.increase(small, bytes);
  stats_.requested_bytes.increase(small, static_cast<std::int64_t>(requested));
  if (block->size >= config_.max_split_size) stats_.oversize_allocations.increase(1);
}

// Here, not in caching_allocator.cpp: the held block's reuse
// (reuse_path.h) inlines into it.  The common case first, mimalloc style:
// the held block again for a request that nothing else waits before (as
// malloc_locked checks), with nothing that can throw while the lock is
// held by hand; everything else, and a trace event, out of line, where a
// guard takes the lock over.  (reuse_held changes nothing when it returns
// nullptr, so malloc_locked starts afresh.)  malloc() itself only locks and
// picks: both calls are tail calls, so a miss pays no register saves for
// the reuse.
Status CachingAllocator::malloc(DevicePtr* out, std::size_t size, StreamId stream) {
  mutex_.lock();
  if (held_ != nullptr) [[likely]] return malloc_held(out, size, stream);
  return malloc_slow(out, size, stream);
}

Status CachingAllocator::malloc_held(DevicePtr* out, std::size_t size, StreamId stream) {
  if (out != nullptr && size != 0 && size <= kMaxRequestSize && ledger_.idle()) [[likely]] {
    const std::size_t rounded = round_size(size, config_);
    if (Block* block = reuse_held(pool_for(is_small_request(rounded)), rounded, size, stream)) [[likely]] {
      *out = block->ptr;
      if (observer_ != nullptr && observer_->wants_events()) [[unlikely]] return notify_alloc_unlock(block, stream);
      mutex_.unlock();
      return kSuccess;
    }
  }
  return malloc_slow(out, size, stream);
}

Status CachingAllocator::malloc_slow(DevicePtr* out, std::size_t size, StreamId stream) {
  std::lock_guard lock(mutex_, std::adopt_lock);
  return malloc_locked(out, size, stream);
}

Status CachingAllocator::notify_alloc_unlock(Block* block, StreamId stream) {
  std::lock_guard lock(mutex_, std::adopt_lock);
  send_event(TraceKind::alloc, block->ptr, block->size, stream);
  return kSuccess;
}

// The common case, inline in malloc(): the held block again.  Everything
// else is malloc_miss().
[[gnu::always_inline]] inline Status CachingAllocator::malloc_locked(DevicePtr* out, std::size_t size,
                                                                     StreamId stream) {
  if (out == nullptr || size == 0) return kInvalidValue;
  if (size > kMaxRequestSize) [[unlikely]] {  // rounding it could only overflow
    settle_held();  // the report lists free blocks as merged
    report_oom(size, size, stream);
    return kOutOfMemory;
  }
  // Blocks parked behind events (cross-stream frees) come back first, as in
  // PyTorch: one query per stream with parked blocks.  Fences of deferred
  // frees are looked at only on a miss (obtain_block).
  if (!ledger_.idle()) [[unlikely]] ledger_.process_events();

  const std::size_t rounded = round_size(size, config_);
  BlockPool& pool = pool_for(is_small_request(rounded));
  Block* block = held_ != nullptr ? reuse_held(pool, rounded, size, stream) : nullptr;
  if (block == nullptr) [[unlikely]] {
    Status err = kSuccess;
    block = malloc_miss(pool, size, rounded, stream, &err);
    if (block == nullptr) return err;
  }
  *out = block->ptr;
  notify(TraceKind::alloc, block->ptr, block->size, stream);
  return kSuccess;
}

// A tagged request: the miss path with serving_tag_ set, so that it
// searches and grows only the tag's segments (take_free_block, grow).  The
// held block is never tagged (tagged segments are expandable).
Status CachingAllocator::malloc_tagged(DevicePtr* out, std::size_t size, StreamId stream, TagId tag) {
  if (tag == kUntagged) return malloc(out, size, stream);
  std::lock_guard lock(mutex_);
  if (out == nullptr || size == 0) return kInvalidValue;
  if (tag_state(tag).paused) return kTagPaused;
  if (size > kMaxRequestSize) [[unlikely]] {
    settle_held();
    report_oom(size, size, stream);
    return kOutOfMemory;
  }
  if (!ledger_.idle()) ledger_.process_events();
  const std::size_t rounded = round_size(size, config_);
  BlockPool& pool = pool_for(is_small_request(rounded));
  Status err = kSuccess;
  serving_tag_ = tag;
  Block* block = malloc_miss(pool, size, rounded, stream, &err);
  serving_tag_ = kUntagged;
  if (block == nullptr) return err;
  *out = block->ptr;
  notify(TraceKind::alloc, block->ptr, block->size, stream);
  return kSuccess;
}

// A block from the pools or the device, carved and live; nullptr (and *err)
// when there is none.
Block* CachingAllocator::malloc_miss(BlockPool& pool, std::size_t size, std::size_t rounded, StreamId stream,
                                     Status* err) {
  settle_held();
  Block* block = obtain_block(pool, rounded, stream, err);
  if (block == nullptr) {
    if (*err == kOutOfMemory) report_oom(size, rounded, stream);
    return nullptr;
  }
  block = carve(block, pool, rounded);
  activate(block, pool.small, size);
  return block;
}

Block* CachingAllocator::obtain_block(BlockPool& pool, std::size_t size, StreamId stream, Status* err) {
  if (Block* b = take_free_block(pool, size, stream)) [[likely]] return b;
  // Deferred frees whose fences completed come back before we grow; then
  // waiting frees are joined, or the oldest fences waited for
  // (ledger_fences.cpp).
  if (ledger_.reclaim_pending(size))
    if (Block* b = take_free_block(pool, size, stream)) return b;
  if (ledger_.any_deferred()) [[unlikely]] {
    if (ledger_.join_for(pool.small, size))
      if (Block* b = take_free_block(pool, size, stream)) return b;
    while (ledger_.wait_oldest_fence(size))
      if (Block* b = take_free_block(pool, size, stream)) return b;
  }
  // Before growing: a block another stream freed, this stream made to wait
  // for that stream's work on the device (two driver calls, no host wait).
  // Before the front caches too: flushing every thread's cache at every
  // such miss would cost the other threads their hits.
  if (Block* b = steal_block(pool, size, stream)) return b;
  // Then what threads keep cached in their front caches.
  // (Their fenced frees join the deferred list: worth a join.)
  if (front_.any() && front_.flush(false)) {
    if (Block* b = take_free_block(pool, size, stream)) return b;
    if (ledger_.deferred_unfenced() && ledger_.join_for(pool.small, size))
      if (Block* b = take_free_block(pool, size, stream)) return b;
    if (Block* b = steal_block(pool, size, stream)) return b;
  }
  if (config_.garbage_collection_threshold > 0.0) collect_garbage();
  if (Block* b = grow(pool, size, stream, false, err)) return b;
  if (*err != kOutOfMemory) return nullptr;  // a driver error is not ours to retry
  if (release_one_cached(segment_size_for(size)))
    if (Block* b = grow(pool, size, stream, true, err)) return b;
  if (*err != kOutOfMemory) return nullptr;
  ledger_.synchronize();
  release_all_cached();
  // The flush may have merged blocks on this stream into one that fits.
  if (Block* b = take_free_block(pool, size, stream)) return b;
  return grow(pool, size, stream, true, err);
}

// More memory from the device: a new segment, or pages mapped into the
// stream's expandable segment.
Block* CachingAllocator::grow(BlockPool& pool, std::size_t size, StreamId stream, bool is_retry, Status* err) {
  if (config_.expandable_segments || serving_tag_ != kUntagged) return grow_expandable(pool, size, stream, is_retry, err);
  return new_segment(pool, size, stream, is_retry, err);
}

// Best fit on the caller's stream, honouring max_split_size: a request below
// it never takes an oversize block (that would split it), and an oversize
// request takes an oversize block only if the waste stays under
// max_non_split_rounding.
Block* CachingAllocator::take_free_block(BlockPool& pool, std::size_t size, StreamId stream) {
  if (gc_on_) ++pool.lookups;
  Block* block = serving_tag_ == kUntagged ? pool.blocks.best_fit(stream, size)
                                           : pool.blocks.best_fit_tagged(stream, serving_tag_, size);
  if (block == nullptr || !split_rules_allow(block, size)) return nullptr;
  pool.blocks.erase(block);
  return block;
}

Block* CachingAllocator::new_segment(BlockPool& pool, std::size_t size, StreamId stream, bool is_retry,
                                     Status* err) {
  const std::size_t seg_size = segment_size_for(size);
  if (is_retry) ++stats_.num_alloc_retries;
  // The fraction is a hard cap on what cachalloc holds, whatever the device has.
  const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes[StatType::aggregate].current);
  if (config_.per_process_memory_fraction < 1.0 && reserved + seg_size > allowed_bytes_) {
    *err = kOutOfMemory;
    return nullptr;
  }
  DevicePtr ptr = 0;
  *err = backend_->segment_alloc(seg_size, &ptr);
  if (*err != kSuccess) return nullptr;
  ++stats_.num_device_alloc;

  Block* block = add_segment(new Segment{ptr, seg_size, stream, pool.small, nullptr});
  stats_.reserved_bytes.increase(pool.small, static_cast<std::int64_t>(seg_size));
  if (seg_size >= config_.max_split_size) stats_.oversize_segments.increase(1);
  notify(TraceKind::segment_map, ptr, seg_size, stream);
  return block;
}

// Registers a new segment with one block spanning it; counts the segment.
Block* CachingAllocator::add_segment(Segment* segment) {
  Block* block = make_block();
  block->ptr = segment->base;
  block->size = segment->size;
  block->stream = segment->stream;
  block->segment = segment;
  segment->head = block;
  FreeIndex& index = pool_for(segment->small).blocks;
  segment->bins = segment->tag == kUntagged ? index.bins_for(segment->stream)
                                            : index.tagged_bins_for(segment->stream, segment->tag);
  segments_.emplace(segment->base, segment);
  stats_.segment.increase(segment->small, 1);
  return block;
}

// Cuts a free block (already out of its pool) down to `size`, returning
// the tail to the pool when it is worth keeping; activate() then hands it out.
Block* CachingAllocator::carve(Block* block, BlockPool& pool, std::size_t size) {
  CACHALLOC_ASSERT(block->phase() == BlockPhase::detached && block->size >= size && size % kMinBlockSize == 0,
                   "carve cuts a detached block at least as large as the rounded request");
  CACHALLOC_ASSERT(block->segment->small == pool.small, "carve cuts a block of the request's pool");
  const bool small = pool.small;
  const bool already_split = block->is_split();
  if (should_split(block->size, size, pool)) {
    Block* rest = make_block();
    rest->ptr = block->ptr + size;
    rest->size = block->size - size;
    rest->stream = block->stream;
    rest->segment = block->segment;
    rest->prev = block;
    rest->next = block->next;
    if (rest->next != nullptr) rest->next->prev = rest;
    block->next = rest;
    block->size = size;
    rest->gc_stamp = pool.lookups;
    pool.blocks.insert(rest);
    count_split(small, already_split, size, rest->size);
  } else if (already_split) {
    stats_.inactive_split.decrease(small, 1);
    stats_.inactive_split_bytes.decrease(small, static_cast<std::int64_t>(block->size));
  }
  return block;
}
}  // namespace cachalloc
