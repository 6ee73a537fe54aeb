// thread_counts.h — the per-entry call counts of the dump, kept per thread.
//
// Every hooked call counts itself.  One shared atomic per entry cost two
// locked adds per cached pair (about 13 ns of 80 on the fake driver) and
// bounced one cache line between all threads that allocate.  Instead each
// thread counts in a block of its own (a relaxed load and store: one
// writer, no lock prefix), reached through one initial-exec TLS pointer.
// Blocks are never freed: they sit on an append-only list that a report
// walks without a lock (async-signal-safe), and a thread's exit (a pthread
// key destructor) only marks its block free for the next new thread, which
// keeps adding to it, so the sum over the list is always the process total.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "obs/process_report.h"

namespace cachalloc::shim {

constexpr int kEntries = static_cast<int>(obs::Entry::count);

struct alignas(64) ThreadCounts {  // its own lines: written on every call
  std::array<std::atomic<std::uint64_t>, kEntries> calls{};
  std::atomic<bool> in_use{true};   // a live thread owns it (the only writer)
  ThreadCounts* next = nullptr;     // the list of every block; set before it is published
};

namespace detail {
extern constinit thread_local ThreadCounts* t_counts __attribute__((tls_model("initial-exec")));
// A free block, or a new one, for this thread (its first counted call).
[[gnu::cold, gnu::noinline]] ThreadCounts* adopt_thread_counts();
}  // namespace detail

inline void count_call(obs::Entry e) {
  ThreadCounts* t = detail::t_counts;
  if (t == nullptr) [[unlikely]] t = detail::adopt_thread_counts();
  std::atomic<std::uint64_t>& c = t->calls[static_cast<int>(e)];
  c.store(c.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

// The process's totals: the sum over every block ever made.
std::array<std::uint64_t, kEntries> total_calls();

}  // namespace cachalloc::shim
