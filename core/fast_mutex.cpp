// fast_mutex.cpp — the slow half of FastMutex: spinning, then the futex.
#include "fast_mutex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace cachalloc {
namespace {

void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t value) {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT_PRIVATE, value, nullptr, nullptr, 0);
}

void futex_wake(std::atomic<std::uint32_t>* word, int n) {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE_PRIVATE, n, nullptr, nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

void FastMutex::lock_contended() {
  // Holders keep the lock for a short critical section: spin a little
  // before sleeping.
  for (int i = 0; i < 100; ++i) {
    cpu_relax();
    std::uint32_t expected = 0;
    if (state_.load(std::memory_order_relaxed) == 0 &&
        state_.compare_exchange_weak(expected, 1, std::memory_order_acquire, std::memory_order_relaxed))
      return;
  }
  // Mark the lock contended (2) and sleep until it is free; a thread that
  // takes it this way leaves it marked 2, so its unlock wakes the next.
  while (state_.exchange(2, std::memory_order_acquire) != 0) futex_wait(&state_, 2);
}

void FastMutex::wake_one() { futex_wake(&state_, 1); }

}  // namespace cachalloc
