// graph_pools.cpp — PyTorch's CUDA graph pools through the pluggable
// allocator (graph_pools.h).
//
// Invariants (under g_mutex):
//   - every block is in exactly one pool and in g_owner (ptr -> pool);
//   - a block is `live` from its allocation to its free; a free block is
//     handed out again only by its own pool, never while its pool is
//     released;
//   - a released pool opens no more; its free blocks are in g_give_back,
//     and its live ones join them when freed;
//   - g_give_back goes to cuMemFree only while no pool is open (PyTorch
//     opens one for every capture, so none is in flight then).
#include "graph_pools.h"

#include <atomic>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "guarded.h"
#include "load_mode.h"
#include "log.h"

namespace cachalloc::shim {
namespace {

using PoolId = std::pair<unsigned long long, unsigned long long>;

struct PoolBlock {
  void* ptr;
  std::size_t size;
  bool live;
  CUstream freed_on;  // the stream of its last free (nullptr: never freed yet)
  bool freed_in_capture;
};

struct Pool {
  int device;
  PoolId id;
  std::function<bool(CUstream)> filter;  // while open
  int opened = 0;                          // begin calls not yet ended
  bool released = false;
  std::vector<PoolBlock> blocks;
};

std::mutex g_mutex;
std::vector<Pool*>& pools() {
  static auto* v = new std::vector<Pool*>();  // leaked: frees may come during exit
  return *v;
}
std::unordered_map<void*, Pool*>& owner() {
  static auto* m = new std::unordered_map<void*, Pool*>();
  return *m;
}
std::vector<void*>& give_back() {
  static auto* v = new std::vector<void*>();
  return *v;
}
std::atomic<std::size_t> g_blocks{0};     // owner().size(), read without the lock
std::atomic<std::size_t> g_bytes{0};
std::atomic<int> g_open{0};               // pools open
std::atomic<std::size_t> g_waiting{0};    // give_back().size()

Pool* find_pool(int device, PoolId id) {
  for (Pool* p : pools())
    if (p->device == device && p->id == id) return p;
  return nullptr;
}

// A free block of `pool` that may serve `size` on `stream`: freed on the
// same stream (graph order), or outside any capture; the smallest that
// fits, wasting at most half of it.
PoolBlock* reusable(Pool& pool, std::size_t size, CUstream stream) {
  PoolBlock* best = nullptr;
  for (PoolBlock& b : pool.blocks) {
    if (b.live || b.size < size || b.size > 2 * size) continue;
    if (b.freed_in_capture && b.freed_on != stream) continue;
    if (best == nullptr || b.size < best->size) best = &b;
  }
  return best;
}

void remove_block(Pool& pool, void* ptr) {
  for (auto it = pool.blocks.begin(); it != pool.blocks.end(); ++it)
    if (it->ptr == ptr) {
      g_bytes.fetch_sub(it->size, std::memory_order_relaxed);
      pool.blocks.erase(it);
      break;
    }
  owner().erase(ptr);
  g_blocks.store(owner().size(), std::memory_order_relaxed);
}

void queue_give_back(Pool& pool, void* ptr) {
  remove_block(pool, ptr);
  give_back().push_back(ptr);
  g_waiting.store(give_back().size(), std::memory_order_relaxed);
}

// Whether `stream` is being captured now (any error counts as capturing).
bool stream_capturing(const RealDriver* d, CUstream stream) {
  if (d->cuStreamIsCapturing == nullptr) return false;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  return d->cuStreamIsCapturing(stream, &status) != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE;
}

void begin(int device, PoolId id, std::function<bool(CUstream)> filter) {
  std::lock_guard lock(g_mutex);
  Pool* p = find_pool(device, id);
  if (p == nullptr) {
    p = new Pool{device, id, {}, 0, false, {}};
    pools().push_back(p);
  }
  if (p->released) {
    // PyTorch does not reopen a released pool; if it did, its old blocks
    // are already on their way back: start afresh.
    p->released = false;
  }
  p->filter = std::move(filter);
  if (p->opened++ == 0) g_open.fetch_add(1, std::memory_order_relaxed);
}

void end(int device, PoolId id) {
  std::lock_guard lock(g_mutex);
  Pool* p = find_pool(device, id);
  if (p == nullptr || p->opened == 0) return;
  if (--p->opened == 0) {
    p->filter = nullptr;
    g_open.fetch_sub(1, std::memory_order_relaxed);
  }
}

void release(int device, PoolId id) {
  std::lock_guard lock(g_mutex);
  Pool* p = find_pool(device, id);
  if (p == nullptr) return;
  if (p->opened != 0) {  // released while open (PyTorch ends a capture first): close it
    p->opened = 0;
    p->filter = nullptr;
    g_open.fetch_sub(1, std::memory_order_relaxed);
  }
  p->released = true;
  std::vector<void*> idle;
  for (const PoolBlock& b : p->blocks)
    if (!b.live) idle.push_back(b.ptr);
  for (void* ptr : idle) queue_give_back(*p, ptr);
}

// Another copy of the library serves the process (load_mode.h): its pools.
// Each caller keeps its own answer (a static per name, not per type).
template <typename Fn>
Fn forwarded(const char* name) {
  return reinterpret_cast<Fn>(other_copy_symbol(name));
}

}  // namespace

CUresult alloc_during_capture(const RealDriver* d, CUdeviceptr* p, std::size_t size) {
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  const bool exchanged =
      d->cuThreadExchangeStreamCaptureMode != nullptr && d->cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS;
  const CUresult r = d->cuMemAlloc_v2(p, size);
  if (exchanged) d->cuThreadExchangeStreamCaptureMode(&mode);
  return r;
}

bool graph_pool_malloc(const RealDriver* d, int device, CUstream stream, std::size_t size, void** out) {
  if (g_open.load(std::memory_order_relaxed) == 0) return false;
  std::lock_guard lock(g_mutex);
  Pool* pool = nullptr;
  for (Pool* p : pools())
    if (p->device == device && p->opened != 0 && p->filter && p->filter(stream)) {
      pool = p;
      break;
    }
  if (pool == nullptr) return false;
  if (PoolBlock* b = reusable(*pool, size, stream)) {
    b->live = true;
    *out = b->ptr;
    return true;
  }
  CUdeviceptr p = 0;
  if (alloc_during_capture(d, &p, size) != CUDA_SUCCESS) {
    *out = nullptr;
    return true;
  }
  pool->blocks.push_back({reinterpret_cast<void*>(p), size, true, nullptr, false});
  owner().emplace(reinterpret_cast<void*>(p), pool);
  g_blocks.store(owner().size(), std::memory_order_relaxed);
  g_bytes.fetch_add(size, std::memory_order_relaxed);
  *out = reinterpret_cast<void*>(p);
  return true;
}

bool graph_pool_free(void* ptr, CUstream stream) {
  if (g_blocks.load(std::memory_order_relaxed) == 0) [[likely]] return false;
  std::lock_guard lock(g_mutex);
  auto it = owner().find(ptr);
  if (it == owner().end()) return false;
  Pool& pool = *it->second;
  const RealDriver* d = real_driver();
  const bool in_capture = d != nullptr && stream_capturing(d, stream);
  if (pool.released) {
    queue_give_back(pool, ptr);
    return true;
  }
  for (PoolBlock& b : pool.blocks)
    if (b.ptr == ptr) {
      if (!b.live)
        cachalloc::obs::logger().error("cachalloc_free({}): a CUDA graph pool's block freed twice", ptr);
      b.live = false;
      b.freed_on = stream;
      b.freed_in_capture = in_capture;
    }
  return true;
}

void give_back_released_pool_blocks(const RealDriver* d) {
  if (g_waiting.load(std::memory_order_relaxed) == 0) [[likely]] return;
  if (g_open.load(std::memory_order_relaxed) != 0) return;
  std::vector<void*> todo;
  {
    std::lock_guard lock(g_mutex);
    if (g_open.load(std::memory_order_relaxed) != 0) return;
    todo.swap(give_back());
    g_waiting.store(0, std::memory_order_relaxed);
  }
  for (void* ptr : todo)
    if (const CUresult r = d->cuMemFree_v2(reinterpret_cast<CUdeviceptr>(ptr)); r != CUDA_SUCCESS)
      cachalloc::obs::logger().error("a released CUDA graph pool's block {}: cuMemFree failed (error {})", ptr,
                          static_cast<int>(r));
}

std::size_t graph_pool_bytes() { return g_bytes.load(std::memory_order_relaxed); }
int open_graph_pools() { return g_open.load(std::memory_order_relaxed); }

}  // namespace cachalloc::shim

