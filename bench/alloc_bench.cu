// alloc_bench.cu — one benchmark binary for every CUDA-runtime contender of
// bench/run-all.sh (issue 8), run unmodified:
//   bare                          the driver behind cudaMalloc/cudaFree, and
//                                 CUDA's stream-ordered pool behind
//                                 cudaMallocAsync/cudaFreeAsync (default pool,
//                                 release threshold = max, set below);
//   LD_PRELOAD=floor_preload.so   the floor: a one-slot cache in place of the
//                                 driver's allocation calls (bench/floor_preload.c);
//   LD_PRELOAD=libcachalloc.so    cachalloc.
// Built twice, with nvcc's default static cudart and with -cudart shared
// (bench/meson.build: alloc_bench_static, alloc_bench_shared).
//
//   alloc_bench GROUP [key=value ...]
// GROUP: pair | blocking | nonblocking | async | live | threads, or several
// of them comma-separated (run one after the other); keys and the output
// lines are described in bench/alloc_cases.h.  Exit 77 without a GPU.
#include <cuda_runtime.h>

#include <cstdint>

#include "alloc_cases.h"

namespace {

thread_local cudaError_t t_last = cudaSuccess;

struct Cudart {
  static const char* api() { return "cudart"; }
  static bool init(std::string* why) {
    int devices = 0;
    cudaError_t e = cudaGetDeviceCount(&devices);
    if (e != cudaSuccess || devices == 0) {
      *why = std::string("no usable GPU: ") + cudaGetErrorName(e);
      return false;
    }
    if ((e = cudaFree(nullptr)) != cudaSuccess) {  // creates the primary context
      *why = std::string("cudaFree(0): ") + cudaGetErrorName(e);
      return false;
    }
    // CUDA's pool as the issue measures it: the default pool keeps what it got.
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, 0) == cudaSuccess) {
      std::uint64_t keep_all = UINT64_MAX;
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all);
    }
    int runtime = 0, driver = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    std::printf("VERSIONS {\"cudart\":%d,\"driver_api\":%d}\n", runtime, driver);
    return true;
  }
  static void* alloc(std::size_t n) {
    void* p = nullptr;
    t_last = cudaMalloc(&p, n);
    return t_last == cudaSuccess ? p : nullptr;
  }
  static bool release(void* p) { return (t_last = cudaFree(p)) == cudaSuccess; }
  static void* alloc_async(std::size_t n, void* s) {
    void* p = nullptr;
    t_last = cudaMallocAsync(&p, n, static_cast<cudaStream_t>(s));
    return t_last == cudaSuccess ? p : nullptr;
  }
  static bool release_async(void* p, void* s) {
    return (t_last = cudaFreeAsync(p, static_cast<cudaStream_t>(s))) == cudaSuccess;
  }
  static bool new_stream(bool blocking, void** out) {
    cudaStream_t s = nullptr;
    t_last = cudaStreamCreateWithFlags(&s, blocking ? cudaStreamDefault : cudaStreamNonBlocking);
    *out = s;
    return t_last == cudaSuccess;
  }
  static void destroy_stream(void* s) { cudaStreamDestroy(static_cast<cudaStream_t>(s)); }
  static void use_stream(void*) {}
  static void sync() { cudaDeviceSynchronize(); }
  static std::string last_error() { return cudaGetErrorName(t_last); }
};

}  // namespace

int main(int argc, char** argv) { return allocbench::bench_main<Cudart>(argc, argv); }
