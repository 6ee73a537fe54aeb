// pluggable_reset.cu — cudaDeviceReset under the pluggable ABI (libcachalloc.so
// dlopen'ed, as PyTorch's CUDAPluggableAllocator loads it: passive, no hook
// sees the reset).  cachalloc must notice that device 0's primary context is
// no longer the one its cache was made in, drop that cache without touching
// the dead memory, and serve from a fresh one.
//
//   pluggable_reset [LIBCACHALLOC]     else $CACHALLOC_LIBRARY
//
// Run WITHOUT LD_PRELOAD (tests/gpu/run_under_shim.sh without --shim does
// that).  Steps, each allocation checked with a cudaMemset + cudaMemcpy round
// trip of its whole size:
//   1. cachalloc_malloc three blocks; free two (cached), keep one.
//   2. cudaDeviceReset, then cachalloc_malloc right away (nothing has
//      retained the primary context since: cachalloc must retain it again);
//      the block kept in 1 is freed (it died with the context: ignored).
//   3. Again with cudart re-initializing the device first (cudaFree(0)):
//      the same handle, a new context.
//   4. cachalloc's stats JSON shows the two dead caches ("context_destroyed").
// and prints, as FACT lines, what the driver says before and after each
// reset: cuCtxGetId of the current context and of the primary handle, the
// primary context's handle (cuDevicePrimaryCtxRetain/Release pair while it
// is active), cuDevicePrimaryCtxGetState (flags, active).
//
// Prints `pluggable_reset: PASS` (exit 0) or `pluggable_reset: FAIL <why>`
// (exit 1); exit 77 when no GPU can be used.
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <sys/types.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr size_t kMiB = size_t(1) << 20;

struct Cachalloc {
  void* (*malloc)(ssize_t, int, CUstream) = nullptr;
  void (*free)(void*, ssize_t, int, CUstream) = nullptr;
  int (*stats_json_size)(size_t*) = nullptr;
  int (*stats_json)(char*, size_t) = nullptr;
} C;

int g_failures = 0;

void fail(const char* what) {
  std::printf("pluggable_reset: check failed: %s\n", what);
  ++g_failures;
}

