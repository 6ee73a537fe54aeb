// multi_gpu.cu — two GPUs in one process, the runtime API only (issue 9,
// item 4).  Run bare (the baseline) and with libcachalloc.so preloaded:
//
//   1. interleaved: cudaSetDevice switches between the devices before every
//      allocation (cudaMalloc, and cudaMallocAsync on a stream of each
//      device); every buffer filled with its own pattern on its device
//   2. frees from threads whose current device differs from the buffer's
//      (a thread set to device 1 frees device 0's buffers, a fresh thread
//      left on device 0 frees device 1's) while the main thread keeps
//      allocating on both; stream-ordered frees from another thread; the
//      survivors' data checked afterwards (a wrong free would have let a
//      later allocation overwrite them)
//   3. peer copies between blocks of both devices (cudaMemcpyPeerAsync), and
//      with peer access, kernels of one device checking the other device's
//      buffers in place
//   4. under cachalloc, the control API per device (looked up with dlsym, so
//      the bare run needs no library): both devices have statistics,
//      cachalloc_empty_cache(1) runs in device 1's context and leaves the
//      caller's device as it was, cachalloc_summary(1) prints device 1's table
//
// Prints "multi_gpu: PASS" (exit 0) when every check on the devices found no
// mismatch; "multi_gpu: SKIP" (exit 77) with fewer than two GPUs.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "example_checks.cuh"
#include "verify_kernels.cuh"

