// test_obs_dumpgen.cpp — writes a stats dump, a trace and the C++ summary
// table from a real allocator run on the fake backend, so that
// test_obs_report.sh can check scripts/cachalloc-report against them.
//   test_obs_dumpgen DUMP.json TRACE.json TABLE.txt [variant]
// variant 1 changes the workload (for `diff`) and adds a pinned host cache
// run (the dump's "pinned_host" object, the table's pinned rows).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>

#include "caching_allocator.h"
#include "fake_backend.h"
#include "host_cache.h"
#include "obs/process_observer.h"
#include "obs/reports.h"
#include "obs/summary_table.h"

using namespace cachalloc;

namespace {

// Pinned memory is malloc'ed; every fence has completed when queried.
class MallocHost final : public HostBackend {
 public:
  ~MallocHost() override {
    for (void* p : live_) std::free(p);
  }
  Status host_alloc(std::size_t size, unsigned, void** out) override {
    *out = std::aligned_alloc(4096, size);
    live_.insert(*out);
    return *out != nullptr ? kSuccess : kOutOfMemory;
  }
  Status host_free(void* p) override {
    live_.erase(p);
    std::free(p);
    return kSuccess;
  }
  Status fence_record(FenceId* out) override { return *out = ++fences_, kSuccess; }
  Status fence_query(FenceId) override { return kSuccess; }
  Status fence_synchronize(FenceId) override { return kSuccess; }
  void fence_destroy(FenceId) override {}

 private:
  std::set<void*> live_;
  FenceId fences_ = 0;
};

// Four pinned allocations: three from the driver, then one served by the
// first block freed (after a fence); one still held at the end; a 64 KiB
// block freed over a 64 KiB limit already full goes back to the driver.
HostStats pinned_run() {
  MallocHost backend;
  HostCache cache(&backend, 64 * 1024);
  void *a = nullptr, *b = nullptr, *c = nullptr, *d = nullptr;
  cache.allocate(5000, 0, 1, &a);
  cache.allocate(70'000, 0, 1, &b);
  cache.allocate(40'000, kHostAllocPortable, 1, &c);
  cache.free(a);
  cache.allocate(6000, 0, 1, &d);  // a again
  cache.free(c);                   // 64 KiB cached: the limit
  cache.free(b);                   // a 128 KiB class: over it, to the driver
  HostStats s = cache.stats();
  cache.free(d);
  cache.empty_cache();
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s DUMP.json TRACE.json TABLE.txt [variant]\n", argv[0]);
    return 2;
  }
  int variant = argc > 4 ? std::atoi(argv[4]) : 0;
  Config cfg;
  cfg.stats = argv[1];
  cfg.trace = argv[2];
  cfg.trace_max_entries = 1000;
  obs::ProcessObserver observer;
  observer.configure(cfg);

  // Two devices, so tables, counters and plots are per device.
  testing::FakeBackend backend0(16 * GiB), backend1(16 * GiB);
  CachingAllocator alloc0(&backend0, cfg, 0), alloc1(&backend1, cfg, 1);
  alloc0.set_observer(&observer);
  alloc1.set_observer(&observer);
  DevicePtr ptrs[40] = {};
  for (int round = 0; round < 3 + variant; ++round) {
    CachingAllocator& alloc = round % 2 == 0 ? alloc0 : alloc1;
    for (int i = 0; i < 40; ++i)
      if (alloc.malloc(&ptrs[i], std::size_t(1000 + i * 700'000 * (round + 1)), StreamId(i % 2)) != kSuccess) return 1;
    for (int i = 0; i < 40; i += 1 + (round % 2))
      if (alloc.free(ptrs[i]) != kSuccess) return 1;
  }
  alloc0.empty_cache();

  obs::ProcessReport report;
  report.config = cfg;
  report.pid = 1234;
  report.command_line = "test_obs_dumpgen variant " + std::to_string(variant);
  report.calls[static_cast<int>(obs::Entry::cuMemAlloc_v2)] = 120 + variant;
  report.passthrough[static_cast<int>(obs::Passthrough::foreign_pointer)] = 3;
  report.ns_inside = 123'456'789;
  report.devices.push_back(obs::DeviceReport{0, alloc0.stats(), 16 * GiB, {}});
  report.devices.push_back(obs::DeviceReport{1, alloc1.stats(), 16 * GiB, {}});
  if (variant == 1) {
    report.has_host = true;
    report.host = pinned_run();
  }
  obs::write_exit_reports(report, observer.trace_contents());
  std::ofstream(argv[3]) << obs::summary_text(report);
  return 0;
}