#define EXPECT(cond)      \
  do {                    \
    if (!(cond)) {        \
      fail(#cond);        \
      return false;       \
    }                     \
  } while (0)

#define EXPECT_RT(call)                                                                   \
  do {                                                                                    \
    cudaError_t e_ = (call);                                                              \
    if (e_ != cudaSuccess) {                                                              \
      std::printf("pluggable_reset: %s -> %s (%d)\n", #call, cudaGetErrorName(e_), (int)e_); \
      fail(#call);                                                                        \
      return false;                                                                       \
    }                                                                                     \
  } while (0)

const char* cu_name(CUresult r) {
  const char* n = nullptr;
  return cuGetErrorName(r, &n) == CUDA_SUCCESS && n != nullptr ? n : "?";
}

// FACT lines: what the driver says about device 0's contexts now.  Never
// retains the primary context unless it is active (a retain would revive
// it after a reset, which is what the test must leave to cachalloc).
void facts(const char* when, CUcontext remembered_primary) {
  CUcontext cur = nullptr;
  CUresult r = cuCtxGetCurrent(&cur);
  std::printf("FACT %-28s cuCtxGetCurrent -> %s, ctx %p\n", when, cu_name(r), (void*)cur);
  unsigned long long id = 0;
  r = cuCtxGetId(nullptr, &id);
  std::printf("FACT %-28s cuCtxGetId(current) -> %s (%d), id %llu\n", when, cu_name(r), (int)r,
              r == CUDA_SUCCESS ? id : 0ULL);
  if (remembered_primary != nullptr) {
    id = 0;
    r = cuCtxGetId(remembered_primary, &id);
    std::printf("FACT %-28s cuCtxGetId(primary handle %p) -> %s (%d), id %llu\n", when, (void*)remembered_primary,
                cu_name(r), (int)r, r == CUDA_SUCCESS ? id : 0ULL);
  }
  unsigned int flags = 0;
  int active = -1;
  r = cuDevicePrimaryCtxGetState(0, &flags, &active);
  std::printf("FACT %-28s cuDevicePrimaryCtxGetState -> %s, flags 0x%x, active %d\n", when, cu_name(r), flags,
              active);
  if (r == CUDA_SUCCESS && active != 0) {
    CUcontext primary = nullptr;
    r = cuDevicePrimaryCtxRetain(&primary, 0);
    if (r == CUDA_SUCCESS) cuDevicePrimaryCtxRelease(0);
    std::printf("FACT %-28s primary context handle %p (%s)\n", when, (void*)primary, cu_name(r));
  } else {
    std::printf("FACT %-28s primary context handle: not asked (inactive)\n", when);
  }
}

// The primary handle while it is active (a retain/release pair changes nothing then).
CUcontext active_primary() {
  CUcontext primary = nullptr;
  if (cuDevicePrimaryCtxRetain(&primary, 0) != CUDA_SUCCESS) return nullptr;
  cuDevicePrimaryCtxRelease(0);
  return primary;
}

// `p` holds `size` bytes of device memory of the current context: a memset
// with `value` and a copy back see every byte; the pointer's context is the
// primary context.
bool round_trip(void* p, size_t size, unsigned char value) {
  EXPECT(p != nullptr);
  cudaPointerAttributes attr{};
  EXPECT_RT(cudaPointerGetAttributes(&attr, p));
  EXPECT(attr.type == cudaMemoryTypeDevice);
  EXPECT(attr.device == 0);
  CUcontext owner = nullptr;
  CUresult r = cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, reinterpret_cast<CUdeviceptr>(p));
  if (r != CUDA_SUCCESS) std::printf("pluggable_reset: cuPointerGetAttribute(CONTEXT, %p) -> %s\n", p, cu_name(r));
  EXPECT(r == CUDA_SUCCESS);
  EXPECT(owner == active_primary());
  EXPECT_RT(cudaMemset(p, value, size));
  std::vector<unsigned char> host(size, static_cast<unsigned char>(~value));
  EXPECT_RT(cudaMemcpy(host.data(), p, size, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < size; ++i)
    if (host[i] != value) {
      std::printf("pluggable_reset: byte %zu of %p is 0x%02x, expected 0x%02x\n", i, p, host[i], value);
      fail("round trip");
      return false;
    }
  return true;
}

bool load(const char* path) {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);  // what ctypes.CDLL does
  if (h == nullptr) {
    std::printf("pluggable_reset: dlopen %s: %s\n", path, dlerror());
    return false;
  }
  *(void**)&C.malloc = dlsym(h, "cachalloc_malloc");
  *(void**)&C.free = dlsym(h, "cachalloc_free");
  *(void**)&C.stats_json_size = dlsym(h, "cachalloc_stats_json_size");
  *(void**)&C.stats_json = dlsym(h, "cachalloc_stats_json");
  EXPECT(C.malloc != nullptr && C.free != nullptr && C.stats_json_size != nullptr && C.stats_json != nullptr);
  return true;
}

int count(const std::string& text, const char* needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

bool run() {
  EXPECT_RT(cudaSetDevice(0));
  EXPECT_RT(cudaFree(nullptr));  // the primary context, initialized by cudart
  const CUcontext primary = active_primary();
  EXPECT(primary != nullptr);
  facts("start", primary);

  // 1. Three blocks; two cached, one kept across the reset.
  void* a = C.malloc(kMiB, 0, nullptr);
  void* kept = C.malloc(4096, 0, nullptr);
  void* c = C.malloc(3 * kMiB, 0, nullptr);
  if (!round_trip(a, kMiB, 0x11) || !round_trip(kept, 4096, 0x22) || !round_trip(c, 3 * kMiB, 0x33)) return false;
  C.free(a, kMiB, 0, nullptr);
  C.free(c, 3 * kMiB, 0, nullptr);
  void* again = C.malloc(kMiB, 0, nullptr);  // served from the cache: the cache is in use
  EXPECT(again == a);
  C.free(again, kMiB, 0, nullptr);
  std::printf("before reset 1: cached %p (1 MiB) and %p (3 MiB), kept %p (4 KiB)\n", a, c, kept);

  // 2. Reset, then cachalloc first.
  EXPECT_RT(cudaDeviceReset());
  facts("after reset 1", primary);
  void* p = C.malloc(kMiB, 0, nullptr);  // must not be the dead cached block
  void* q = C.malloc(3 * kMiB, 0, nullptr);
  facts("after cachalloc_malloc", primary);
  std::printf("after reset 1: cachalloc_malloc gave %p (1 MiB) and %p (3 MiB)\n", p, q);
  if (!round_trip(p, kMiB, 0x44) || !round_trip(q, 3 * kMiB, 0x55)) return false;
  C.free(kept, 4096, 0, nullptr);  // died with the old context: ignored, no crash
  C.free(p, kMiB, 0, nullptr);
  C.free(q, 3 * kMiB, 0, nullptr);
  void* r = C.malloc(kMiB, 0, nullptr);  // the new cache serves again
  EXPECT(r == p);
  if (!round_trip(r, kMiB, 0x66)) return false;
  C.free(r, kMiB, 0, nullptr);

  // 3. Reset, then cudart re-initializes the device before cachalloc's next call.
  EXPECT_RT(cudaDeviceReset());
  facts("after reset 2", primary);
  EXPECT_RT(cudaFree(nullptr));
  facts("after reset 2 + cudaFree(0)", primary);
  void* s = C.malloc(kMiB, 0, nullptr);
  std::printf("after reset 2: cachalloc_malloc gave %p (1 MiB)\n", s);
  if (!round_trip(s, kMiB, 0x77)) return false;
  C.free(s, kMiB, 0, nullptr);

  // 4. Both dead caches are in the report.
  size_t need = 0;
  EXPECT(C.stats_json_size(&need) == 0);
  std::string json(need, '\0');
  EXPECT(C.stats_json(json.data(), json.size()) == 0);
  const int dead = count(json, "\"context_destroyed\":true");
  std::printf("stats: %d cache(s) of destroyed contexts\n", dead);
  EXPECT(dead == 2);
  EXPECT_RT(cudaDeviceSynchronize());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const char* lib = argc > 1 ? argv[1] : std::getenv("CACHALLOC_LIBRARY");
  if (lib == nullptr || lib[0] == '\0') {
    std::printf("usage: pluggable_reset LIBCACHALLOC (or CACHALLOC_LIBRARY)\n");
    return 2;
  }
  if (std::getenv("LD_PRELOAD") != nullptr && std::strstr(std::getenv("LD_PRELOAD"), "cachalloc") != nullptr)
    std::printf("pluggable_reset: note: LD_PRELOAD names cachalloc; the hooks then see the reset themselves\n");
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
    std::printf("pluggable_reset: SKIP (no GPU)\n");
    return 77;
  }
  if (!load(lib)) {
    std::printf("pluggable_reset: FAIL (cannot load %s)\n", lib);
    return 1;
  }
  const bool ok = run();
  if (!ok || g_failures != 0) {
    std::printf("pluggable_reset: FAIL (%d check(s) failed)\n", g_failures);
    return 1;
  }
  std::printf("pluggable_reset: PASS\n");
  return 0;
}
