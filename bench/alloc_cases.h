// alloc_cases.h — the measurement cases of bench/run-all.sh (issue 8), written
// once and instantiated for each allocator API:
//   bench/alloc_bench.cu        the CUDA runtime (cudaMalloc/cudaFree and
//                               cudaMallocAsync/cudaFreeAsync): the bare
//                               driver, CUDA's pool, the floor and cachalloc
//                               are this one binary, unmodified, with or
//                               without an LD_PRELOAD object;
//   bench/torch_alloc_bench.cpp PyTorch's caching allocator from C++
//                               (raw_alloc / raw_alloc_with_stream / raw_delete).
//
// No CUDA header here: a Backend supplies
//   static const char* api();                       "cudart" or "torch"
//   static bool init(std::string* why);             false: no usable GPU (exit 77)
//   static void* alloc(std::size_t);                the plain path (nullptr: failed)
//   static bool release(void*);
//   static void* alloc_async(std::size_t, void* stream);   the stream-ordered path
//   static bool release_async(void*, void* stream);
//   static bool new_stream(bool blocking, void** out);     false: not supported
//   static void destroy_stream(void*);
//   static void use_stream(void* stream);           make `stream` the plain path's stream
//                                                   for this thread (no-op for cudart)
//   static void sync();                             device-wide synchronize
//   static std::string last_error();
//
// Invocation: GROUP [key=value ...]; GROUP is pair, blocking, nonblocking,
// async, live, threads or a comma-separated list of them.  Keys (defaults in
// Options below): sizes=512,1MiB,64MiB  reps=5  batch_ms=3  churn=1
// churn_ms=20  churn_live=1000  seed=1234  live=100,...,1000000  live_size=512
// live_max_plain=0  live_max_async=0 (0: no cap)  live_paths=plain,async
// threads=1,2,4,8,16  thread_size=512  thread_ms=15  thread_reps=3
// thread_paths=plain,async  streams=own,shared  paths= (sets both *_paths)
// label= (echoed in META).
//
// Every result is one line on stdout:
//   BENCH {"group":"pair","case":"pair","param":512,"ns":123.4,"reps":[...],"iters":N}
// (ns: host ns per malloc+free pair; churn: ns per call; threads: aggregate
// ns per pair and pairs per second).  run_bench.py parses only these lines.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace allocbench {

using Clock = std::chrono::steady_clock;

inline double ns_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// key=value arguments, with defaults.
struct Options {
  std::string group;
  std::vector<std::size_t> sizes{512, 1u << 20, 64u << 20};
  std::vector<std::size_t> live{100, 1000, 10000, 100000, 1000000};
  std::size_t live_size = 512;          // size of each held block and of the timed pair
  std::size_t live_max_plain = 0;       // 0: no cap; else skip live counts above it on the plain path
  std::size_t live_max_async = 0;
  std::vector<int> threads{1, 2, 4, 8, 16};
  std::size_t thread_size = 512;
  std::vector<std::string> live_paths{"plain", "async"};    // live group
  std::vector<std::string> thread_paths{"plain", "async"};  // threads group
  std::vector<std::string> stream_modes{"own", "shared"};
  int reps = 5;                 // timed batches per case within the process
  int thread_reps = 3;          // measurements per thread count (threads group)
  double batch_ms = 3.0;        // target duration of one timed batch
  double churn_ms = 20.0;       // target duration of one churn batch
  double thread_ms = 15.0;      // duration of one threads measurement
  int churn = 1;                // 0: no churn case in pair/async groups
  int churn_live = 1000;
  std::uint64_t seed = 1234;
  std::string label = "";
};

inline std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

inline std::size_t parse_size(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit = end ? end : "";
  if (unit == "K" || unit == "KiB") v *= 1024.0;
  else if (unit == "M" || unit == "MiB") v *= 1024.0 * 1024.0;
  else if (unit == "G" || unit == "GiB") v *= 1024.0 * 1024.0 * 1024.0;
  else if (!unit.empty() || end == s.c_str()) {  // 1e6 is read by strtod itself
    std::fprintf(stderr, "alloc_bench: cannot read size '%s'\n", s.c_str());
    std::exit(2);
  }
  return static_cast<std::size_t>(v);
}

