// request_server.cu — many host threads serving requests, each on its own
// stream (issue 22, item 4): the multi-threaded program that measures what
// an allocator costs in requests per second and device memory when every
// thread allocates at once (inference servers, data-loading pipelines).
//
// T threads (default 16), each with a non-blocking stream of its own (with
// --streams per-thread, its per-thread default stream, cudaStreamPerThread,
// instead).  One request of a thread:
//   1. allocate an input (4 KiB .. 1 MiB, log-uniform; --sizes LO:HI bytes
//      for another range), an output of the same size and a workspace
//      (512 B .. 64 KiB), from a generator of the thread's own (the same
//      sizes on every run);
//   2. on the stream: fill the input with a pattern of (thread, request),
//      compute output = 3 * input + 1 through the workspace, and count the
//      output words that differ from the expected ones (verify_kernels.cuh
//      style: a device counter per thread);
//   3. free the three blocks: with --api async cudaFreeAsync on the stream
//      (stream-ordered, no wait), with --api plain cudaFree (which the bare
//      driver makes wait for the device).
// Every 64 requests the thread synchronizes its stream and reads its
// counter.  Under --api async, the bare run is CUDA's own pool
// (cudaMallocAsync); LD_PRELOAD=libcachalloc.so serves both APIs.
//
// Memory: the device's used memory through NVML (dlopen'ed, not intercepted),
// sampled every millisecond; peak = max - the value once the streams exist.
// Output: one line with requests/s, peak MiB, mismatching words, and PASS
// (no mismatch, no error) or FAIL.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr std::size_t KiB = 1024;

__global__ void fill(std::uint32_t* in, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    in[i] = seed * 2654435761u + static_cast<std::uint32_t>(i);
}

// output = 3 * input + 1; the workspace is written too (scratch traffic:
// a block reused while this still runs would be overwritten under it).
__global__ void compute(const std::uint32_t* in, std::uint32_t* out, std::size_t n, std::uint32_t* ws,
                        std::size_t ws_n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const std::uint32_t v = in[i] * 3u;
    ws[i % ws_n] = v;
    out[i] = v + 1u;
  }
}

__global__ void verify(const std::uint32_t* out, std::size_t n, std::uint32_t seed, unsigned long long* bad) {
  unsigned long long mine = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    mine += out[i] != (seed * 2654435761u + static_cast<std::uint32_t>(i)) * 3u + 1u;
  if (mine != 0) atomicAdd(bad, mine);
}

struct Options {
  int threads = 16;
  long requests = 2000;  // per thread
  bool async = true;
  std::size_t lo = 4 * KiB, hi = 1024 * KiB;  // input and output sizes
  bool per_thread = false;                     // cudaStreamPerThread instead of a created stream
};

struct Nvml {
  struct Memory {
    unsigned long long total, free, used;
  };
  int (*get_memory)(void*, Memory*) = nullptr;
  void* device = nullptr;
  bool open() {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (lib == nullptr) return false;
    auto init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
    auto by_bus = reinterpret_cast<int (*)(const char*, void**)>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    get_memory = reinterpret_cast<int (*)(void*, Memory*)>(dlsym(lib, "nvmlDeviceGetMemoryInfo"));
    char bus[64] = {};
    return init != nullptr && by_bus != nullptr && get_memory != nullptr && init() == 0 &&
           cudaDeviceGetPCIBusId(bus, sizeof bus, 0) == cudaSuccess && by_bus(bus, &device) == 0;
  }
  unsigned long long used() const {
    Memory m{};
    return get_memory(device, &m) == 0 ? m.used : 0;
  }
};

std::atomic<int> g_errors{0};

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "request_server: %s: %s\n", what, cudaGetErrorString(e));
  ++g_errors;
  return false;
}

// A size in [lo, hi], log-uniform, a multiple of 4.
std::size_t draw(std::uint64_t* state, std::size_t lo, std::size_t hi) {
  *state = *state * 6364136223846793005ull + 1442695040888963407ull;
  const double u = static_cast<double>(*state >> 11) / 9007199254740992.0;
  const double v = std::exp(std::log(static_cast<double>(lo)) + u * (std::log(static_cast<double>(hi)) - std::log(static_cast<double>(lo))));
  return std::max<std::size_t>(4, static_cast<std::size_t>(v) & ~std::size_t{3});
}

void* alloc(std::size_t n, cudaStream_t s, bool async) {
  void* p = nullptr;
  if (!ok(async ? cudaMallocAsync(&p, n, s) : cudaMalloc(&p, n), "allocation")) return nullptr;
  return p;
}

void release(void* p, cudaStream_t s, bool async) { ok(async ? cudaFreeAsync(p, s) : cudaFree(p), "free"); }

