// test_obs_dumpgen.cpp — writes a stats dump, a trace and the C++ summary
// table from a real allocator run on the fake backend, so that
// test_obs_report.sh can check scripts/cachalloc-report against them.
//   test_obs_dumpgen DUMP.json TRACE.json TABLE.txt [variant]
// variant 1 changes the workload (for `diff`).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "caching_allocator.h"
#include "fake_backend.h"
#include "obs/process_observer.h"
#include "obs/reports.h"
#include "obs/summary_table.h"

using namespace cachalloc;

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
  obs::write_exit_reports(report, observer.trace_contents());
  std::ofstream(argv[3]) << obs::summary_text(report);
  return 0;
}