inline bool parse_options(int argc, char** argv, Options* o, std::string* err) {
  if (argc < 2) {
    *err = "usage: GROUP [key=value ...]; groups: pair blocking nonblocking async live threads";
    return false;
  }
  o->group = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    auto eq = a.find('=');
    if (eq == std::string::npos) {
      *err = "argument without '=': " + a;
      return false;
    }
    std::string k = a.substr(0, eq), v = a.substr(eq + 1);
    auto sizes = [&](std::vector<std::size_t>* out) {
      out->clear();
      for (auto& x : split(v, ',')) out->push_back(parse_size(x));
    };
    if (k == "sizes") sizes(&o->sizes);
    else if (k == "live") sizes(&o->live);
    else if (k == "live_size") o->live_size = parse_size(v);
    else if (k == "live_max_plain") o->live_max_plain = parse_size(v);
    else if (k == "live_max_async") o->live_max_async = parse_size(v);
    else if (k == "threads") {
      o->threads.clear();
      for (auto& x : split(v, ',')) o->threads.push_back(std::atoi(x.c_str()));
    } else if (k == "thread_size") o->thread_size = parse_size(v);
    else if (k == "paths") o->live_paths = o->thread_paths = split(v, ',');
    else if (k == "live_paths") o->live_paths = split(v, ',');
    else if (k == "thread_paths") o->thread_paths = split(v, ',');
    else if (k == "thread_reps") o->thread_reps = std::max(1, std::atoi(v.c_str()));
    else if (k == "streams") o->stream_modes = split(v, ',');
    else if (k == "reps") o->reps = std::max(1, std::atoi(v.c_str()));
    else if (k == "batch_ms") o->batch_ms = std::atof(v.c_str());
    else if (k == "churn_ms") o->churn_ms = std::atof(v.c_str());
    else if (k == "thread_ms") o->thread_ms = std::atof(v.c_str());
    else if (k == "churn") o->churn = std::atoi(v.c_str());
    else if (k == "churn_live") o->churn_live = std::max(1, std::atoi(v.c_str()));
    else if (k == "seed") o->seed = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "label") o->label = v;
    else {
      *err = "unknown key: " + k;
      return false;
    }
  }
  return true;
}

inline std::string json_list(const std::vector<double>& v) {
  std::string s = "[";
  char buf[64];
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s%.2f", i ? "," : "", v[i]);
    s += buf;
  }
  return s + "]";
}

inline void emit(const Options& o, const char* kase, double param, double ns, const std::vector<double>& reps,
                 long long iters, const std::string& extra = "") {
  std::printf("BENCH {\"group\":\"%s\",\"case\":\"%s\",\"param\":%.0f,\"ns\":%.2f,\"reps\":%s,\"iters\":%lld%s}\n",
              o.group.c_str(), kase, param, ns, json_list(reps).c_str(), iters, extra.c_str());
  std::fflush(stdout);
}

inline void note(const Options& o, const std::string& what) {
  std::string s;
  for (char c : what) s += (c == '"' || c == '\\') ? '\'' : c;
  std::printf("NOTE {\"group\":\"%s\",\"note\":\"%s\"}\n", o.group.c_str(), s.c_str());
  std::fflush(stdout);
}

template <class B>
[[noreturn]] void die(const char* what) {
  std::printf("alloc_bench(%s): %s failed: %s\n", B::api(), what, B::last_error().c_str());
  std::fflush(stdout);
  std::exit(1);
}

// One path of one backend: plain (cudaMalloc) or async (cudaMallocAsync on `stream`).
template <class B>
struct Path {
  bool async = false;
  void* stream = nullptr;
  void* try_alloc(std::size_t n) const { return async ? B::alloc_async(n, stream) : B::alloc(n); }
  void* alloc(std::size_t n) const {
    void* p = try_alloc(n);
    if (p == nullptr) die<B>(async ? "async allocation" : "allocation");
    return p;
  }
  void release(void* p) const {
    if (!(async ? B::release_async(p, stream) : B::release(p))) die<B>(async ? "async free" : "free");
  }
};

