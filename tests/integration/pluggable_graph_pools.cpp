// pluggable_graph_pools.cpp — PyTorch's CUDA graph pools through the
// pluggable allocator (shim/graph_pools.h) on the fake libcuda.so.1, with
// libcachalloc.so dlopen'ed as torch.cuda.memory.CUDAPluggableAllocator
// loads it.  The hooks are called as PyTorch's wrapper calls them: through
// function pointers of the C++ types its setters cast to, with
// torch.cuda.graph's capture mode (global) and filter (the stream's capture).
//
// Usage: pluggable_graph_pools CASE LIBCACHALLOC
//   pools        a capture's allocations come from its pool (the driver's
//                memory, allocated despite the global-mode capture); a block
//                freed during the capture serves the capture's next request
//                of its size on the same stream; after the capture nothing
//                but the pool gets its blocks; once the pool is released,
//                its blocks go back to the driver (the live one when freed)
//   other_stream a block freed during the capture on another stream is not
//                reused by the capture (no order between the two)
//   shared       a second capture into the same pool reuses blocks freed
//                after the first (PyTorch's pools shared between graphs)
//   no_hooks     without the hooks, a global-mode capture still gets memory
//                (kept for good, as before)
//   filtered     an open pool whose filter refuses the stream leaves its
//                allocations to the no-hooks rule
#include <dlfcn.h>
#include <sys/types.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <utility>

#include <cuda.h>
#include <cudaTypedefs.h>

extern "C" {
#include "driver_api.h"
#include "fake_libcuda.h"
}

#define CHECK(cond)                                                                     \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);     \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)
#define CHECK_CU(call) CHECK((call) == CUDA_SUCCESS)

namespace {

constexpr size_t MiB = 1 << 20;
using PoolId = std::pair<unsigned long long, unsigned long long>;
using Filter = std::function<bool(CUstream)>;

struct {
  PFN_cuInit_v2000 init;
  PFN_cuDevicePrimaryCtxRetain_v7000 retain;
  PFN_cuCtxSetCurrent_v4000 set_current;
  PFN_cuStreamCreate_v2000 stream_create;
  PFN_cuStreamBeginCapture_v10010 begin_capture;
  PFN_cuStreamEndCapture_v10000 end_capture;
  void (*fake_stats)(struct fake_cuda_stats_t*);
} D;

struct {
  void* (*malloc)(ssize_t, int, CUstream);
  void (*free)(void*, ssize_t, int, CUstream);
  void (*begin)(int, PoolId, Filter);
  void (*end)(int, PoolId);
  void (*release)(int, PoolId);
} C;

fake_cuda_stats_t stats() {
  fake_cuda_stats_t s;
  D.fake_stats(&s);
  return s;
}

int setup(const char* lib) {
  CHECK(driver_api_open("dlsym"));
#define L(table, field, name) *(void**)&table.field = driver_api_symbol(name)
  L(D, init, "cuInit");
  L(D, retain, "cuDevicePrimaryCtxRetain");
  L(D, set_current, "cuCtxSetCurrent");
  L(D, stream_create, "cuStreamCreate");
  L(D, begin_capture, "cuStreamBeginCapture_v2");
  L(D, end_capture, "cuStreamEndCapture");
  L(D, fake_stats, "fake_cuda_stats");
#undef L
  CHECK(driver_api_complete(&D, sizeof D));
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);  // what ctypes.CDLL does
  CHECK(h != nullptr);
  *(void**)&C.malloc = dlsym(h, "cachalloc_malloc");
  *(void**)&C.free = dlsym(h, "cachalloc_free");
  *(void**)&C.begin = dlsym(h, "cachalloc_pluggable_begin_allocate_to_pool");
  *(void**)&C.end = dlsym(h, "cachalloc_pluggable_end_allocate_to_pool");
  *(void**)&C.release = dlsym(h, "cachalloc_pluggable_release_pool");
  CHECK(driver_api_complete(&C, sizeof C));
  CUcontext ctx;
  CHECK_CU(D.init(0));
  CHECK_CU(D.retain(&ctx, 0));
  CHECK_CU(D.set_current(ctx));
  return 0;
}

// torch.cuda.graph's filter: the stream belongs to this capture.
Filter capture_of(CUstream s) {
  return [s](CUstream other) { return other == s; };
}

