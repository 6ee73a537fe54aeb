// pause_bandwidth.cu — how fast a tag pauses and resumes, by backup kind and
// size, beside a plain cudaMemcpy between the device and pinned host memory
// of the same size in the same run (issue 35 item 3; docs/BENCHMARKS.md).
//
//   LD_PRELOAD=libcachalloc.so bench/pause_bandwidth [MiB,...] [rounds] [kinds] [disk_max_mib]
//     default: 256,1024,4096,16384 MiB, 3 rounds, kinds none,host,disk,
//     disk up to 4096 MiB (a file per pause: the disk's speed, not the link's)
//
// For each size: the link's speed (cudaMemcpyAsync device -> pinned host and
// back, on a non-blocking stream, the better of two), then per kind `rounds`
// pause/resume cycles of one tag holding one block of that size, its
// contents checked after every resume of a kind with a backup.  Prints one
// markdown row per (size, kind): the first round apart (it allocates the
// host buffer) and the median of the others, as GiB/s and ms per GiB, and
// the share of the link's speed.  Bare (no cachalloc) it measures the link
// only and says so.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using clk = std::chrono::steady_clock;
double ms_since(clk::time_point t) { return std::chrono::duration<double, std::milli>(clk::now() - t).count(); }

#define CK(call)                                                                  \
  do {                                                                            \
    cudaError_t e_ = (call);                                                      \
    if (e_ != cudaSuccess) {                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,          \
                   cudaGetErrorString(e_));                                       \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

struct Api {
  int (*set_tag)(const char*) = nullptr;
  int (*set_backup)(const char*, int) = nullptr;
  int (*pause)(const char*) = nullptr;
  int (*resume)(const char*) = nullptr;
  bool present() const { return set_tag && set_backup && pause && resume; }
};

Api find_api() {
  Api a;
  a.set_tag = reinterpret_cast<int (*)(const char*)>(dlsym(RTLD_DEFAULT, "cachalloc_set_tag"));
  a.set_backup = reinterpret_cast<int (*)(const char*, int)>(dlsym(RTLD_DEFAULT, "cachalloc_set_tag_backup"));
  a.pause = reinterpret_cast<int (*)(const char*)>(dlsym(RTLD_DEFAULT, "cachalloc_pause"));
  a.resume = reinterpret_cast<int (*)(const char*)>(dlsym(RTLD_DEFAULT, "cachalloc_resume"));
  return a;
}

__global__ void fill(unsigned* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = static_cast<unsigned>(i) * 2654435761u + seed;
}

__global__ void check(const unsigned* p, size_t n, unsigned seed, unsigned long long* bad) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    if (p[i] != static_cast<unsigned>(i) * 2654435761u + seed) atomicAdd(bad, 1ull);
}

double gib(size_t bytes) { return static_cast<double>(bytes) / (1ull << 30); }

// The link's speed for `bytes`: the better of two copies each way, in GiB/s.
void link_speed(size_t bytes, double* d2h, double* h2d) {
  void *dev = nullptr, *host = nullptr;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaMalloc(&dev, bytes));
  CK(cudaHostAlloc(&host, bytes, cudaHostAllocDefault));
  CK(cudaMemset(dev, 1, bytes));
  CK(cudaDeviceSynchronize());
  *d2h = *h2d = 0;
  for (int i = 0; i < 2; ++i) {
    auto t = clk::now();
    CK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    *d2h = std::max(*d2h, gib(bytes) / ms_since(t) * 1e3);
    t = clk::now();
    CK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s));
    CK(cudaStreamSynchronize(s));
    *h2d = std::max(*h2d, gib(bytes) / ms_since(t) * 1e3);
  }
  CK(cudaFreeHost(host));
  CK(cudaFree(dev));
  CK(cudaStreamDestroy(s));
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Cycle {
  std::vector<double> pause_ms, resume_ms;
  unsigned long long bad = 0;
  bool failed = false;
};

