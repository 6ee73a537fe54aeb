// fast_mutex.h — the allocator's lock: one atomic exchange when free.
//
// A cached malloc+free pair takes the allocator's lock twice, and
// pthread_mutex_lock/unlock cost about 110 instructions for the pair.
// This is the classic three-state futex mutex (Drepper, "Futexes are
// tricky", mutex3): 0 free, 1 locked, 2 locked with waiters.  Uncontended
// lock and unlock are one atomic each with no system call; a contended
// lock spins briefly (holders keep it for a few hundred nanoseconds), then
// sleeps in the kernel.  Meets the BasicLockable requirements, so
// std::lock_guard works with it.
#pragma once

#include <atomic>
#include <cstdint>

namespace cachalloc {

class FastMutex {
 public:
  // Always inline: the thread caches take their own lock twice per cached
  // pair, and an out-of-line unlock cost a call on each.
  [[gnu::always_inline]] void lock() {
    std::uint32_t expected = 0;
    if (state_.compare_exchange_strong(expected, 1, std::memory_order_acquire, std::memory_order_relaxed))
        [[likely]]
      return;
    lock_contended();
  }
  [[gnu::always_inline]] void unlock() {
    if (state_.exchange(0, std::memory_order_release) == 2) [[unlikely]] wake_one();
  }
  bool try_lock() {
    std::uint32_t expected = 0;
    return state_.compare_exchange_strong(expected, 1, std::memory_order_acquire, std::memory_order_relaxed);
  }

 private:
  void lock_contended();
  void wake_one();

  std::atomic<std::uint32_t> state_{0};
};

}  // namespace cachalloc