int pools() {
  CUstream s, side;
  CHECK_CU(D.stream_create(&s, 0));
  CHECK_CU(D.stream_create(&side, 0));
  const PoolId pool{1, 0};
  const fake_cuda_stats_t st0 = stats();
  C.begin(0, pool, capture_of(s));
  CHECK_CU(D.begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  void* p = C.malloc(MiB, 0, s);
  void* q = C.malloc(2 * MiB, 0, s);
  CHECK(p != nullptr && q != nullptr);
  CHECK(stats().mem_alloc == st0.mem_alloc + 2);  // the driver's, despite the global capture
  C.free(p, MiB, 0, s);                           // freed in the capture, on s:
  void* p2 = C.malloc(MiB, 0, s);                 // the capture's next request of that size
  CHECK(p2 == p);
  CHECK(stats().mem_alloc == st0.mem_alloc + 2);
  C.free(q, 2 * MiB, 0, s);
  CUgraph g = nullptr;
  CHECK_CU(D.end_capture(s, &g));
  C.end(0, pool);
  // After the capture the graph still owns p and q: nothing else gets them.
  void* r = C.malloc(2 * MiB, 0, s);
  void* t = C.malloc(MiB, 0, side);
  CHECK(r != nullptr && r != q && r != p && t != p && t != q);
  C.free(r, 2 * MiB, 0, s);
  C.free(t, MiB, 0, side);
  CHECK(stats().mem_free == st0.mem_free);
  // The graph is destroyed: q (free) goes back at the next call outside a
  // capture, p (the graph's output, still live) when it is freed.
  C.release(0, pool);
  void* u = C.malloc(MiB, 0, s);
  CHECK(stats().mem_free == st0.mem_free + 1);
  C.free(p, MiB, 0, s);
  C.free(u, MiB, 0, s);
  CHECK(stats().mem_free == st0.mem_free + 2);
  return 0;
}

int other_stream() {
  CUstream s, side;
  CHECK_CU(D.stream_create(&s, 0));
  CHECK_CU(D.stream_create(&side, 0));
  const PoolId pool{2, 0};
  C.begin(0, pool, [s, side](CUstream o) { return o == s || o == side; });
  CHECK_CU(D.begin_capture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  CHECK_CU(D.begin_capture(side, CU_STREAM_CAPTURE_MODE_RELAXED));
  void* p = C.malloc(MiB, 0, side);
  C.free(p, MiB, 0, side);
  void* q = C.malloc(MiB, 0, s);  // no order between side and s in the graph
  CHECK(q != nullptr && q != p);
  void* p2 = C.malloc(MiB, 0, side);  // side's own order
  CHECK(p2 == p);
  CUgraph g = nullptr;
  CHECK_CU(D.end_capture(side, &g));
  CHECK_CU(D.end_capture(s, &g));
  C.end(0, pool);
  C.free(q, MiB, 0, s);
  C.free(p2, MiB, 0, side);
  C.release(0, pool);
  return 0;
}

int shared() {
  CUstream s;
  CHECK_CU(D.stream_create(&s, 0));
  const PoolId pool{3, 0};
  C.begin(0, pool, capture_of(s));
  CHECK_CU(D.begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  void* out = C.malloc(MiB, 0, s);  // the first graph's output
  CUgraph g = nullptr;
  CHECK_CU(D.end_capture(s, &g));
  C.end(0, pool);
  C.free(out, MiB, 0, s);           // freed after the capture
  const fake_cuda_stats_t st = stats();
  C.begin(0, pool, capture_of(s));  // a second graph captured into the same pool
  CHECK_CU(D.begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  void* again = C.malloc(MiB, 0, s);
  CHECK(again == out);
  CHECK(stats().mem_alloc == st.mem_alloc);
  CHECK_CU(D.end_capture(s, &g));
  C.end(0, pool);
  C.free(again, MiB, 0, s);
  C.release(0, pool);
  return 0;
}

int no_hooks() {
  CUstream s;
  CHECK_CU(D.stream_create(&s, 0));
  CHECK_CU(D.begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  void* p = C.malloc(MiB, 0, s);
  CHECK(p != nullptr);  // the thread's mode relaxed for the driver's cuMemAlloc
  CUgraph g = nullptr;
  CHECK_CU(D.end_capture(s, &g));
  C.free(p, MiB, 0, s);
  const fake_cuda_stats_t st = stats();
  void* q = C.malloc(MiB, 0, s);
  CHECK(q != p);  // kept for good
  C.free(q, MiB, 0, s);
  CHECK(stats().mem_free == st.mem_free);
  return 0;
}

int filtered() {
  CUstream s, other;
  CHECK_CU(D.stream_create(&s, 0));
  CHECK_CU(D.stream_create(&other, 0));
  const PoolId pool{4, 0};
  C.begin(0, pool, capture_of(other));  // a pool for another stream's capture
  CHECK_CU(D.begin_capture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  void* p = C.malloc(MiB, 0, s);
  CHECK(p != nullptr);
  C.free(p, MiB, 0, s);
  void* q = C.malloc(MiB, 0, s);
  CHECK(q != p);  // not the pool's: kept for good, never reused
  CUgraph g = nullptr;
  CHECK_CU(D.end_capture(s, &g));
  C.end(0, pool);
  C.release(0, pool);
  const fake_cuda_stats_t st = stats();
  C.free(q, MiB, 0, s);
  void* r = C.malloc(MiB, 0, s);
  CHECK(r != p && r != q);
  C.free(r, MiB, 0, s);
  CHECK(stats().mem_free == st.mem_free);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  if (setup(argv[2]) != 0) return 1;
  const char* c = argv[1];
  if (std::strcmp(c, "pools") == 0) return pools();
  if (std::strcmp(c, "other_stream") == 0) return other_stream();
  if (std::strcmp(c, "shared") == 0) return shared();
  if (std::strcmp(c, "no_hooks") == 0) return no_hooks();
  if (std::strcmp(c, "filtered") == 0) return filtered();
  std::fprintf(stderr, "unknown case %s\n", c);
  return 2;
}
