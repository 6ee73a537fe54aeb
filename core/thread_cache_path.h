// thread_cache_path.h — the per-thread front cache's hot halves, inline in
// the shim's cuMemAlloc / cuMemFree (included at the end of
// caching_allocator.h).  A hit takes the calling thread's cache lock only;
// everything else is one call into front_path.cpp / free_path.cpp.
#pragma once

namespace cachalloc {

template <bool kMaySlow>
[[gnu::always_inline]] inline bool CachingAllocator::malloc_cached(DevicePtr* out, std::size_t size, StreamId stream) {
  if (size - 1 >= ThreadCache::kMaxBlock) return false;  // size 0 too
  ThreadCache* tc = find_thread_cache(serial_);
  if (tc == nullptr || !tc_usable()) return false;
  const std::size_t rounded = round_size(size, config_);
  if (rounded > ThreadCache::kMaxBlock) return false;
  tc->mutex.lock();
  Block* b = tc->take(rounded, size, stream);
  // A miss worth the locked half: ids ran out, or fences may have completed.
  const bool slow = b == nullptr && (tc->next_id == tc->id_end || tc->fence_count != 0);
  tc->mutex.unlock();
  if (b != nullptr) [[likely]] {
    *out = b->ptr;
    return true;
  }
  return kMaySlow && slow && malloc_cached_slow(out, size, stream, tc);
}

[[gnu::always_inline]] inline Status CachingAllocator::free_cached(DevicePtr ptr, StreamId stream, bool give_tried) {
  ThreadCache* tc = nullptr;
  if (tc_usable()) [[likely]] {
    tc = find_thread_cache(serial_);
    if (tc != nullptr && give_tried) {
      // straight to the locked half
    } else if (tc != nullptr) [[likely]] {
      tc->mutex.lock();
      const bool kept = tc->give(ptr, stream);
      tc->mutex.unlock();
      if (kept) [[likely]] return kSuccess;
    } else {
      tc = create_thread_cache();
    }
  }
  if (tc == nullptr && stream == kAnyStream) return free(ptr);  // the layer is off
  return free_adopt(ptr, stream, tc);
}

[[gnu::always_inline]] inline bool CachingAllocator::give_cached(DevicePtr ptr, StreamId stream) {
  if (!tc_usable()) [[unlikely]] return false;
  ThreadCache* tc = find_thread_cache(serial_);
  if (tc == nullptr) [[unlikely]] return false;
  tc->mutex.lock();
  const bool kept = tc->give(ptr, stream);
  tc->mutex.unlock();
  return kept;
}

[[gnu::always_inline]] inline ThreadCache::GiveFenced CachingAllocator::give_cached_fenced(DevicePtr ptr) {
  if (!tc_usable()) [[unlikely]] return ThreadCache::kNotMine;
  ThreadCache* tc = find_thread_cache(serial_);
  if (tc == nullptr) [[unlikely]] return ThreadCache::kNotMine;
  tc->mutex.lock();
  const ThreadCache::GiveFenced kept = tc->give_fenced(ptr);
  tc->mutex.unlock();
  return kept;
}

[[gnu::always_inline]] inline Status CachingAllocator::free_cached_fenced(DevicePtr ptr, bool give_tried) {
  ThreadCache* tc = nullptr;
  if (tc_usable()) [[likely]] {
    tc = find_thread_cache(serial_);
    if (tc != nullptr && give_tried) {
      // straight to the locked half
    } else if (tc != nullptr) [[likely]] {
      tc->mutex.lock();
      const ThreadCache::GiveFenced kept = tc->give_fenced(ptr);
      tc->mutex.unlock();
      if (kept == ThreadCache::kKept) [[likely]] return kSuccess;
      if (kept == ThreadCache::kFenceDue) {
        fence_thread_batch(tc);
        return kSuccess;
      }
    } else {
      tc = create_thread_cache();
    }
  }
  if (tc == nullptr) return free_deferred(ptr);  // the layer is off
  return free_deferred_adopt(ptr, tc);
}

}  // namespace cachalloc
