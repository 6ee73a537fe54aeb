// test_obs_oom.cpp — the out-of-memory report: message content, the
// fragmentation hint, NVML degrading to nothing, and the message logged at
// error level when a real allocator runs out (logger pointed at a file).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <fstream>
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
  r.stream = 0x55;
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
  CHECK(contains(m, "CUDA out of memory. Tried to allocate 3.00 GiB (rounded to 3.00 GiB) on stream 0x55."));
  CHECK(contains(m, "Device 4 has a total capacity of 80.00 GiB of which 1.50 GiB is free (driver)."));
  CHECK(contains(m, "allows 40.00 GiB"));
  CHECK(contains(m, "30.00 GiB is allocated by the program and 8.00 GiB is reserved by cachalloc but unallocated"));
  CHECK(contains(m, "the largest free cached block is 900.00 MiB"));
  CHECK(contains(m, "expandable_segments:true"));  // 8 GiB unallocated >= 3 GiB asked
  CHECK_FALSE(contains(m, "NVML"));
  CHECK(m.find('\n') == std::string::npos);  // one line without NVML
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
  CHECK(logger().level() == spdlog::level::err);
  init_logging(Config{});  // later calls do nothing
  CHECK(logger().level() == spdlog::level::err);

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

TEST_CASE("config log levels map to spdlog levels", "[obs][oom]") {
  CHECK(to_spdlog_level(LogLevel::warn) == spdlog::level::warn);
  CHECK(to_spdlog_level(LogLevel::debug) == spdlog::level::debug);
  CHECK(to_spdlog_level(LogLevel::off) == spdlog::level::off);
  CHECK(to_spdlog_level(LogLevel::err) == spdlog::level::err);
}
