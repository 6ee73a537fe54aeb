// stress.cpp — many threads using cachalloc at once, on the fake libcuda.
//
// Run with libcachalloc.so preloaded and the fake libcuda.so.1 on
// LD_LIBRARY_PATH (tests/stress/meson.build).  The program is linked against
// libcuda (the "-lcuda" route: the preloaded exports come first) and against
// libcachalloc.so for the control API of <cachalloc.h>.
//
// Worker threads (8 by default) run epochs of randomly mixed operations
// (seeded; the interleaving is the scheduler's):
//   allocate  cuMemAlloc, cuMemAllocAsync on a private stream, on a stream
//             shared by all threads, on the legacy and per-thread streams,
//             cuMemAllocAsync_ptsz; the block is filled with the owner's
//             pattern (a byte from owner and serial over the whole block,
//             a 16-byte tag at both ends; cuMemsetD8/cuMemcpyHtoD, which the
//             fake runs on host memory)
//   verify    a live block still holds its owner's pattern (also before
//             every free): any overlap of two live blocks shows here
//   free      cuMemFree, cuMemFreeAsync on the block's stream, on another
//             stream (record-stream style), cachalloc_record_stream on
//             another stream then a free, cuMemFreeAsync_ptsz
//   hand over a block goes to a mailbox; another thread verifies the giver's
//             pattern, then frees it or adopts it (refills it with its own)
//   streams   cuStreamDestroy of a private stream (its blocks freed first),
//             cuStreamCreate (sometimes non-blocking)
//   early reuse  a private stream is held busy (fake_cuda_hold_stream), a
//             block is freed on it or recorded on it, and blocks of the same
//             size are allocated on the block's stream: none may overlap the
//             pending block unless something synchronized in between
//   control   cachalloc_empty_cache(0), cachalloc_stats_json (also with a
//             buffer too small), cachalloc_reset_peak_stats(0),
//             cachalloc_validate
// Between epochs, one thread at a time (a writer-preferring reader-writer
// lock: no other thread holds a block or a stream then) validates, empties
// the cache, replaces the shared streams, and sometimes resets the primary
// context (cuDevicePrimaryCtxReset); afterwards every thread retains and sets
// the primary context again.  A monitor thread without any context calls
// the read-only control API all the while (stats, validate, snapshot, peak
// reset, bad arguments).
//
// Fails (exit 1, with a message) on a wrong pattern, an early reuse, an
// invariant violation, any unexpected error code, a non-zero
// dead_context_calls or record_on_dead_stream in the fake's counters, or
// memory left with the driver after the final empty_cache.
//
// Usage: stress [--threads N] [--epochs E] [--ops K] [--seed S]
#include <cuda.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cachalloc.h"
#include "fake_libcuda.h"

extern "C" CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream);
extern "C" CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);

namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;
constexpr std::size_t kTag = 16;
constexpr std::size_t kMaxLive = 24;       // blocks a worker holds at most
constexpr std::size_t kMailboxMax = 64;
constexpr int kPrivateStreams = 3;         // a worker's private streams (created lazily)
constexpr int kSharedStreams = 3;

[[noreturn]] void die(const char* fmt, ...) {
  std::va_list ap;
  va_start(ap, fmt);
  std::fputs("stress: FAIL: ", stderr);
  std::vfprintf(stderr, fmt, ap);
  std::fputc('\n', stderr);
  va_end(ap);
  std::fflush(stderr);
  std::fflush(stdout);
  _exit(1);
}