// `rounds` pause/resume cycles of a tag holding one block of `bytes`.
Cycle cycles(const Api& api, size_t bytes, int kind, int rounds, unsigned long long* bad_dev) {
  Cycle c;
  const std::string tag = "bw_" + std::to_string(kind) + "_" + std::to_string(bytes >> 20);
  api.set_tag(tag.c_str());
  unsigned* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  api.set_tag(nullptr);
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: cudaMalloc(%zu MiB) failed: %s\n", tag.c_str(), bytes >> 20, cudaGetErrorString(e));
    c.failed = true;
    return c;
  }
  const size_t n = bytes / sizeof(unsigned);
  api.set_backup(tag.c_str(), kind);
  for (int r = 0; r < rounds && !c.failed; ++r) {
    fill<<<1024, 256>>>(p, n, 7u + r);
    CK(cudaDeviceSynchronize());
    auto t = clk::now();
    if (api.pause(tag.c_str()) != 0) c.failed = true;
    c.pause_ms.push_back(ms_since(t));
    t = clk::now();
    if (api.resume(tag.c_str()) != 0) c.failed = true;
    c.resume_ms.push_back(ms_since(t));
    if (kind != 0 && !c.failed) {
      CK(cudaMemset(bad_dev, 0, sizeof *bad_dev));
      check<<<1024, 256>>>(p, n, 7u + r, bad_dev);
      unsigned long long bad = 0;
      CK(cudaMemcpy(&bad, bad_dev, sizeof bad, cudaMemcpyDeviceToHost));
      c.bad += bad;
    }
  }
  CK(cudaFree(p));
  return c;
}

const char* kind_name(int k) { return k == 0 ? "none" : k == 1 ? "host" : "disk"; }

std::vector<size_t> parse_sizes(const char* s) {
  std::vector<size_t> out;
  for (const char* at = s; *at != '\0';) {
    char* end = nullptr;
    out.push_back(static_cast<size_t>(std::strtoull(at, &end, 10)) << 20);
    at = *end == ',' ? end + 1 : end;
    if (end == at && *at != '\0') break;
  }
  return out;
}

// "x GiB/s (y ms/GiB)" for a time of `ms` over `bytes`.
std::string rate(size_t bytes, double ms) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f GiB/s (%.2f ms/GiB)", ms > 0 ? gib(bytes) / ms * 1e3 : 0.0, ms / gib(bytes));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<size_t> sizes = parse_sizes(argc > 1 ? argv[1] : "256,1024,4096,16384");
  const int rounds = argc > 2 ? std::max(2, std::atoi(argv[2])) : 3;
  const std::string kinds = argc > 3 ? argv[3] : "none,host,disk";
  const size_t disk_max = (argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 4096ull) << 20;
  const Api api = find_api();
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# pause_bandwidth on %s, %d rounds per (size, kind); %s\n", prop.name, rounds,
              api.present() ? "under cachalloc" : "bare: the link only (no cachalloc control API)");
  std::printf("| size | link D->H / H->D | backup | pause, first | pause, later (median) | resume (median) | "
              "pause / link | resume / link | wrong words |\n|---|---|---|---|---|---|---|---|---|\n");
  unsigned long long* bad_dev = nullptr;
  CK(cudaMalloc(&bad_dev, sizeof *bad_dev));
  int status = 0;
  for (size_t bytes : sizes) {
    double d2h = 0, h2d = 0;
    link_speed(bytes, &d2h, &h2d);
    if (!api.present()) {
      std::printf("| %zu MiB | %.1f / %.1f GiB/s | - | | | | | | |\n", bytes >> 20, d2h, h2d);
      continue;
    }
    for (int kind = 0; kind < 3; ++kind) {
      if (kinds.find(kind_name(kind)) == std::string::npos) continue;
      if (kind == 2 && bytes > disk_max) continue;
      const Cycle c = cycles(api, bytes, kind, rounds, bad_dev);
      if (c.failed) {
        std::printf("| %zu MiB | | %s | FAILED | | | | | |\n", bytes >> 20, kind_name(kind));
        status = 1;
        continue;
      }
      const double later = median(std::vector<double>(c.pause_ms.begin() + 1, c.pause_ms.end()));
      const double resume = median(c.resume_ms);
      char shares[64] = "-";
      char rshare[32] = "-";
      if (kind != 0) {
        std::snprintf(shares, sizeof shares, "%.0f %%", 100.0 * (gib(bytes) / later * 1e3) / d2h);
        std::snprintf(rshare, sizeof rshare, "%.0f %%", 100.0 * (gib(bytes) / resume * 1e3) / h2d);
      }
      std::printf("| %zu MiB | %.1f / %.1f GiB/s | %s | %s | %s | %s | %s | %s | %llu |\n", bytes >> 20, d2h, h2d,
                  kind_name(kind), rate(bytes, c.pause_ms[0]).c_str(), rate(bytes, later).c_str(),
                  rate(bytes, resume).c_str(), shares, rshare, c.bad);
      if (c.bad != 0) status = 1;
      std::fflush(stdout);
    }
  }
  CK(cudaFree(bad_dev));
  return status;
}