// ns per pair: warm up, size a batch to about batch_ms, then `reps` batches.
template <class B>
std::pair<double, std::vector<double>> time_pairs(const Options& o, const Path<B>& p, std::size_t size,
                                                  long long* iters_out) {
  for (int i = 0; i < 10; ++i) p.release(p.alloc(size));
  auto t0 = Clock::now();
  const int probe = 8;
  for (int i = 0; i < probe; ++i) p.release(p.alloc(size));
  const double est = std::max(1.0, ns_since(t0) / probe);
  long long iters = static_cast<long long>(o.batch_ms * 1e6 / est);
  iters = std::clamp<long long>(iters, 16, 2000000);
  std::vector<double> reps;
  for (int r = 0; r < o.reps; ++r) {
    auto t = Clock::now();
    for (long long i = 0; i < iters; ++i) p.release(p.alloc(size));
    reps.push_back(ns_since(t) / static_cast<double>(iters));
  }
  *iters_out = iters;
  return {median(reps), reps};
}

template <class B>
void pairs_case(const Options& o, const Path<B>& p, const char* kase) {
  for (std::size_t size : o.sizes) {
    long long iters = 0;
    auto [ns, reps] = time_pairs(o, p, size, &iters);
    emit(o, kase, static_cast<double>(size), ns, reps, iters);
  }
}

// Churn: `churn_live` live blocks of random sizes (log-uniform 512 B .. 32 MiB,
// fixed seed: the same sequence for every contender); each step frees a random
// live block and allocates a new one.  ns per call (two calls per step).
template <class B>
void churn_case(const Options& o, const Path<B>& p, const char* kase) {
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> log2size(9.0, 25.0);
  auto random_size = [&] { return static_cast<std::size_t>(std::exp2(log2size(rng))); };
  std::vector<void*> live(static_cast<std::size_t>(o.churn_live));
  for (auto& ptr : live) ptr = p.alloc(random_size());
  // The plan is drawn before timing: 1<<16 steps, reused cyclically.
  std::vector<std::pair<std::uint32_t, std::size_t>> plan(1u << 16);
  for (auto& [slot, size] : plan) {
    slot = static_cast<std::uint32_t>(rng() % live.size());
    size = random_size();
  }
  std::size_t next = 0;
  auto run = [&](double ms, long long* steps) {
    const double limit = ms * 1e6;
    long long n = 0;
    auto t = Clock::now();
    double el = 0;
    do {
      for (int k = 0; k < 32; ++k) {
        const auto& [slot, size] = plan[next];
        next = (next + 1) & (plan.size() - 1);
        p.release(live[slot]);
        live[slot] = p.alloc(size);
      }
      n += 32;
      el = ns_since(t);
    } while (el < limit);
    *steps = n;
    return el / (2.0 * static_cast<double>(n));
  };
  long long steps = 0;
  run(o.churn_ms, &steps);  // warm-up: the cache fills with the sizes in play
  std::vector<double> reps;
  long long total = 0;
  for (int r = 0; r < o.reps; ++r) {
    reps.push_back(run(o.churn_ms, &steps));
    total += steps;
  }
  for (void* ptr : live) p.release(ptr);
  B::sync();
  emit(o, kase, static_cast<double>(o.churn_live), median(reps), reps, total);
}