// ---- PyTorch's hooks (set_begin_allocate_to_pool, set_end_allocate_to_pool_fn,
// set_release_pool): C++ types, as PyTorch's setters cast the pointer ----
#define CACHALLOC_EXPORT extern "C" __attribute__((visibility("default")))
using cachalloc::shim::forwarded;
using PoolIdArg = std::pair<unsigned long long, unsigned long long>;
using BeginFn = void (*)(int, PoolIdArg, std::function<bool(CUstream)>);
using PoolFn = void (*)(int, PoolIdArg);

CACHALLOC_EXPORT void cachalloc_pluggable_begin_allocate_to_pool(int device, PoolIdArg pool,
                                                                  std::function<bool(CUstream)> filter) {
  static const BeginFn other = forwarded<BeginFn>("cachalloc_pluggable_begin_allocate_to_pool");
  if (BeginFn f = other) return f(device, pool, filter);
  if (!cachalloc::shim::guarded(false, [&] {
        cachalloc::shim::begin(device, pool, std::move(filter));
        return true;
      }))
    cachalloc::obs::logger().error("begin_allocate_to_pool: out of memory; the capture's blocks are kept for good");
}

CACHALLOC_EXPORT void cachalloc_pluggable_end_allocate_to_pool(int device, PoolIdArg pool) {
  static const PoolFn other = forwarded<PoolFn>("cachalloc_pluggable_end_allocate_to_pool");
  if (PoolFn f = other) return f(device, pool);
  cachalloc::shim::end(device, pool);
}

CACHALLOC_EXPORT void cachalloc_pluggable_release_pool(int device, PoolIdArg pool) {
  static const PoolFn other = forwarded<PoolFn>("cachalloc_pluggable_release_pool");
  if (PoolFn f = other) return f(device, pool);
  if (!cachalloc::shim::guarded(false, [&] {
        cachalloc::shim::release(device, pool);
        return true;
      }))
    cachalloc::obs::logger().error("release_pool: out of memory; the pool's blocks stay allocated");
}
