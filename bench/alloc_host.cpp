// alloc_host.cpp — the cases of bench/alloc_cases.h on host malloc/free, with
// fake streams: no GPU, no CUDA header.  It exists so that the harness
// (run_bench.py --dry-run, the unit test bench_harness) can run every group
// and parse every output line on a machine without a GPU; its figures mean
// nothing about any GPU allocator.
#include <cstdlib>

#include "alloc_cases.h"

namespace {

// Blocks are small whatever the size asked for: the point is the harness, and
// touching megabytes (MALLOC_PERTURB_, which meson test sets, fills every
// block) would only make the test slow.
inline std::size_t host_size(std::size_t n) { return n < 64 ? (n ? n : 1) : 64; }

struct Host {
  static const char* api() { return "host"; }
  static bool init(std::string*) { return true; }
  static void* alloc(std::size_t n) { return std::malloc(host_size(n)); }
  static bool release(void* p) {
    std::free(p);
    return true;
  }
  static void* alloc_async(std::size_t n, void*) { return std::malloc(host_size(n)); }
  static bool release_async(void* p, void*) {
    std::free(p);
    return true;
  }
  static bool new_stream(bool, void** out) {
    *out = new int(0);
    return true;
  }
  static void destroy_stream(void* s) { delete static_cast<int*>(s); }
  static void use_stream(void*) {}
  static void sync() {}
  static std::string last_error() { return "host malloc failed"; }
};

}  // namespace

int main(int argc, char** argv) { return allocbench::bench_main<Host>(argc, argv); }
