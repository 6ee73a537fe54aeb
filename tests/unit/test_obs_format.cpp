// test_obs_format.cpp — the stats:stderr table: PyTorch's size/count
// formatting (exact strings) and the memory_summary() layout.
#include <catch2/catch.hpp>

#include <sstream>
#include <string>
#include <vector>

#include "obs/summary_table.h"

using namespace cachalloc;
using namespace cachalloc::obs;

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

DeviceStats sample_stats() {
  DeviceStats s;
  s.allocated_bytes.increase(false, 20 * MiB);  // large pool: 20 MiB allocated...
  s.allocated_bytes.decrease(false, 15 * MiB);  // ...15 MiB freed, 5 MiB current, peak 20 MiB
  s.allocated_bytes.increase(true, 10 * KiB);   // small pool: 10 KiB
  s.reserved_bytes.increase(false, 40 * MiB);
  s.active_bytes.increase(false, 5 * MiB);
  for (int i = 0; i < 3; ++i) s.allocation.increase(false, 1);
  s.allocation.decrease(false, 1);
  s.num_ooms = 2;
  s.num_alloc_retries = 7;
  s.oversize_allocations.increase(1);
  return s;
}

}  // namespace

TEST_CASE("format_size matches PyTorch's _format_size", "[obs][format]") {
  CHECK(format_size(0, 0) == "     0 B  ");
  CHECK(format_size(1023, 1023) == "  1023 B  ");
  CHECK(format_size(786431, 786431) == "786431 B  ");  // just under 768 KiB: still bytes
  CHECK(format_size(786432, 786432) == "   768 KiB");
  CHECK(format_size(5 * MiB, 5 * MiB) == "  5120 KiB");  // PyTorch's quirk: MiB only from 768 MiB
  CHECK(format_size(1 * GiB, 1 * GiB) == "  1024 MiB");
  CHECK(format_size(3 * GiB + 512 * MiB, 3 * GiB + 512 * MiB) == "  3584 MiB");
  CHECK(format_size(800 * GiB, 800 * GiB) == "   800 GiB");
  CHECK(format_size(2048LL * GiB * 1024, 2048LL * GiB * 1024) == "  2048 TiB");  // PiB only from 768 * 1024 TiB
  CHECK(format_size(1LL << 60, 1LL << 60) == "  1024 PiB");
  CHECK(format_size(1536, 1536) == "  1536 B  ");
  CHECK(format_size(1500, 1000 * KiB) == "     1 KiB");  // integer division, unit of the reference
  CHECK(format_size(10 * KiB, 5 * MiB) == "    10 KiB");  // sub-row takes the "all" row's unit
  CHECK(format_size(1234567, 100) == "1234567 B  ");     // wider than 6: grows, like Python
}

TEST_CASE("format_count matches PyTorch's _format_count", "[obs][format]") {
  CHECK(format_count(0, 0) == "      0   ");
  CHECK(format_count(749999, 749999) == " 749999   ");
  CHECK(format_count(750000, 750000) == "    750 K ");
  CHECK(format_count(2500000000LL, 2500000000LL) == "   2500 M ");
  CHECK(format_count(12, 1000000) == "      0 K ");
}

TEST_CASE("device table has memory_summary's layout", "[obs][format]") {
  std::string table = device_table(3, sample_stats());
  auto lines = lines_of(table);
  REQUIRE(lines.size() == 49);  // 6 header lines, 9 metrics x 4, 2 oversize x 2, capture-held x 2, closing rule
  for (const auto& l : lines) {
    INFO(l);
    CHECK(l.size() == 77);
    CHECK(l.front() == '|');
    CHECK(l.back() == '|');
  }
  CHECK(lines[0] == "|" + std::string(75, '=') + "|");
  CHECK(lines[1] == "|                cachalloc CUDA memory summary, device ID 3                 |");
  CHECK(lines[2] == "|" + std::string(75, '-') + "|");
  CHECK(lines[3] == "|            CUDA OOMs: 2            |        cudaMalloc retries: 7         |");
  CHECK(lines[5] == "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |");
  CHECK(lines[7] == "| Allocated memory      |   5130 KiB |  20480 KiB |  20490 KiB |  15360 KiB |");
  CHECK(lines[8] == "|       from large pool |   5120 KiB |  20480 KiB |  20480 KiB |  15360 KiB |");
  CHECK(lines[9] == "|       from small pool |     10 KiB |     10 KiB |     10 KiB |      0 KiB |");
  CHECK(lines[19] == "| GPU reserved memory   |  40960 KiB |  40960 KiB |  40960 KiB |      0 B   |");
  CHECK(lines[27] == "| Allocations           |       2    |       3    |       3    |       1    |");
  CHECK(lines[45] == "| Oversize GPU segments |       0    |       0    |       0    |       0    |");
  CHECK(lines[43] == "| Oversize allocations  |       1    |       1    |       1    |       0    |");
  CHECK(lines[42] == lines[2]);
  CHECK(lines[44] == lines[2]);
  CHECK(lines[46] == lines[2]);
  CHECK(lines[47].substr(0, 25) == "| Capture-held memory   |");  // not PyTorch's: graph_owners.h
  CHECK(lines[48] == "|" + std::string(75, '=') + "|");
  // Row order is memory_summary()'s.
  const char* names[] = {"Allocated memory", "Active memory", "Requested memory", "GPU reserved memory",
                         "Non-releasable memory", "Allocations", "Active allocs", "GPU reserved segments",
                         "Non-releasable allocs"};
  for (int m = 0; m < 9; ++m) CHECK(lines[7 + 4 * m].substr(2, std::string(names[m]).size()) == names[m]);
}