#define CU(call)                                                                                     \
  do {                                                                                               \
    const CUresult r_ = (call);                                                                      \
    if (r_ != CUDA_SUCCESS) die("%s:%d: %s returned %d", __FILE__, __LINE__, #call, static_cast<int>(r_)); \
  } while (0)
#define API(call, expected)                                                                          \
  do {                                                                                               \
    const int r_ = (call);                                                                           \
    if (r_ != (expected)) die("%s:%d: %s returned %d, expected %d", __FILE__, __LINE__, #call, r_, (expected)); \
  } while (0)

// ---------------- shared state ----------------

struct Options {
  int threads = 8;
  int epochs = 10;
  int ops = 250;
  unsigned seed = 1;
};
Options g_opt;

pthread_rwlock_t g_phase;  // readers: workers during an epoch; writer: maintenance and resets
std::atomic<unsigned> g_reset_generation{0};
std::atomic<bool> g_workers_done{false};

// Shared streams: written by the writer only, read by workers under the read lock.
CUstream g_shared[kSharedStreams];

struct Block {
  CUdeviceptr p = 0;
  std::size_t size = 0;
  std::uint32_t owner = 0;
  std::uint64_t serial = 0;
  CUstream own = nullptr;          // the stream handle it was allocated for (nullptr: cuMemAlloc or legacy)
  bool priv = false;               // `own` or a recorded stream is a private stream of its holder
  std::vector<CUstream> uses;      // streams given to cachalloc_record_stream
};

std::mutex g_mailbox_mutex;
std::deque<Block> g_mailbox;

struct Counts {
  std::atomic<unsigned long> allocs{0}, frees{0}, verifies{0}, handed{0}, adopted{0}, streams{0}, resets{0},
      maintenance{0}, hold_checked{0}, hold_skipped{0}, empty_cache{0}, stats_json{0}, record_stream{0},
      validate{0}, monitor_rounds{0}, snapshots{0};
} g_counts;

struct fake_cuda_stats_t fake_stats() {
  struct fake_cuda_stats_t s;
  fake_cuda_stats(&s);
  return s;
}

// Every synchronization the fake performed: work held on a stream may
// complete through any of them (cuMemFreeHost waits for the device too).
unsigned long sync_count() {
  const struct fake_cuda_stats_t s = fake_stats();
  return s.event_sync + s.ctx_sync + s.stream_sync + s.host_free_syncs;
}

void check_fake_clean(const char* when) {
  const struct fake_cuda_stats_t s = fake_stats();
  if (s.dead_context_calls != 0) die("%s: %lu call(s) named a destroyed context's objects", when, s.dead_context_calls);
  if (s.record_on_dead_stream != 0) die("%s: %lu event(s) recorded on destroyed streams", when, s.record_on_dead_stream);
}

void validate(const char* when) {
  char msg[512];
  const int r = cachalloc_validate(msg, sizeof msg);
  if (r != CACHALLOC_SUCCESS) die("%s: cachalloc_validate returned %d: %s", when, r, msg);
  g_counts.validate++;
}

// ---------------- patterns ----------------

std::uint8_t pattern_byte(std::uint32_t owner, std::uint64_t serial) {
  std::uint64_t x = (static_cast<std::uint64_t>(owner) << 40) ^ (serial * 0x9E3779B97F4A7C15ull);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<std::uint8_t>(x);
}

struct Tag {
  std::uint32_t magic;
  std::uint32_t owner;
  std::uint64_t serial;
};
static_assert(sizeof(Tag) == kTag);

Tag tag_of(const Block& b) { return Tag{0xCA11A10Cu, b.owner, b.serial}; }

void fill(const Block& b) {
  CU(cuMemsetD8(b.p, pattern_byte(b.owner, b.serial), b.size));
  const Tag t = tag_of(b);
  if (b.size >= kTag) CU(cuMemcpyHtoD(b.p, &t, kTag));
  if (b.size >= 3 * kTag) CU(cuMemcpyHtoD(b.p + b.size - kTag, &t, kTag));
}

// The fake's device memory is host memory: read it in place.
void verify(const Block& b, const char* when) {
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(static_cast<std::uintptr_t>(b.p));
  const Tag t = tag_of(b);
  std::size_t lo = 0, hi = b.size;
  if (b.size >= kTag) {
    if (std::memcmp(bytes, &t, kTag) != 0) {
      Tag got;
      std::memcpy(&got, bytes, kTag);
      die("%s: block %#" PRIx64 " (%zu B, owner %u serial %" PRIu64 ") head tag is owner %u serial %" PRIu64
          " magic %#x: another allocation overlaps it",
          when, static_cast<std::uint64_t>(b.p), b.size, b.owner, b.serial, got.owner, got.serial, got.magic);
    }
    lo = kTag;
  }
  if (b.size >= 3 * kTag) {
    if (std::memcmp(bytes + b.size - kTag, &t, kTag) != 0)
      die("%s: block %#" PRIx64 " (%zu B, owner %u serial %" PRIu64 ") tail tag overwritten", when,
          static_cast<std::uint64_t>(b.p), b.size, b.owner, b.serial);
    hi = b.size - kTag;
  }
  const std::uint8_t v = pattern_byte(b.owner, b.serial);
  // A branch-free pass per 4 KiB (vectorized), the exact byte only on a mismatch.
  for (std::size_t chunk = lo; chunk < hi; chunk += 4 * KiB) {
    const std::size_t end = std::min(hi, chunk + 4 * KiB);
    std::uint8_t diff = 0;
    for (std::size_t i = chunk; i < end; ++i) diff |= static_cast<std::uint8_t>(bytes[i] ^ v);
    if (diff == 0) continue;
    for (std::size_t i = chunk; i < end; ++i)
      if (bytes[i] != v)
        die("%s: block %#" PRIx64 " (%zu B, owner %u serial %" PRIu64 ") byte %zu is %#x, expected %#x", when,
            static_cast<std::uint64_t>(b.p), b.size, b.owner, b.serial, i, bytes[i], v);
  }
  g_counts.verifies++;
}

bool overlaps(CUdeviceptr a, std::size_t an, CUdeviceptr b, std::size_t bn) { return a < b + bn && b < a + an; }

// ---------------- a worker ----------------

class Worker {
 public:
  Worker(std::uint32_t id, unsigned seed) : id_(id), rng_(seed) {}

  void run() {
    CUcontext ctx = nullptr;
    CU(cuDevicePrimaryCtxRetain(&ctx, 0));
    CU(cuCtxSetCurrent(ctx));
    seen_generation_ = g_reset_generation.load();
    for (int epoch = 0; epoch < g_opt.epochs; ++epoch) {
      pthread_rwlock_rdlock(&g_phase);
      if (const unsigned g = g_reset_generation.load(); g != seen_generation_) {
        // The primary context was reset: take it again (same handle, new context).
        CU(cuDevicePrimaryCtxRetain(&ctx, 0));
        CU(cuCtxSetCurrent(ctx));
        seen_generation_ = g;
      }
      for (int op = 0; op < g_opt.ops; ++op) step();
      end_epoch();
      pthread_rwlock_unlock(&g_phase);
      if (pick(g_opt.threads) == 0) maintenance(epoch);
    }
  }

 private:
  unsigned pick(unsigned n) { return std::uniform_int_distribution<unsigned>(0, n - 1)(rng_); }
  bool chance(unsigned percent) { return pick(100) < percent; }

  std::size_t random_size() {
    // Mostly small: the point is concurrency, not memory bandwidth.
    const unsigned r = pick(1000);
    if (r < 650) return 1 + pick(8 * KiB);              // small pool, many blocks per 2 MiB segment
    if (r < 950) return 8 * KiB + pick(120 * KiB);
    if (r < 997) return 128 * KiB + pick(3 * MiB);      // both pools
    return 10 * MiB + pick(6 * MiB);                     // large blocks in their own 20 MiB segments
  }

  // A private stream, created on demand.
  CUstream private_stream(int i) {
    if (priv_[i] == nullptr) {
      CU(cuStreamCreate(&priv_[i], chance(10) ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT));
      g_counts.streams++;
    }
    return priv_[i];
  }
  bool is_private(CUstream s) const {
    return s != nullptr && std::find(std::begin(priv_), std::end(priv_), s) != std::end(priv_);
  }

  // A stream safe to use from this thread now (alive at least until the
  // block is freed): legacy, per-thread, private or shared.
  CUstream any_stream() {
    switch (pick(4)) {
      case 0: return nullptr;
      case 1: return CU_STREAM_PER_THREAD;
      case 2: return private_stream(pick(kPrivateStreams));
      default: return g_shared[pick(kSharedStreams)];
    }
  }

  void remember(Block b) {
    b.priv = is_private(b.own) || std::any_of(b.uses.begin(), b.uses.end(), [&](CUstream s) { return is_private(s); });
    live_.push_back(std::move(b));
  }

  Block fresh_block(CUdeviceptr p, std::size_t size, CUstream own) {
    Block b;
    b.p = p;
    b.size = size;
    b.owner = id_;
    b.serial = ++serial_;
    b.own = own;
    fill(b);
    g_counts.allocs++;
    return b;
  }

  void allocate() {
    const std::size_t size = random_size();
    CUdeviceptr p = 0;
    CUstream own = nullptr;
    switch (pick(6)) {
      case 0:
      case 1: CU(cuMemAlloc(&p, size)); break;
      case 2: own = private_stream(pick(kPrivateStreams)); CU(cuMemAllocAsync(&p, size, own)); break;
      case 3: own = g_shared[pick(kSharedStreams)]; CU(cuMemAllocAsync(&p, size, own)); break;
      case 4: own = chance(50) ? nullptr : CU_STREAM_LEGACY; CU(cuMemAllocAsync(&p, size, own)); break;
      default:
        own = CU_STREAM_PER_THREAD;
        if (chance(50)) CU(cuMemAllocAsync(&p, size, own));
        else CU(cuMemAllocAsync_ptsz(&p, size, nullptr));
        break;
    }
    remember(fresh_block(p, size, own));
  }

  // Frees `b` (verified first) in one of the ways a program frees memory.
  void release(Block& b) {
    verify(b, "before free");
    const CUstream own = b.own == CU_STREAM_LEGACY ? nullptr : b.own;
    switch (pick(6)) {
      case 0: CU(cuMemFree(b.p)); break;
      case 1: CU(cuMemFreeAsync(b.p, own)); break;
      case 2: CU(cuMemFreeAsync(b.p, any_stream())); break;  // another stream: record-stream style
      case 3:
        record(b, any_stream());
        CU(cuMemFree(b.p));
        break;
      case 4:
        record(b, any_stream());
        CU(cuMemFreeAsync(b.p, own));
        break;
      default: CU(cuMemFreeAsync_ptsz(b.p, nullptr)); break;
    }
    g_counts.frees++;
  }

  void record(Block& b, CUstream s) {
    API(cachalloc_record_stream(reinterpret_cast<void*>(static_cast<std::uintptr_t>(b.p)), s), CACHALLOC_SUCCESS);
    b.uses.push_back(s);
    if (is_private(s)) b.priv = true;
    g_counts.record_stream++;
  }

  void free_random() {
    if (live_.empty()) return;
    const std::size_t i = pick(static_cast<unsigned>(live_.size()));
    Block b = std::move(live_[i]);
    live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(i));
    if (!b.priv && chance(20)) {  // hand it to another thread
      verify(b, "before handing over");
      std::lock_guard lock(g_mailbox_mutex);
      if (g_mailbox.size() < kMailboxMax) {
        g_mailbox.push_back(std::move(b));
        g_counts.handed++;
        return;
      }
    }
    release(b);
  }

  void take_from_mailbox() {
    Block b;
    {
      std::lock_guard lock(g_mailbox_mutex);
      if (g_mailbox.empty()) return;
      b = std::move(g_mailbox.front());
      g_mailbox.pop_front();
    }
    verify(b, "received from another thread");
    if (live_.size() < kMaxLive && chance(50)) {
      b.owner = id_;
      b.serial = ++serial_;
      fill(b);
      remember(std::move(b));
      g_counts.adopted++;
    } else {
      release(b);
    }
  }

  // Frees every block that names private stream `s`, then destroys it.
  void destroy_private(int i) {
    CUstream s = priv_[i];
    if (s == nullptr) return;
    if (held_ == s) unhold();
    for (std::size_t k = 0; k < live_.size();) {
      Block& b = live_[k];
      if (b.own == s || std::find(b.uses.begin(), b.uses.end(), s) != b.uses.end()) {
        verify(b, "before its stream is destroyed");
        CU(cuMemFree(b.p));
        g_counts.frees++;
        live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(k));
      } else {
        ++k;
      }
    }
    CU(cuStreamDestroy(s));
    priv_[i] = nullptr;
    // Blocks naming only other private streams keep b.priv.
  }

  void unhold() {
    fake_cuda_hold_stream(held_, 0);
    held_ = nullptr;
  }

  // Whether work enqueued on `s` now waits for the held stream's work: true
  // after a fence join (cuCtxWaitEvent), which lets a block freed behind the
  // busy stream be handed out at once.  An event recorded on `s` tells.
  bool ordered_after_held(CUstream s) {
    CUevent e = nullptr;
    CU(cuEventCreate(&e, 0));
    CU(cuEventRecord(e, s));
    const CUresult r = cuEventQuery(e);
    CU(cuEventDestroy(e));
    return r == CUDA_ERROR_NOT_READY;
  }

  // The early-reuse failure, with what tells its paths apart: how the block
  // was freed, the streams' kinds, the driver calls made since the free and
  // the allocator's fence and event counters.
  [[noreturn]] void die_early_reuse(CUdeviceptr p, CUdeviceptr q, std::size_t size, unsigned how, int k, CUstream s,
                                    CUstream y, const struct fake_cuda_stats_t& at_free) {
    static std::mutex once;  // one report: another thread failing too waits here until _exit
    once.lock();
    static const char* const kHow[] = {"cuMemFreeAsync on the busy stream", "record_stream, cuMemFreeAsync on its own",
                                       "record_stream, cuMemFree"};
    const struct fake_cuda_stats_t now = fake_stats();
    unsigned fs = 0, fy = 0;
    cuStreamGetFlags(s, &fs);
    cuStreamGetFlags(y, &fy);
    std::fprintf(stderr,
                 "stress: early reuse detail: thread %u, freed by %s, reuse on allocation %d of 3; own stream %s, "
                 "busy stream %s\n"
                 "  driver calls since the free: event_record %lu (ctx-wide %lu), event_query %lu, ctx_wait_event %lu, "
                 "stream_wait_event %lu, stream_query %lu, vm_map %lu, vm_unmap %lu, mem_alloc %lu, mem_free %lu, "
                 "ctx_destroyed %lu\n",
                 id_, kHow[how], k + 1, fs == CU_STREAM_NON_BLOCKING ? "non-blocking" : "blocking",
                 fy == CU_STREAM_NON_BLOCKING ? "non-blocking" : "blocking", now.event_record - at_free.event_record,
                 now.ctx_record_event - at_free.ctx_record_event, now.event_query - at_free.event_query,
                 now.ctx_wait_event - at_free.ctx_wait_event, now.stream_wait_event - at_free.stream_wait_event,
                 now.stream_query - at_free.stream_query, now.vm_map - at_free.vm_map, now.vm_unmap - at_free.vm_unmap,
                 now.mem_alloc - at_free.mem_alloc, now.mem_free - at_free.mem_free,
                 now.ctx_destroyed - at_free.ctx_destroyed);
    // Whether the allocator's state is still consistent (a block named twice,
    // or a pending one in a pool, shows here), and where p lies in it.
    char msg[512] = "";
    const int valid = cachalloc_validate(msg, sizeof msg);
    std::fprintf(stderr, "  cachalloc_validate: %d %s\n", valid, msg);
    char path[64];
    std::snprintf(path, sizeof path, "/tmp/stress-early-reuse-%d.json", static_cast<int>(getpid()));
    if (cachalloc_snapshot(path) == CACHALLOC_SUCCESS) std::fprintf(stderr, "  snapshot: %s\n", path);
    static std::vector<char> buf(1 * MiB);
    if (cachalloc_stats_json(buf.data(), buf.size()) == CACHALLOC_SUCCESS) std::fprintf(stderr, "  stats: %s\n", buf.data());
    die("early reuse: block %#" PRIx64 " (%zu B) freed behind a busy stream was handed out again as %#" PRIx64
        " before that stream's work completed",
        static_cast<std::uint64_t>(p), size, static_cast<std::uint64_t>(q));
  }

  // A block freed or recorded on a busy stream must not be handed out again
  // before that stream's work completes, unless all later work is ordered
  // after it.
  void early_reuse_check() {
    if (live_.size() + 4 > kMaxLive) return;
    CUstream s = private_stream(0), y = private_stream(1);
    const std::size_t size = random_size() % (2 * MiB) + 1;
    CUdeviceptr p = 0;
    CU(cuMemAllocAsync(&p, size, s));
    Block b = fresh_block(p, size, s);
    verify(b, "early-reuse block");
    fake_cuda_hold_stream(y, 1);
    held_ = y;
    const struct fake_cuda_stats_t at_free = fake_stats();
    const unsigned before = static_cast<unsigned>(sync_count());
    const unsigned how = pick(3);
    switch (how) {
      case 0: CU(cuMemFreeAsync(p, y)); break;
      case 1:
        record(b, y);
        CU(cuMemFreeAsync(p, s));
        break;
      default:
        record(b, y);
        CU(cuMemFree(p));
        break;
    }
    g_counts.frees++;
    for (int k = 0; k < 3; ++k) {
      CUdeviceptr q = 0;
      CU(cuMemAllocAsync(&q, size, s));
      const bool synced = static_cast<unsigned>(sync_count()) != before;
      if (!synced && overlaps(q, size, p, size) && !ordered_after_held(s))
        die_early_reuse(p, q, size, how, k, s, y, at_free);
      (synced ? g_counts.hold_skipped : g_counts.hold_checked)++;
      remember(fresh_block(q, size, s));
    }
    unhold();
  }

  void churn_stream() {
    const int i = static_cast<int>(pick(kPrivateStreams));
    destroy_private(i);
    if (chance(70)) private_stream(i);
  }

  void stats_json() {
    static thread_local std::vector<char> buf(1 * MiB);
    if (chance(20)) {
      char small[24];
      API(cachalloc_stats_json(small, sizeof small), CACHALLOC_ERROR_INVALID_VALUE);
      if (std::strtoull(small, nullptr, 10) < 100) die("cachalloc_stats_json: too-small buffer holds \"%s\"", small);
    } else {
      API(cachalloc_stats_json(buf.data(), buf.size()), CACHALLOC_SUCCESS);
      if (buf[0] != '{' || std::strstr(buf.data(), "\"devices\":[") == nullptr)
        die("cachalloc_stats_json: unexpected text: %.200s", buf.data());
    }
    g_counts.stats_json++;
  }

  void step() {
    const unsigned r = pick(1000);
    if (r < 300) {
      if (live_.size() < kMaxLive) allocate();
      else free_random();
    } else if (r < 600) {
      free_random();
    } else if (r < 690) {
      if (!live_.empty()) verify(live_[pick(static_cast<unsigned>(live_.size()))], "while live");
    } else if (r < 760) {
      take_from_mailbox();
    } else if (r < 800) {
      churn_stream();
    } else if (r < 840) {
      early_reuse_check();
    } else if (r < 845) {
      API(cachalloc_empty_cache(0), CACHALLOC_SUCCESS);
      g_counts.empty_cache++;
    } else if (r < 900) {
      stats_json();
    } else if (r < 920) {
      API(cachalloc_reset_peak_stats(0), CACHALLOC_SUCCESS);
    } else if (r < 930) {
      validate("during an epoch");
    } else if (!live_.empty()) {  // record a live block on another stream, free it later
      Block& b = live_[pick(static_cast<unsigned>(live_.size()))];
      if (b.uses.size() < 4) record(b, any_stream());
    }
  }

  // Nothing may stay alive across the writer's phase: blocks, holds, private streams.
  void end_epoch() {
    if (held_ != nullptr) unhold();
    for (Block& b : live_) release(b);
    live_.clear();
    for (int i = 0; i < kPrivateStreams; ++i) destroy_private(i);
  }

  void maintenance(int epoch);

  std::uint32_t id_;
  std::mt19937 rng_;
  std::uint64_t serial_ = 0;
  unsigned seen_generation_ = 0;
  std::vector<Block> live_;
  CUstream priv_[kPrivateStreams] = {};
  CUstream held_ = nullptr;
};