// Cost against the number of live blocks: hold N blocks of live_size, then
// time pairs of live_size.
template <class B>
void live_case(const Options& o, const Path<B>& p, const char* kase, std::size_t cap) {
  for (std::size_t n : o.live) {
    if (cap && n > cap) {
      note(o, std::string(kase) + ": " + std::to_string(n) + " live blocks skipped (cap " + std::to_string(cap) +
                  " for this contender, to keep the run short)");
      continue;
    }
    std::vector<void*> held;
    held.reserve(n);
    auto t0 = Clock::now();
    for (std::size_t i = 0; i < n; ++i) {
      void* ptr = p.try_alloc(o.live_size);
      if (ptr == nullptr) break;
      held.push_back(ptr);
    }
    if (held.size() < n) {  // out of memory (or another failure): say so, keep the smaller counts
      note(o, std::string(kase) + ": " + std::to_string(n) + " live blocks: allocation failed after " +
                  std::to_string(held.size()) + " (" + B::last_error() + "); larger counts skipped");
      for (void* ptr : held) p.release(ptr);
      B::sync();
      break;
    }
    const double fill_ns = ns_since(t0) / static_cast<double>(std::max<std::size_t>(n, 1));
    long long iters = 0;
    auto [ns, reps] = time_pairs(o, p, o.live_size, &iters);
    t0 = Clock::now();
    for (void* ptr : held) p.release(ptr);
    B::sync();
    const double drain_ns = ns_since(t0) / static_cast<double>(std::max<std::size_t>(n, 1));
    char extra[128];
    std::snprintf(extra, sizeof extra, ",\"fill_ns\":%.1f,\"drain_ns\":%.1f", fill_ns, drain_ns);
    emit(o, kase, static_cast<double>(n), ns, reps, iters, extra);
  }
}

// A reusable barrier (std::barrier needs C++20; nvcc builds this as C++17).
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lk(m_);
    const long gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lk, [&] { return gen != gen_; });
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, count_ = 0;
  long gen_ = 0;
};

// Aggregate throughput: T threads allocating and freeing pairs of
// thread_size for thread_ms, each on its own stream ("own") or all on one
// ("shared").  Emits aggregate ns per pair (wall / total pairs) and pairs/s.
template <class B>
void threads_case(const Options& o, bool async, const std::string& mode) {
  void* shared_stream = nullptr;
  const bool shared = mode == "shared";
  if (shared && !B::new_stream(false, &shared_stream)) {
    note(o, "threads: no stream for the shared mode");
    return;
  }
  const std::string kase = std::string("threads_") + (async ? "async" : "plain") + "_" + mode;
  for (int t : o.threads) {
    if (t < 1) continue;
    std::vector<double> reps_ns, reps_rate;
    long long total_pairs = 0;
    for (int r = 0; r < o.thread_reps; ++r) {
      Barrier start(t + 1), stop(t + 1);
      std::vector<long long> pairs(static_cast<std::size_t>(t), 0);
      std::vector<double> elapsed(static_cast<std::size_t>(t), 0);
      std::atomic<bool> failed{false};
      std::vector<std::thread> pool;
      for (int i = 0; i < t; ++i) {
        pool.emplace_back([&, i] {
          void* stream = shared_stream;
          bool own = false;
          if (!shared) own = B::new_stream(false, &stream);
          if (!shared && !own) failed = true;
          B::use_stream(stream);
          Path<B> p{async, stream};
          for (int k = 0; k < 64; ++k) p.release(p.alloc(o.thread_size));
          start.wait();
          const double limit = o.thread_ms * 1e6;
          long long n = 0;
          auto t0 = Clock::now();
          double el = 0;
          do {
            for (int k = 0; k < 32; ++k) p.release(p.alloc(o.thread_size));
            n += 32;
            el = ns_since(t0);
          } while (el < limit);
          pairs[static_cast<std::size_t>(i)] = n;
          elapsed[static_cast<std::size_t>(i)] = el;
          stop.wait();
          if (own) {
            B::sync();
            B::destroy_stream(stream);
          }
        });
      }
      start.wait();
      stop.wait();
      for (auto& th : pool) th.join();
      if (failed) {
        note(o, kase + ": a thread could not create its stream");
        break;
      }
      long long n = 0;
      double wall = 0;
      for (int i = 0; i < t; ++i) {
        n += pairs[static_cast<std::size_t>(i)];
        wall = std::max(wall, elapsed[static_cast<std::size_t>(i)]);
      }
      total_pairs += n;
      reps_ns.push_back(wall / static_cast<double>(n));
      reps_rate.push_back(static_cast<double>(n) / (wall * 1e-9));
    }
    if (reps_ns.empty()) continue;
    char extra[96];
    std::snprintf(extra, sizeof extra, ",\"pairs_per_s\":%.1f,\"threads\":%d", median(reps_rate), t);
    emit(o, kase.c_str(), t, median(reps_ns), reps_ns, total_pairs, extra);
  }
  B::sync();
  if (shared_stream) B::destroy_stream(shared_stream);
}

