// pause_resume.cu — a plain CUDA program (runtime API) that gives its GPU
// memory back and takes it again at the same addresses, through cachalloc's
// tags (docs/PAUSE.md).  The control API is found with dlsym, so the program
// runs bare too (then it prints SKIP and exits 77).
//
//   LD_PRELOAD=libcachalloc.so ./pause_resume_static [weights_mib] [kv_mib] [rounds] [host|disk]
//
// "weights" (with a backup: pinned host memory, or with "disk" a file in
// CACHALLOC_CONF's pause_backup_dir, default $TMPDIR or /tmp) hold a pattern that a kernel checks after
// every resume; "kv_cache" (no backup) is rewritten after every resume; a
// CUDA graph captured once reads both.  Between pause and resume the program
// allocates most of the freed memory untagged (another engine) and checks
// that cudaMemGetInfo saw it freed.  Prints one PASS/FAIL line with the
// pause/resume times per GiB.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

using tag_fn = int (*)(const char*);
tag_fn set_tag, pause_tag, resume_tag;
int (*set_backup)(const char*, int);

__global__ void fill(unsigned* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = static_cast<unsigned>(i) * 2654435761u + seed;
}

__global__ void check(const unsigned* p, size_t n, unsigned seed, unsigned long long* bad) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    if (p[i] != static_cast<unsigned>(i) * 2654435761u + seed) atomicAdd(bad, 1ull);
}

// The "inference step" captured in a graph: reads the weights, writes and
// reads the KV pool.
__global__ void step(const unsigned* w, unsigned* kv, size_t n, unsigned long long* sum) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    kv[i] = w[i] ^ 0x5a5a5a5au;
    local += kv[i] & 0xff;
  }
  atomicAdd(sum, local);
}

#define CK(call)                                                                  \
  do {                                                                            \
    cudaError_t e_ = (call);                                                      \
    if (e_ != cudaSuccess) {                                                      \
      std::printf("FAIL pause_resume: %s: %s\n", #call, cudaGetErrorString(e_)); \
      return 1;                                                                   \
    }                                                                             \
  } while (0)

double seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const size_t weights_mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 1024;
  const size_t kv_mib = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 1024;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 5;
  const bool disk = argc > 4 && std::strcmp(argv[4], "disk") == 0;  // CACHALLOC_BACKUP_DISK (2), else HOST (1)
  set_tag = reinterpret_cast<tag_fn>(dlsym(RTLD_DEFAULT, "cachalloc_set_tag"));
  pause_tag = reinterpret_cast<tag_fn>(dlsym(RTLD_DEFAULT, "cachalloc_pause"));
  resume_tag = reinterpret_cast<tag_fn>(dlsym(RTLD_DEFAULT, "cachalloc_resume"));
  set_backup = reinterpret_cast<int (*)(const char*, int)>(dlsym(RTLD_DEFAULT, "cachalloc_set_tag_backup"));
  if (!set_tag || !pause_tag || !resume_tag || !set_backup) {
    std::printf("SKIP pause_resume: not running under libcachalloc.so\n");
    return 77;
  }
  const size_t nw = weights_mib << 18, nk = kv_mib << 18;  // unsigned words
  unsigned *w = nullptr, *kv = nullptr;
  unsigned long long *bad = nullptr, *sum = nullptr;
  CK(cudaFree(nullptr));
  CK(cudaMalloc(&bad, sizeof *bad));  // untagged
  CK(cudaMalloc(&sum, sizeof *sum));
  if (set_backup("weights", disk ? 2 : 1) != 0 || set_tag("weights") != 0)
    return std::printf("FAIL pause_resume: set_tag\n"), 1;
  CK(cudaMalloc(&w, nw * sizeof *w));
  set_tag("kv_cache");
  CK(cudaMalloc(&kv, nk * sizeof *kv));
  set_tag(nullptr);
  fill<<<1024, 256>>>(w, nw, 7);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaDeviceSynchronize());
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  step<<<1024, 256, 0, s>>>(w, kv, nk < nw ? nk : nw, sum);
  CK(cudaStreamEndCapture(s, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  CK(cudaMemset(sum, 0, sizeof *sum));
  CK(cudaGraphLaunch(exec, s));
  unsigned long long want = 0, got = 0, nbad = 0;
  CK(cudaStreamSynchronize(s));
  CK(cudaMemcpy(&want, sum, sizeof want, cudaMemcpyDeviceToHost));

  const double gib = static_cast<double>(weights_mib + kv_mib) / 1024.0;
  double pause_s = 0, resume_s = 0, min_freed = 1e30;
  int failures = 0;
  for (int r = 0; r < rounds; ++r) {
    size_t free_before = 0, free_paused = 0, total = 0;
    CK(cudaMemGetInfo(&free_before, &total));
    auto t0 = std::chrono::steady_clock::now();
    if (pause_tag(nullptr) != 0) return std::printf("FAIL pause_resume: cachalloc_pause\n"), 1;
    pause_s += seconds(t0);
    CK(cudaMemGetInfo(&free_paused, &total));
    const double freed = static_cast<double>(free_paused) - static_cast<double>(free_before);
    if (freed < min_freed) min_freed = freed;
    // Another engine in the freed memory (untagged), given back after.
    unsigned* other = nullptr;
    const size_t no = (nw + nk) / 10 * 8;
    CK(cudaMalloc(&other, no * sizeof *other));
    fill<<<1024, 256>>>(other, no, 99);
    CK(cudaDeviceSynchronize());
    CK(cudaFree(other));
    t0 = std::chrono::steady_clock::now();
    if (resume_tag(nullptr) != 0) return std::printf("FAIL pause_resume: cachalloc_resume\n"), 1;
    resume_s += seconds(t0);
    CK(cudaMemset(bad, 0, sizeof *bad));
    check<<<1024, 256>>>(w, nw, 7, bad);  // the backup came back
    CK(cudaMemcpy(&nbad, bad, sizeof nbad, cudaMemcpyDeviceToHost));
    CK(cudaMemset(sum, 0, sizeof *sum));
    CK(cudaGraphLaunch(exec, s));  // same addresses: the graph still works
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(&got, sum, sizeof got, cudaMemcpyDeviceToHost));
    if (nbad != 0 || got != want) ++failures;
  }
  cudaPointerAttributes attr{};
  CK(cudaPointerGetAttributes(&attr, w));
  const bool attr_ok = attr.type == cudaMemoryTypeDevice && attr.devicePointer == w;
  const bool freed_ok = min_freed >= 0.98 * gib * (1 << 30);
  const bool ok = failures == 0 && attr_ok && freed_ok;
  std::printf("%s pause_resume: %d rounds of %.2f GiB (weights backed up %s), %d bad rounds; cudaMemGetInfo freed >= "
              "%.0f MiB per pause; pause %.1f ms/GiB, resume %.1f ms/GiB (means)%s\n",
              ok ? "PASS" : "FAIL", rounds, gib, disk ? "to disk" : "in host memory", failures, min_freed / (1 << 20), 1e3 * pause_s / rounds / gib,
              1e3 * resume_s / rounds / gib, attr_ok ? "" : "; pointer attributes changed");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(w);
  cudaFree(kv);
  return ok ? 0 : 1;
}