void create_shared_streams() {
  for (CUstream& s : g_shared) CU(cuStreamCreate(&s, CU_STREAM_DEFAULT));
}

void destroy_shared_streams() {
  for (CUstream& s : g_shared) {
    CU(cuStreamDestroy(s));
    s = nullptr;
  }
}

// Frees what other threads handed over and nobody took (writer only).
void drain_mailbox() {
  std::lock_guard lock(g_mailbox_mutex);
  for (Block& b : g_mailbox) {
    verify(b, "left in the mailbox");
    CU(cuMemFree(b.p));
    g_counts.frees++;
  }
  g_mailbox.clear();
}

// cudaDeviceReset's driver call, with no block or stream of the context
// alive: afterwards the calling thread has the new primary context current.
// Returns the new reset generation.
unsigned reset_primary_context() {
  destroy_shared_streams();
  CU(cuDevicePrimaryCtxReset(0));
  CUcontext ctx = nullptr;
  CU(cuDevicePrimaryCtxRetain(&ctx, 0));
  CU(cuCtxSetCurrent(ctx));
  // The old context's cache is retired; the new one has none yet.
  API(cachalloc_empty_cache(0), CACHALLOC_ERROR_INVALID_DEVICE);
  validate("after a reset");
  const unsigned generation = g_reset_generation.fetch_add(1) + 1;
  g_counts.resets++;
  create_shared_streams();
  check_fake_clean("after a reset");
  return generation;
}

