// thread_cache.cpp — the registry of the per-thread front caches: each
// thread's list of caches, the thread-exit hook that gives them back, the
// fork child handler, and the allocators' serials.  It knows an allocator
// only through the retire function the allocator hands it
// (prepare_thread_cache); the allocator's locked halves of the caches
// (creation, adoption, detaching, flushing, statistic merges) are in
// front_path.cpp.  thread_cache.h states the design and its invariants;
// the lock-free halves (take, give) are inline there.
#include "thread_cache.h"

#include <pthread.h>

#include <atomic>
#include <mutex>
#include <new>

namespace cachalloc {

thread_local constinit ThreadSlot t_thread_slot{};

namespace {

std::atomic<std::uint64_t> g_serial{0};

// Guards the link between threads' caches and allocators: a thread exit and
// an allocator's destruction never run into each other.  Never destroyed
// (threads may exit during static destruction): a union does not run its
// member's destructor.
union RegistryMutex {
  std::mutex m;
  constexpr RegistryMutex() : m() {}
  ~RegistryMutex() {}
};
constinit RegistryMutex g_registry;
std::once_flag g_fork_once;

// fork()'s child (pthread_atfork), in the one thread that forked, before
// fork returns.  Every lock and cache the child got is a copy of the
// parent's, in whatever state another thread had it: a lock held by a
// thread that does not exist here would be held forever.  The forking
// thread's caches (the only ones whose thread exists here) are forgotten
// — never touched, leaked — so neither its exit hook nor any allocation
// reaches them, and the registry's mutex starts afresh for caches the
// child may make.  Nothing else in the child touches the parent's caches:
// the other threads are gone, and the shim serves no call in a child
// (shim/process_state.h, Mode::forked).  (Issue 34: a forked thread's exit
// hook waited on the allocator's lock, held in the parent at fork time.)
void in_fork_child() {
  ThreadSlot& s = t_thread_slot;
  const bool key_set = s.key_set;  // the key's value survives fork: its destructor still runs
  s = ThreadSlot{};
  s.key_set = key_set;
  new (&g_registry.m) std::mutex;
}

// Registers the child handler before the registry is first used, so before
// any cache exists (a process that never caches registers nothing).
// False if it could not be registered: then no cache is made (a forked
// thread's exit would reach the parent's locks).
bool g_fork_ok = false;
bool fork_handler_registered() {
  std::call_once(g_fork_once, [] { g_fork_ok = pthread_atfork(nullptr, nullptr, in_fork_child) == 0; });
  return g_fork_ok;
}
std::mutex& registry() {
  (void)fork_handler_registered();
  return g_registry.m;
}

pthread_key_t g_key;
std::once_flag g_key_once;
bool g_key_ok = false;
RetireThreadCache g_retire = nullptr;  // set with the key, before any exit hook can run

// pthread key destructor: runs at a thread's exit (not for the main thread
// at exit(), when nothing must happen).  Its caches give their blocks back
// to live allocators and are freed.  In a forked child the forking thread's
// list is empty (in_fork_child): nothing of the parent's is touched.
void on_thread_exit(void*) {
  ThreadSlot& s = t_thread_slot;
  ThreadCache* list = s.list;
  {
    std::lock_guard g(registry());
    for (ThreadCache* tc = list; tc != nullptr; tc = tc->next_in_thread)
      if (tc->front != nullptr) g_retire(tc);
  }
  while (list != nullptr) {
    ThreadCache* next = list->next_in_thread;
    delete list;
    list = next;
  }
  s = ThreadSlot{};
}

}  // namespace

std::mutex& thread_cache_registry() { return registry(); }

bool prepare_thread_cache(RetireThreadCache retire) {
  std::call_once(g_key_once, [retire] {
    g_retire = retire;
    g_key_ok = pthread_key_create(&g_key, on_thread_exit) == 0;
  });
  if (!g_key_ok) return false;  // no exit hook, no cache: it could strand memory
  return fork_handler_registered();  // false: a forked child would retire it
}

void drop_orphaned_thread_caches() {
  ThreadSlot& s = t_thread_slot;
  for (ThreadCache** link = &s.list; *link != nullptr;) {
    ThreadCache* old = *link;
    if (old->front == nullptr) {
      *link = old->next_in_thread;
      if (s.last == old) s.last = nullptr;
      delete old;
    } else {
      link = &old->next_in_thread;
    }
  }
}

void link_thread_cache(ThreadCache* tc, std::uint64_t serial) {
  ThreadSlot& s = t_thread_slot;
  tc->next_in_thread = s.list;
  s.list = tc;
  s.last = tc;
  s.last_serial = serial;
  if (!s.key_set) {
    pthread_setspecific(g_key, &s);  // any non-null value: the destructor runs
    s.key_set = true;
  }
}

std::uint64_t next_allocator_serial() { return g_serial.fetch_add(1, std::memory_order_relaxed) + 1; }

ThreadCache* find_thread_cache_slow(std::uint64_t serial) {
  ThreadSlot& s = t_thread_slot;
  for (ThreadCache* tc = s.list; tc != nullptr; tc = tc->next_in_thread)
    if (tc->alloc_serial == serial) {
      s.last = tc;
      s.last_serial = serial;
      return tc;
    }
  s.last = nullptr;
  s.last_serial = serial;
  return nullptr;
}

}  // namespace cachalloc
