// test_obs_oom.cpp — the out-of-memory report: message content, the
// fragmentation hint, NVML degrading to nothing, and the message logged at
// error level when a real allocator runs out (logger pointed at a file).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "caching_allocator.h"
#include "fake_backend.h"
#include "obs/log.h"
#include "obs/process_observer.h"

using namespace cachalloc;
using namespace cachalloc::obs;

namespace {

OomReport sample() {
  OomReport r;
  r.requested = 3 * GiB + 1;
  r.rounded = 3 * GiB + 2 * MiB;
  r.device_total = 80 * GiB;
  r.device_free = 1536 * MiB;
  r.allowed = 40 * GiB;
  r.allocated = 30 * GiB;
  r.reserved = 38 * GiB;
  r.largest_free_block = 900 * MiB;
  r.stream = 0x7f5500;  // a stream handle
  return r;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("OOM message states every figure PyTorch's does, and more", "[obs][oom]") {
  std::string m = format_oom_message(4, sample(), "");
  INFO(m);
  CHECK(contains(m, "CUDA out of memory. Tried to allocate 3.00 GiB (rounded to 3.00 GiB) on stream 0x7f5500."));
  CHECK(contains(m, "Device 4 has a total capacity of 80.00 GiB of which 1.50 GiB is free (driver)."));
  CHECK(contains(m, "allows cachalloc 40.00 GiB"));
  CHECK(contains(m, "30.00 GiB is allocated by the program and 8.00 GiB is reserved by cachalloc but unallocated"));
  CHECK(contains(m, "the largest free cached block is 900.00 MiB"));
  CHECK(contains(m, "expandable_segments:true"));  // 8 GiB unallocated >= 3 GiB asked
  CHECK_FALSE(contains(m, "NVML"));
  CHECK(m.find('\n') == std::string::npos);  // one line without NVML
}

TEST_CASE("OOM message names the stream as the program knows it", "[obs][oom]") {
  // The shim's ids (shim/stream_ids.h): 2 = cuMemAlloc/cudaMalloc (no
  // stream), 0 = legacy, odd = a per-thread default stream token.
  OomReport r = sample();
  r.stream = 2;
  CHECK(contains(format_oom_message(0, r, ""), "Tried to allocate 3.00 GiB (rounded to 3.00 GiB) for "
                                               "cudaMalloc/cuMemAlloc (no stream). Device 0"));
  CHECK_FALSE(contains(format_oom_message(0, r, ""), "0x2"));
  r.stream = 0;
  CHECK(contains(format_oom_message(0, r, ""), "(rounded to 3.00 GiB) on the legacy default stream. Device 0"));
  r.stream = 0x7f00deadbeef;
  CHECK(contains(format_oom_message(0, r, ""), "on this thread's per-thread default stream. Device 0"));
  r.stream = 0x7f00deadbee0;
  CHECK(contains(format_oom_message(0, r, ""), "on stream 0x7f00deadbee0. Device 0"));
}

TEST_CASE("OOM message says which limit refused the request, and what to do", "[obs][oom]") {
  // per_process_memory_fraction:0.001 on a 1 GiB device: 1.02 MiB allowed,
  // less than the smallest (2 MiB) segment: every allocation fails.
  OomReport r;
  r.requested = 1000;
  r.rounded = 1024;
  r.device_total = 1 * GiB;
  r.device_free = 1 * GiB;
  r.allowed = static_cast<std::size_t>(0.001 * static_cast<double>(GiB));
  r.stream = 2;
  std::string m = format_oom_message(0, r, "");
  INFO(m);
  CHECK(contains(m, "Tried to allocate 1000 bytes (rounded to 1.00 KiB) for cudaMalloc/cuMemAlloc (no stream). Device 0 "
                    "has a total capacity of 1.00 GiB of which 1.00 GiB is free (driver). "
                    "per_process_memory_fraction:0.001 allows cachalloc 1.02 MiB of the device, less than the 2.00 MiB "
                    "segment it needs even for the smallest request, so every allocation fails. Raise "
                    "per_process_memory_fraction to at least 0.002, or remove it from CACHALLOC_CONF."));
  CHECK_FALSE(contains(m, "Of the memory cachalloc reserved"));  // it reserved nothing
  CHECK(m.find('\n') == std::string::npos);
  // A 5 MiB request needs a 20 MiB segment: 1% of 1 GiB (10.24 MiB) is not enough.
  r.requested = r.rounded = 5 * MiB;
  r.allowed = static_cast<std::size_t>(0.01 * static_cast<double>(GiB));
  m = format_oom_message(0, r, "");
  CHECK(contains(m, "per_process_memory_fraction:0.01 allows cachalloc 10.24 MiB of the device, less than the "
                    "20.00 MiB segment it needs for a request of this size, so every such allocation fails."));
  CHECK(contains(m, "to at least 0.02,"));
  // The fraction is binding: the cache holds most of what it allows.
  r = sample();
  r.device_free = 30 * GiB;
  m = format_oom_message(0, r, "");
  CHECK(contains(m, "The per-process memory fraction allows cachalloc 40.00 GiB and it already holds 38.00 GiB for "
                    "this program, so a new 3.00 GiB segment would exceed it (the device itself still has 30.00 GiB "
                    "free). Free memory the program no longer needs, or raise per_process_memory_fraction"));
  // The device is full.
  r = sample();
  r.allowed = r.device_total;
  m = format_oom_message(0, r, "");
  CHECK(contains(m, "The device has 1.50 GiB free and cachalloc needs a 3.00 GiB segment for this request; the rest "
                    "of the device is held by this program (38.00 GiB through cachalloc) and by other processes."));
  CHECK_FALSE(contains(m, "per_process_memory_fraction"));
  // Larger than the device: no configuration helps.
  r.requested = r.rounded = 1024 * GiB;
  m = format_oom_message(0, r, "");
  CHECK(contains(m, "The request is larger than device 0's total memory (80.00 GiB): it cannot succeed on this "
                    "device, with or without cachalloc."));
  // A driver refusal despite free memory.
  r = sample();
  r.allowed = r.device_total;
  r.device_free = 10 * GiB;
  CHECK(contains(format_oom_message(0, r, ""), "The driver refused a 3.00 GiB segment although it reports 10.00 GiB free"));
  // A tagged request inside the memory margin (torch_memory_saver's memory_margin_bytes).
  r.tag_margin = 8 * GiB;
  m = format_oom_message(0, r, "");
  CHECK(contains(m, "A pausable (tagged) allocation must leave the memory margin free (8.00 GiB, "
                    "cachalloc_set_memory_margin / memory_margin_bytes), and a new 3.00 GiB segment would leave "
                    "7.00 GiB of the device's 10.00 GiB free."));
  r.tag_margin = 6 * GiB;  // the margin is not what refused it
  CHECK(contains(format_oom_message(0, r, ""), "The driver refused a 3.00 GiB segment"));
}

TEST_CASE("no fragmentation hint when the cache holds little unallocated memory", "[obs][oom]") {
  OomReport r = sample();
  r.allocated = 38 * GiB - 4 * MiB;  // 4 MiB unallocated of 38 GiB
  std::string m = format_oom_message(0, r, "");
  CHECK(contains(m, "4.00 MiB is reserved by cachalloc but unallocated"));
  CHECK_FALSE(contains(m, "expandable_segments"));
  // More than the device could ever give: no hint either.
  r = sample();
  r.requested = r.rounded = 1024 * GiB;
  CHECK_FALSE(contains(format_oom_message(0, r, ""), "expandable_segments"));
  // Fits in unallocated reserve + driver free (1.5 GiB), had it been contiguous: hint.
  r = sample();
  r.allocated = r.reserved - 2 * GiB;
  CHECK(contains(format_oom_message(0, r, ""), "expandable_segments"));
  // ...but not when the fraction leaves no room beyond the reserve.
  r.allowed = r.reserved;
  CHECK_FALSE(contains(format_oom_message(0, r, ""), "expandable_segments"));
  r.allocated = r.reserved = 0;
  r.requested = r.rounded = 512;
  CHECK(contains(format_oom_message(0, r, ""), "Tried to allocate 512 bytes"));
}

TEST_CASE("NVML lines are appended when present; absent library gives none", "[obs][oom]") {
  std::string m = format_oom_message(0, sample(), "  process 12 uses 100.00 MiB\n");
  CHECK(contains(m, "\nMemory held per process on this device (NVML):\n  process 12 uses 100.00 MiB\n"));
  // This machine has no driver: the optional dlopen must fail quietly.
  if (access("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", F_OK) != 0) CHECK(nvml_process_usage(0).empty());
}

TEST_CASE("a real allocator's OOM is logged at error level", "[obs][oom]") {
  char name[] = "/tmp/cachalloc-log-XXXXXX";
  int fd = mkstemp(name);
  REQUIRE(fd >= 0);
  close(fd);
  Config cfg;
  cfg.log_file = name;
  cfg.log_level = LogLevel::err;
  init_logging(cfg);
  CHECK(logger().level() == LogLevel::err);
  init_logging(Config{});  // later calls do nothing
  CHECK(logger().level() == LogLevel::err);

  ProcessObserver obs;
  obs.configure(Config{});
  testing::FakeBackend backend(1 * GiB);
  CachingAllocator alloc(&backend, Config{}, 0);
  alloc.set_observer(&obs);
  DevicePtr p = 0;
  CHECK(alloc.malloc(&p, 2 * GiB, 0) == kOutOfMemory);
  logger().info("not written: below the level");
  logger().flush();
  std::string log = read_file(name);
  unlink(name);
  INFO(log);
  CHECK(contains(log, "[cachalloc " + std::to_string(getpid()) + " error] CUDA out of memory. Tried to allocate 2.00 GiB"));
  CHECK(contains(log, "Device 0 has a total capacity of 1.00 GiB"));
  CHECK_FALSE(contains(log, "not written"));
}

TEST_CASE("sizes whose rounding would overflow are out of memory, never a small block", "[obs][oom]") {
  struct Last : AllocatorObserver {
    OomReport last;
    int ooms = 0;
    void on_event(int, const TraceEvent&) override {}
    void on_oom(int, const OomReport& r) override { last = r, ++ooms; }
  } obs;
  testing::FakeBackend backend(1 * GiB);
  for (const char* divisions : {"1", "4", "[1:4,>:8]"}) {
    Config cfg;
    cfg.roundup_power2_divisions.fill(1);
    std::string text = std::string("roundup_power2_divisions:") + divisions;
    REQUIRE(parse_config(text, &cfg).empty());
    CachingAllocator alloc(&backend, cfg, 0);
    alloc.set_observer(&obs);
    DevicePtr small = 0;
    REQUIRE(alloc.malloc(&small, 1000, 0) == kSuccess);  // a cached small block a wrap-around could hand out
    REQUIRE(alloc.free(small) == kSuccess);
    const std::size_t max = std::numeric_limits<std::size_t>::max();
    for (std::size_t size : {max, max - 1, max - 511, max - 2 * MiB, max / 2 + 1, (max >> 2) + 2, std::size_t{1} << 63,
                             (std::size_t{1} << 62) + 1, (std::size_t{1} << 62) - 1, 3 * (std::size_t{1} << 60)}) {
      INFO(text << " size " << size);
      DevicePtr p = 0;
      const int before = obs.ooms;
      CHECK(alloc.malloc(&p, size, 0) == kOutOfMemory);
      CHECK(p == 0);
      CHECK(obs.ooms == before + 1);
      CHECK(obs.last.requested == size);
      CHECK(obs.last.rounded >= size);  // never wrapped to something small
    }
    DevicePtr again = 0;  // allocations still work (the failed ones released the cache, as PyTorch's do)
    CHECK(alloc.malloc(&again, 1000, 0) == kSuccess);
    CHECK(alloc.free(again) == kSuccess);
  }
  CHECK(contains(format_oom_message(0, obs.last, ""), "The request is larger than device 0's total memory"));
}

TEST_CASE("the logger writes the configured level and those above it", "[obs][oom]") {
  Logger log;  // a logger of its own: the process's is configured once
  CHECK(log.level() == LogLevel::warn);  // before init_logging, as spdlog's default
  CHECK(log.should_log(LogLevel::warn));
  CHECK(log.should_log(LogLevel::err));
  CHECK_FALSE(log.should_log(LogLevel::info));
  log.set_level(LogLevel::debug);
  CHECK(log.should_log(LogLevel::debug));
  CHECK_FALSE(log.should_log(LogLevel::trace));
  log.set_level(LogLevel::off);
  for (LogLevel l : {LogLevel::trace, LogLevel::warn, LogLevel::critical, LogLevel::off}) CHECK_FALSE(log.should_log(l));
  log.set_level(LogLevel::trace);
  CHECK(log.should_log(LogLevel::trace));
  CHECK_FALSE(log.should_log(LogLevel::off));
}