template <class B>
int run_group(const Options& o) {
  Path<B> plain;
  if (o.group == "pair") {
    // No stream exists in the process: the case an interposer must make cheapest.
    pairs_case(o, plain, "pair");
    if (o.churn) churn_case(o, plain, "churn");
  } else if (o.group == "blocking" || o.group == "nonblocking") {
    const bool blocking = o.group == "blocking";
    void* s = nullptr;
    if (!B::new_stream(blocking, &s)) {
      note(o, std::string("no ") + o.group + " stream with this API: group skipped");
      return 77;
    }
    pairs_case(o, plain, blocking ? "pair_blocking" : "pair_nonblocking");
    if (o.churn) churn_case(o, plain, blocking ? "churn_blocking" : "churn_nonblocking");
    B::sync();
    B::destroy_stream(s);
  } else if (o.group == "async") {
    Path<B> a{true, nullptr};
    if (!B::new_stream(false, &a.stream)) die<B>("stream creation");
    pairs_case(o, a, "async");
    if (o.churn) churn_case(o, a, "churn_async");
    B::sync();
    B::destroy_stream(a.stream);
  } else if (o.group == "live") {
    for (const std::string& path : o.live_paths) {
      if (path == "plain") {
        live_case(o, plain, "live_plain", o.live_max_plain);
      } else if (path == "async") {
        Path<B> a{true, nullptr};
        if (!B::new_stream(false, &a.stream)) die<B>("stream creation");
        live_case(o, a, "live_async", o.live_max_async);
        B::sync();
        B::destroy_stream(a.stream);
      }
    }
  } else if (o.group == "threads") {
    for (const std::string& path : o.thread_paths)
      for (const std::string& mode : o.stream_modes) threads_case<B>(o, path == "async", mode);
  } else {
    std::printf("alloc_bench: unknown group '%s'\n", o.group.c_str());
    return 2;
  }
  return 0;
}

template <class B>
int bench_main(int argc, char** argv) {
  Options o;
  std::string err;
  if (!parse_options(argc, argv, &o, &err)) {
    std::printf("alloc_bench: %s\n", err.c_str());
    return 2;
  }
  std::string why;
  if (!B::init(&why)) {
    std::printf("alloc_bench(%s): SKIP (%s)\n", B::api(), why.c_str());
    return 77;
  }
  const char* preload = std::getenv("LD_PRELOAD");
  std::printf("META {\"api\":\"%s\",\"group\":\"%s\",\"label\":\"%s\",\"ld_preload\":\"%s\"}\n", B::api(),
              o.group.c_str(), o.label.c_str(), preload ? preload : "");
  std::fflush(stdout);
  // GROUP may list several groups (pair,blocking,...): run one after the
  // other in this process (run_bench.py's quick preset; a stream a group
  // creates is destroyed before the next group starts).  Exit status: the
  // first failure, else 77 if every group skipped, else 0.
  int rc = 0, ran = 0;
  for (const std::string& g : split(o.group, ',')) {
    Options one = o;
    one.group = g;
    const int r = run_group<B>(one);
    std::printf("DONE {\"group\":\"%s\",\"rc\":%d}\n", g.c_str(), r);
    std::fflush(stdout);
    if (r != 0 && r != 77 && rc == 0) rc = r;
    if (r == 0) ++ran;
  }
  return rc != 0 ? rc : (ran ? 0 : 77);
}

}  // namespace allocbench
