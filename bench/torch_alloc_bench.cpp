// torch_alloc_bench.cpp — PyTorch's caching allocator from C++, the contender
// "PyTorch" of bench/run-all.sh (issue 8): the same cases as alloc_bench
// (bench/alloc_cases.h) through c10::cuda::CUDACachingAllocator.
//   plain path  raw_alloc(n) on the thread's current stream / raw_delete(p)
//   async path  raw_alloc_with_stream(n, stream) / raw_delete(p)
// Streams come from c10's pool (non-blocking streams); a blocking stream
// has no c10 API, so the "blocking" group reports SKIP (PyTorch's allocator
// does not look at other streams on a free anyway).
//
// Built on the GPU machine by bench/run-all.sh against the installed torch
// (only c10 and c10_cuda are linked):
//   g++ -O2 -std=c++17 -D_GLIBCXX_USE_CXX11_ABI=<torch's> -I$TORCH/include
//       -I<cuda>/include torch_alloc_bench.cpp -L$TORCH/lib -lc10_cuda -lc10
//       <the libcudart c10_cuda loads> -Wl,-rpath,$TORCH/lib:<its dir>
// PYTORCH_CUDA_ALLOC_CONF applies as in any PyTorch process.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <exception>

#include "alloc_cases.h"

namespace {

thread_local std::string t_error;

namespace alloc = c10::cuda::CUDACachingAllocator;

struct Torch {
  static const char* api() { return "torch"; }
  static bool init(std::string* why) {
    try {
      const int n = static_cast<int>(c10::cuda::device_count());
      if (n <= 0) {
        *why = "no CUDA device";
        return false;
      }
      alloc::init(n);  // what torch's lazy CUDA init does in a Python process
      std::printf("VERSIONS {\"allocator\":\"%s\"}\n", alloc::get()->name().c_str());
      return true;
    } catch (const std::exception& e) {
      *why = e.what();
      return false;
    }
  }
  static void* alloc(std::size_t n) {
    try {
      return alloc::raw_alloc(n);
    } catch (const std::exception& e) {
      t_error = e.what();
      return nullptr;
    }
  }
  static bool release(void* p) {
    try {
      alloc::raw_delete(p);
      return true;
    } catch (const std::exception& e) {
      t_error = e.what();
      return false;
    }
  }
  static void* alloc_async(std::size_t n, void* s) {
    try {
      return alloc::raw_alloc_with_stream(n, static_cast<cudaStream_t>(s));
    } catch (const std::exception& e) {
      t_error = e.what();
      return nullptr;
    }
  }
  static bool release_async(void* p, void*) { return release(p); }
  // Plain cudart streams: PyTorch's allocator serves any stream, and
  // c10's stream pool aborted here outside a torch-initialized process.
  static bool new_stream(bool blocking, void** out) {
    cudaStream_t s = nullptr;
    const cudaError_t err = cudaStreamCreateWithFlags(&s, blocking ? cudaStreamDefault : cudaStreamNonBlocking);
    if (err != cudaSuccess) {
      t_error = cudaGetErrorString(err);
      return false;
    }
    *out = s;
    return true;
  }
  static void destroy_stream(void* s) { cudaStreamDestroy(static_cast<cudaStream_t>(s)); }
  static void use_stream(void* s) {
    if (s == nullptr) return;
    c10::cuda::setCurrentCUDAStream(
        c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(s), c10::cuda::current_device()));
  }
  static void sync() { c10::cuda::device_synchronize(); }
  static std::string last_error() { return t_error; }
};

}  // namespace

int main(int argc, char** argv) {
  try {
    return allocbench::bench_main<Torch>(argc, argv);
  } catch (const std::exception& e) {
    std::printf("torch_alloc_bench: %s\n", e.what());
    return 1;
  }
}