namespace {

int g_failures = 0;

struct Buf {
  void* p = nullptr;
  int device = 0;
  std::size_t bytes = 0;
  std::uint32_t seed = 0;
  bool async = false;
  cudaStream_t stream = nullptr;
};

constexpr int kDevices = 2;
cudaStream_t g_stream[kDevices];
unsigned long long* g_mismatches[kDevices];  // one counter per device, in its memory

int current_device() {
  int d = -1;
  MUST(cudaGetDevice(&d));
  return d;
}

std::size_t size_for(int i) {
  static const std::size_t sizes[] = {4096, 1 << 20, 3 << 20, 700, 12 << 20, 64 << 10, 2 << 20, 24 << 20};
  return sizes[i % 8];
}

Buf allocate(int device, int i, std::uint32_t iteration) {
  MUST(cudaSetDevice(device));
  Buf b;
  b.device = device;
  b.bytes = size_for(i);
  if (i % 3 == 2) {  // stream-ordered, on this device's stream
    b.async = true;
    b.stream = g_stream[device];
    MUST(cudaMallocAsync(&b.p, b.bytes, b.stream));
  } else {
    MUST(cudaMalloc(&b.p, b.bytes));
  }
  b.seed = examples::seed_for(b.p, iteration);
  examples::fill(b.p, b.bytes, b.seed, g_stream[device]);
  return b;
}

void check_on(int device, const Buf& b) {
  MUST(cudaSetDevice(device));
  examples::check(b.p, b.bytes, b.seed, g_stream[device], g_mismatches[device]);
}

void release(const Buf& b) {
  if (b.async)
    MUST(cudaFreeAsync(b.p, b.stream));
  else
    MUST(cudaFree(b.p));
}

unsigned long long collect_mismatches(const char* phase) {
  unsigned long long total = 0;
  for (int d = 0; d < kDevices; ++d) {
    MUST(cudaSetDevice(d));
    MUST(cudaStreamSynchronize(g_stream[d]));
    unsigned long long n = 0;
    MUST(cudaMemcpy(&n, g_mismatches[d], sizeof n, cudaMemcpyDeviceToHost));
    MUST(cudaMemset(g_mismatches[d], 0, sizeof n));
    total += n;
  }
  std::printf("%-44s %s (%llu mismatching words)\n", phase, total ? "FAIL" : "ok", total);
  if (total) ++g_failures;
  return total;
}

// Phase 1: allocations alternate between the devices.
std::vector<Buf> interleaved(int count, std::uint32_t iteration) {
  std::vector<Buf> bufs;
  for (int i = 0; i < count; ++i) bufs.push_back(allocate(i % kDevices, i, iteration));
  for (const Buf& b : bufs) check_on(b.device, b);
  return bufs;
}

// Phase 2: every other buffer freed by a thread whose current device is not
// the buffer's (plain frees: the driver frees in the owner's context).
void cross_thread_frees(std::vector<Buf>& bufs) {
  for (int d = 0; d < kDevices; ++d) {
    MUST(cudaSetDevice(d));
    MUST(cudaStreamSynchronize(g_stream[d]));  // frees from another thread: ordered by the host here
  }
  std::vector<Buf> keep, drop;
  for (std::size_t i = 0; i < bufs.size(); ++i) (i % 2 ? drop : keep).push_back(bufs[i]);
  std::thread other([&] {  // device 1 current: frees device 0's buffers
    MUST(cudaSetDevice(1));
    for (const Buf& b : drop) {
      if (b.async || b.device != 0) continue;
      MUST(cudaFree(b.p));
      if (current_device() != 1) {
        std::printf("a cross-device free changed the thread's device\n");
        ++g_failures;
      }
    }
  });
  std::thread fresh([&] {  // a new thread, device never set (device 0): frees device 1's buffers
    for (const Buf& b : drop)
      if (!b.async && b.device == 1) MUST(cudaFree(b.p));
  });
  // Meanwhile this thread keeps allocating on device 1 (and device 0).
  std::vector<Buf> more;
  for (int i = 0; i < 12; ++i) more.push_back(allocate(1 - i % kDevices, i + 1, 7));
  other.join();
  fresh.join();
  for (const Buf& b : drop)
    if (b.async) {  // stream-ordered frees on the owner's stream, from another thread
      std::thread t([&] {
        MUST(cudaSetDevice(b.device));
        MUST(cudaFreeAsync(b.p, b.stream));
      });
      t.join();
    }
  // Reallocate what was freed: new buffers must not overlap the survivors.
  for (int i = 0; i < 12; ++i) more.push_back(allocate(i % kDevices, i + 3, 8));
  for (const Buf& b : keep) check_on(b.device, b);
  for (const Buf& b : more) check_on(b.device, b);
  keep.insert(keep.end(), more.begin(), more.end());
  bufs.swap(keep);
}

// Phase 3: copies between blocks of both devices, and in-place reads.
void peer(std::vector<Buf>& bufs, bool access) {
  std::vector<Buf> copies;
  for (const Buf& src : bufs) {
    const int dst_device = 1 - src.device;
    MUST(cudaSetDevice(dst_device));
    Buf dst;
    dst.device = dst_device;
    dst.bytes = src.bytes;
    dst.seed = src.seed;  // a copy: the same pattern
    MUST(cudaMalloc(&dst.p, dst.bytes));
    // Ordered after src's fill (on the source device's stream) by a sync.
    MUST(cudaSetDevice(src.device));
    MUST(cudaStreamSynchronize(g_stream[src.device]));
    MUST(cudaSetDevice(dst_device));
    MUST(cudaMemcpyPeerAsync(dst.p, dst_device, src.p, src.device, src.bytes, g_stream[dst_device]));
    check_on(dst_device, dst);
    // The other device's buffer, read in place.  Not a cudaMallocAsync one:
    // peer access covers cudaMalloc memory, while memory from a stream-ordered
    // pool needs cudaMemPoolSetAccess (the bare run read such a buffer and
    // died of an illegal address).
    if (access && !src.async) check_on(dst_device, src);
    copies.push_back(dst);
  }
  collect_mismatches(access ? "peer copies and in-place peer reads" : "peer copies (no peer access)");
  for (const Buf& c : copies) MUST(cudaFree(c.p));
}

// Phase 4: the control API, present only under cachalloc.
void control_api() {
  using StatsFn = int (*)(char*, std::size_t);
  using DeviceFn = int (*)(int);
  using SummaryFn = int (*)(int, char*, std::size_t);
  auto stats = reinterpret_cast<StatsFn>(dlsym(RTLD_DEFAULT, "cachalloc_stats_json"));
  auto empty = reinterpret_cast<DeviceFn>(dlsym(RTLD_DEFAULT, "cachalloc_empty_cache"));
  auto summary = reinterpret_cast<SummaryFn>(dlsym(RTLD_DEFAULT, "cachalloc_summary"));
  if (stats == nullptr || empty == nullptr) {
    std::printf("%-44s skipped (cachalloc not loaded)\n", "control API per device");
    return;
  }
  std::vector<char> buf(1 << 20);
  int rc = stats(buf.data(), buf.size());
  const std::string json = rc == 0 ? std::string(buf.data()) : std::string();
  bool ok = rc == 0;
  for (int d = 0; d < kDevices; ++d) {
    const std::string key = "{\"device\":" + std::to_string(d) + ",";
    const std::size_t at = json.find(key);
    ok = ok && at != std::string::npos;
    if (at == std::string::npos) continue;
    const std::size_t a = json.find("\"allocation.all.allocated\":", at);
    const std::size_t p = json.find("\"reserved_bytes.all.peak\":", at);
    const long long allocs = a == std::string::npos ? -1 : std::atoll(json.c_str() + a + 27);
    const long long peak = p == std::string::npos ? -1 : std::atoll(json.c_str() + p + 26);
    std::printf("  cachalloc device %d: %lld allocations served, reserved peak %.1f MiB\n", d, allocs,
                peak / 1048576.0);
    ok = ok && allocs > 0;
  }
  MUST(cudaSetDevice(0));
  const int before = current_device();
  ok = ok && empty(1) == 0 && current_device() == before;
  if (summary != nullptr) {
    std::vector<char> table(1 << 16);
    if (summary(1, table.data(), table.size()) == 0) std::fputs(table.data(), stdout);
  }
  std::printf("%-44s %s\n", "control API per device", ok ? "ok" : "FAIL");
  if (!ok) ++g_failures;
}

}  // namespace