TEST_CASE("derived figures: allocations avoided and peak fragmentation", "[obs][format]") {
  DeviceStats s;
  for (int i = 0; i < 10; ++i) s.allocation.increase(false, 1);
  s.num_device_alloc = 3;
  CHECK(device_allocations_avoided(s) == 7);
  s.num_device_alloc = 12;  // more device calls than allocations (expandable chunks): nothing avoided
  CHECK(device_allocations_avoided(s) == 0);

  CHECK(peak_fragmentation(s) == 0.0);  // nothing reserved
  s.reserved_bytes.increase(false, 100 * MiB);
  s.active_bytes.increase(false, 75 * MiB);
  CHECK(peak_fragmentation(s) == Approx(0.25));
}

TEST_CASE("interposer section lists every entry point and reason", "[obs][format]") {
  ProcessReport r;
  r.calls[static_cast<int>(Entry::cuMemAlloc_v2)] = 123;
  r.calls[static_cast<int>(Entry::cudaFreeAsync)] = 45;
  r.passthrough[static_cast<int>(Passthrough::foreign_pointer)] = 6;
  r.ns_inside = 1'500'000'000;
  DeviceReport d;
  d.device = 0;
  d.stats = sample_stats();
  r.devices.push_back(d);

  std::string text = summary_text(r);
  auto lines = lines_of(text);
  for (const auto& l : lines) CHECK(l.size() == 77);
  auto has_line = [&](const std::string& want) {
    for (const auto& l : lines)
      if (l == want) return true;
    return false;
  };
  CHECK(has_line("|    cuMemAlloc_v2                                                      123 |"));
  CHECK(has_line("|    cudaFreeAsync                                                       45 |"));
  CHECK(has_line("|    foreign_pointer                                                      6 |"));
  CHECK(has_line("|    capture                                                              0 |"));
  CHECK(has_line("|  Device 0: device allocations avoided                                   3 |"));
  CHECK(has_line("|  Device 0: peak fragmentation                                      87.5 % |"));
  CHECK(has_line("|  Time inside cachalloc                                            1.500 s |"));
  r.ns_inside = 2'345'000;  // under a second: milliseconds, same column
  std::string ms_line = "|  Time inside cachalloc                                            1.500 s |";
  ms_line.replace(ms_line.find(" 1.500 s"), 8, "2.345 ms");
  CHECK(summary_text(r).find(ms_line) != std::string::npos);
  for (int e = 0; e < static_cast<int>(Entry::count); ++e)
    CHECK(text.find(std::string("    ") + entry_name(static_cast<Entry>(e)) + " ") != std::string::npos);
  // The device table comes first, the interposer section last.
  CHECK(text.find("CUDA memory summary, device ID 0") < text.find("cachalloc interposer summary"));
}

TEST_CASE("tag table: where each tag's backup is, and the staging of disk backups", "[obs][format]") {
  DeviceReport d;
  d.device = 1;
  TagStats w;
  w.tag = 1;
  w.paused = true;
  w.backup = true;
  w.backup_mode = w.backup_location = BackupMode::disk;
  w.reserved_bytes = w.allocated_bytes = w.paused_bytes = 3 * GiB;
  w.backup_bytes = w.disk_bytes = 3 * GiB;
  w.staging_bytes = 128 * MiB;
  w.pauses = 12;
  w.resumes = 11;
  TagStats k;
  k.tag = 2;
  k.backup = true;
  k.backup_mode = BackupMode::host;  // running: no backup held, its pauses go to host memory
  k.reserved_bytes = k.allocated_bytes = 20 * MiB;
  TagStats n;
  n.tag = 3;
  d.tags = {{"weights", w}, {"kv_cache", k}, {"scratch", n}};
  const auto lines = lines_of(tag_table(d));
  for (const auto& l : lines) {
    INFO(l);
    CHECK(l.size() == 77);
  }
  REQUIRE(lines.size() == 8);
  CHECK(lines[2] == "| tag            state  reserved allocated    paused    backup   in  pau/res|");
  CHECK(lines[3] == "| weights       paused    3.0GiB    3.0GiB    3.0GiB    3.0GiB disk    12/11|");
  CHECK(lines[4] == "| kv_cache     running   20.0MiB   20.0MiB        0B        0B host      0/0|");
  CHECK(lines[5] == "| scratch      running        0B        0B        0B        0B    -      0/0|");
  CHECK(lines[6] == "| disk backups stage through 128.0MiB of pinned host memory                 |");
}