// Alone (write lock): no worker holds a block or a private stream.
void Worker::maintenance(int epoch) {
  pthread_rwlock_wrlock(&g_phase);
  g_counts.maintenance++;
  drain_mailbox();
  validate("maintenance");
  check_fake_clean("maintenance");
  API(cachalloc_empty_cache(0), CACHALLOC_SUCCESS);
  // Everything was freed and the cache emptied: the driver holds nothing of cachalloc's
  // except what waits on events that the empty_cache completed.
  if (chance(30) || (epoch >= g_opt.epochs / 2 && g_counts.resets == 0)) {
    seen_generation_ = reset_primary_context();
  } else if (chance(50)) {
    destroy_shared_streams();
    create_shared_streams();
  }
  pthread_rwlock_unlock(&g_phase);
}

// ---------------- the monitor: read-only control calls from a thread with no context ----------------

void monitor() {
  std::vector<char> buf(2 * MiB);
  char path[256];
  std::snprintf(path, sizeof path, "%s/cachalloc-stress-%d.json", std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp",
                static_cast<int>(getpid()));
  int round = 0;
  while (!g_workers_done.load()) {
    API(cachalloc_stats_json(buf.data(), buf.size()), CACHALLOC_SUCCESS);
    validate("monitor");
    const int r = cachalloc_reset_peak_stats(0);  // no cache between a reset and the next allocation
    if (r != CACHALLOC_SUCCESS && r != CACHALLOC_ERROR_INVALID_DEVICE) die("cachalloc_reset_peak_stats(0) returned %d", r);
    API(cachalloc_empty_cache(1), CACHALLOC_ERROR_INVALID_DEVICE);  // one fake device
    API(cachalloc_empty_cache(-2), CACHALLOC_ERROR_INVALID_VALUE);
    API(cachalloc_record_stream(reinterpret_cast<void*>(std::uintptr_t{4096}), nullptr), CACHALLOC_ERROR_INVALID_VALUE);
    if (++round % 50 == 0) {
      API(cachalloc_snapshot(path), CACHALLOC_SUCCESS);
      g_counts.snapshots++;
    }
    g_counts.monitor_rounds++;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  unlink(path);
}

// The "<key>": values of every live context's device entry in the stats JSON.
std::vector<long long> live_values(const std::string& json, const std::string& key) {
  std::vector<long long> out;
  std::size_t at = 0;
  while ((at = json.find("{\"device\":", at)) != std::string::npos) {
    std::size_t end = json.find("{\"device\":", at + 1);
    const std::string entry = json.substr(at, end == std::string::npos ? std::string::npos : end - at);
    at += 1;
    if (entry.find("\"context_destroyed\":false") == std::string::npos) continue;
    const std::size_t k = entry.find("\"" + key + "\":");
    if (k == std::string::npos) die("stats JSON has no %s", key.c_str());
    out.push_back(std::strtoll(entry.c_str() + k + key.size() + 3, nullptr, 10));
  }
  return out;
}

std::string stats_text() {
  size_t need = 0;
  API(cachalloc_stats_json_size(&need), CACHALLOC_SUCCESS);
  std::string s(need + 4096, '\0');
  API(cachalloc_stats_json(s.data(), s.size()), CACHALLOC_SUCCESS);
  s.resize(std::strlen(s.c_str()));
  return s;
}

void parse_args(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (k == "--threads") g_opt.threads = std::max(1, v);
    else if (k == "--epochs") g_opt.epochs = std::max(1, v);
    else if (k == "--ops") g_opt.ops = std::max(1, v);
    else if (k == "--seed") g_opt.seed = static_cast<unsigned>(v);
    else die("unknown argument %s", argv[i]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  parse_args(argc, argv);
  const auto t0 = std::chrono::steady_clock::now();

  // Before any CUDA use cachalloc answers "not initialized".
  char small[8];
  API(cachalloc_stats_json(small, sizeof small), CACHALLOC_ERROR_NOT_INITIALIZED);

  pthread_rwlockattr_t attr;
  pthread_rwlockattr_init(&attr);
  pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init(&g_phase, &attr);

  CU(cuInit(0));
  CUcontext ctx = nullptr;
  CU(cuDevicePrimaryCtxRetain(&ctx, 0));
  CU(cuCtxSetCurrent(ctx));
  create_shared_streams();  // also creates the context's cache (stream bookkeeping)

  std::thread mon(monitor);
  std::vector<std::thread> workers;
  std::vector<Worker> states;
  states.reserve(static_cast<std::size_t>(g_opt.threads));
  for (int i = 0; i < g_opt.threads; ++i) states.emplace_back(static_cast<std::uint32_t>(i + 1), g_opt.seed * 7919u + static_cast<unsigned>(i));
  for (int i = 0; i < g_opt.threads; ++i) workers.emplace_back([&states, i] { states[static_cast<std::size_t>(i)].run(); });
  for (std::thread& t : workers) t.join();
  // Quiet now (but for the monitor): everything was freed.
  CU(cuCtxSetCurrent(ctx));
  drain_mailbox();
  if (g_counts.resets == 0) reset_primary_context();  // at least one per run
  g_workers_done = true;
  mon.join();

  destroy_shared_streams();
  validate("at the end");
  check_fake_clean("at the end");
  API(cachalloc_empty_cache(0), CACHALLOC_SUCCESS);
  API(cachalloc_empty_cache(-1), CACHALLOC_SUCCESS);
  const std::string json = stats_text();
  for (const char* key : {"allocated_bytes.all.current", "active_bytes.all.current", "reserved_bytes.all.current",
                          "segment.all.current"})
    for (long long v : live_values(json, key))
      if (v != 0) die("after freeing everything and empty_cache: %s is %lld", key, v);
  const struct fake_cuda_stats_t fs = fake_stats();
  if (fs.live_allocs != 0) die("after empty_cache the driver still holds %lu cuMemAlloc allocation(s)", fs.live_allocs);
  if (g_counts.hold_checked == 0) die("no early-reuse check ran without an intervening synchronization");

  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("stress: %d threads x %d epochs x %d ops, seed %u, %.2f s\n", g_opt.threads, g_opt.epochs, g_opt.ops,
              g_opt.seed, secs);
  std::printf("  allocs %lu, frees %lu, verifies %lu, handed over %lu (adopted %lu), streams created %lu\n",
              g_counts.allocs.load(), g_counts.frees.load(), g_counts.verifies.load(), g_counts.handed.load(),
              g_counts.adopted.load(), g_counts.streams.load());
  std::printf("  record_stream %lu, empty_cache %lu, stats_json %lu, validate %lu, snapshots %lu, monitor rounds %lu\n",
              g_counts.record_stream.load(), g_counts.empty_cache.load(), g_counts.stats_json.load(),
              g_counts.validate.load(), g_counts.snapshots.load(), g_counts.monitor_rounds.load());
  std::printf("  maintenance phases %lu, primary context resets %lu, early-reuse checks %lu (%lu skipped: a sync "
              "intervened)\n",
              g_counts.maintenance.load(), g_counts.resets.load(), g_counts.hold_checked.load(),
              g_counts.hold_skipped.load());
  std::printf("  fake driver: %lu cuMemAlloc, %lu events recorded, %lu synchronizations, %lu contexts destroyed\n",
              fs.mem_alloc, fs.event_record, fs.event_sync + fs.ctx_sync + fs.stream_sync, fs.ctx_destroyed);
  std::printf("stress: PASS\n");
  return 0;
}