int main(int argc, char** argv) {
  examples::take_sanitizer_safe_flag(argc, argv);
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < kDevices) {
    std::printf("multi_gpu: SKIP (needs %d GPUs, found %d)\n", kDevices, n);
    return 77;
  }
  for (int d = 0; d < kDevices; ++d) {
    MUST(cudaSetDevice(d));
    MUST(cudaStreamCreateWithFlags(&g_stream[d], cudaStreamNonBlocking));
    MUST(cudaMalloc(&g_mismatches[d], sizeof(unsigned long long)));
    MUST(cudaMemset(g_mismatches[d], 0, sizeof(unsigned long long)));
  }
  int can01 = 0, can10 = 0;
  MUST(cudaDeviceCanAccessPeer(&can01, 0, 1));
  MUST(cudaDeviceCanAccessPeer(&can10, 1, 0));
  const bool access = can01 && can10;

  for (int round = 0; round < 3; ++round) {
    std::vector<Buf> bufs = interleaved(24, round);
    collect_mismatches("interleaved allocations (cudaSetDevice)");
    cross_thread_frees(bufs);
    collect_mismatches("frees from threads on the other device");
    if (round == 1 && access) {  // enable once, midway: blocks from before and after
      for (int d = 0; d < kDevices; ++d) {
        MUST(cudaSetDevice(d));
        cudaError_t e = cudaDeviceEnablePeerAccess(1 - d, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
        else MUST(e);
      }
    }
    peer(bufs, access && round >= 1);
    for (const Buf& b : bufs) {
      MUST(cudaSetDevice(b.device));
      release(b);
    }
  }
  control_api();
  for (int d = 0; d < kDevices; ++d) {
    MUST(cudaSetDevice(d));
    MUST(cudaDeviceSynchronize());
    MUST(cudaFree(g_mismatches[d]));
    MUST(cudaStreamDestroy(g_stream[d]));
  }
  std::printf("multi_gpu: %s (peer access %s)\n", g_failures ? "FAIL" : "PASS", access ? "on" : "unavailable");
  return g_failures ? 1 : 0;
}
