// thread_counts.cpp — blocks of per-thread call counts (thread_counts.h).
#include "thread_counts.h"

#include <pthread.h>

namespace cachalloc::shim {
namespace detail {
constinit thread_local ThreadCounts* t_counts __attribute__((tls_model("initial-exec"))) = nullptr;
}  // namespace detail

namespace {

std::atomic<ThreadCounts*> g_blocks{nullptr};  // append-only list
pthread_key_t g_exit_key;
pthread_once_t g_key_once = PTHREAD_ONCE_INIT;

// A thread's exit hands its block to the next thread; the counts stay in it.
// The destructor runs in the exiting thread: its pointer is cleared, so a
// hooked call from a later destructor of the same thread adopts a block
// again instead of writing to one that another thread may now own.
void release_block(void* block) {
  detail::t_counts = nullptr;
  static_cast<ThreadCounts*>(block)->in_use.store(false, std::memory_order_release);
}

void create_key() { pthread_key_create(&g_exit_key, release_block); }

ThreadCounts* reuse_free_block() {
  for (ThreadCounts* b = g_blocks.load(std::memory_order_acquire); b != nullptr; b = b->next) {
    bool free = false;
    if (!b->in_use.load(std::memory_order_relaxed)) {
      if (b->in_use.compare_exchange_strong(free, true, std::memory_order_acq_rel)) return b;
    }
  }
  return nullptr;
}

ThreadCounts* new_block() {
  auto* b = new ThreadCounts;
  ThreadCounts* head = g_blocks.load(std::memory_order_relaxed);
  do b->next = head;
  while (!g_blocks.compare_exchange_weak(head, b, std::memory_order_release, std::memory_order_relaxed));
  return b;
}

}  // namespace

ThreadCounts* detail::adopt_thread_counts() {
  pthread_once(&g_key_once, create_key);
  ThreadCounts* b = reuse_free_block();
  if (b == nullptr) b = new_block();
  pthread_setspecific(g_exit_key, b);
  t_counts = b;
  return b;
}

std::array<std::uint64_t, kEntries> total_calls() {
  std::array<std::uint64_t, kEntries> sum{};
  for (const ThreadCounts* b = g_blocks.load(std::memory_order_acquire); b != nullptr; b = b->next)
    for (int e = 0; e < kEntries; ++e) sum[e] += b->calls[e].load(std::memory_order_relaxed);
  return sum;
}

}  // namespace cachalloc::shim