void serve(const Options& o, int id, cudaStream_t s, unsigned long long* bad) {
  std::uint64_t state = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(id + 1);
  for (long r = 0; r < o.requests && g_errors.load() == 0; ++r) {
    const std::size_t bytes = draw(&state, o.lo, o.hi), ws_bytes = draw(&state, 512, 64 * KiB);
    auto* in = static_cast<std::uint32_t*>(alloc(bytes, s, o.async));
    auto* out = static_cast<std::uint32_t*>(alloc(bytes, s, o.async));
    auto* ws = static_cast<std::uint32_t*>(alloc(ws_bytes, s, o.async));
    if (in == nullptr || out == nullptr || ws == nullptr) return;
    const std::size_t n = bytes / 4;
    const auto seed = static_cast<std::uint32_t>(id * 1000003 + r);
    const int blocks = static_cast<int>(std::min<std::size_t>(64, (n + 255) / 256));
    fill<<<blocks, 256, 0, s>>>(in, n, seed);
    compute<<<blocks, 256, 0, s>>>(in, out, n, ws, ws_bytes / 4);
    verify<<<blocks, 256, 0, s>>>(out, n, seed, bad);
    if (!ok(cudaGetLastError(), "launch")) return;
    release(ws, s, o.async);
    release(out, s, o.async);
    release(in, s, o.async);
    if (r % 64 == 63 && !ok(cudaStreamSynchronize(s), "synchronize")) return;
  }
  ok(cudaStreamSynchronize(s), "synchronize");
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--threads") o.threads = std::atoi(v), ++i;
    else if (a == "--requests") o.requests = std::atol(v), ++i;
    else if (a == "--api") o.async = std::strcmp(v, "plain") != 0, ++i;
    else if (a == "--sizes" && std::sscanf(v, "%zu:%zu", &o.lo, &o.hi) == 2) ++i;
    else if (a == "--streams" && (std::strcmp(v, "own") == 0 || std::strcmp(v, "per-thread") == 0))
      o.per_thread = std::strcmp(v, "per-thread") == 0, ++i;
    else {
      std::fprintf(stderr,
                   "usage: request_server [--threads N] [--requests N per thread] [--api async|plain] "
                   "[--sizes LO:HI bytes of input and output] [--streams own|per-thread]\n");
      std::exit(2);
    }
  }
  if (o.threads < 1 || o.threads > 256 || o.requests < 1 || o.lo < 4 || o.hi < o.lo) {
    std::fprintf(stderr, "request_server: --threads 1..256, --requests >= 1, --sizes 4 <= LO <= HI\n");
    std::exit(2);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (!ok(cudaSetDevice(0), "cudaSetDevice")) return 1;
  std::vector<cudaStream_t> streams(static_cast<std::size_t>(o.threads));
  unsigned long long* bad = nullptr;  // one counter per thread
  if (!ok(cudaMalloc(&bad, sizeof(unsigned long long) * streams.size()), "counters") ||
      !ok(cudaMemset(bad, 0, sizeof(unsigned long long) * streams.size()), "counters"))
    return 1;
  for (auto& s : streams)
    if (!ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream")) return 1;
  ok(cudaDeviceSynchronize(), "synchronize");

  Nvml nvml;
  const bool have_nvml = nvml.open();
  const unsigned long long base = have_nvml ? nvml.used() : 0;
  std::atomic<unsigned long long> peak{base};
  std::atomic<bool> done{false};
  std::thread sampler([&] {
    while (have_nvml && !done.load()) {
      const unsigned long long u = nvml.used();
      if (u > peak.load()) peak.store(u);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int i = 0; i < o.threads; ++i)
    pool.emplace_back([&, i] {
      cudaSetDevice(0);
      serve(o, i, o.per_thread ? cudaStreamPerThread : streams[static_cast<std::size_t>(i)], bad + i);
    });
  for (auto& t : pool) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  done = true;
  sampler.join();

  std::vector<unsigned long long> host(streams.size());
  ok(cudaMemcpy(host.data(), bad, sizeof(unsigned long long) * host.size(), cudaMemcpyDeviceToHost), "read counters");
  unsigned long long mismatches = 0;
  for (unsigned long long v : host) mismatches += v;
  for (auto& s : streams) ok(cudaStreamDestroy(s), "stream destroy");
  ok(cudaFree(bad), "counters");
  const double requests = static_cast<double>(o.requests) * o.threads;
  const bool pass = mismatches == 0 && g_errors.load() == 0;
  std::printf("request_server: api=%s streams=%s threads=%d sizes=%zu:%zu requests=%.0f  %.0f requests/s  peak %s%.1f MiB  mismatching words %llu  %s\n",
              o.async ? "async" : "plain", o.per_thread ? "per-thread" : "own", o.threads, o.lo, o.hi, requests,
              requests / secs, have_nvml ? "" : "(no NVML) ",
              static_cast<double>(peak.load() - base) / (1024.0 * 1024.0), mismatches, pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
