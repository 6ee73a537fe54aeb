// summary_table.cpp — see summary_table.h.  The formatting follows
// torch/cuda/memory.py (memory_summary, _format_size, _format_count) line by
// line, so users read the same table they know.
#include "summary_table.h"

#include <algorithm>
#include <string_view>

#include "format.h"
namespace cachalloc::obs {

namespace {

constexpr int kWidth = 75;

// Python's floor division, which _format_size uses (sz //= 1024).
std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  std::int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

std::string rule(char c) { return "|" + std::string(kWidth, c) + "|\n"; }
std::string boxed(std::string_view line) { return obs::format("|{}|\n", line); }

using Formatter = std::string (*)(std::int64_t, std::int64_t);

void stat_row(std::string& out, std::string_view name, const Stat& s, const Stat& pref, Formatter f) {
  out += boxed(obs::format(" {:<21} | {} | {} | {} | {} ", name, f(s.current, pref.current),
                           f(s.peak, pref.peak), f(s.allocated, pref.allocated), f(s.freed, pref.freed)));
}

void pool_rows(std::string& out, std::string_view name, const StatArray& arr, Formatter f) {
  out += rule('-');
  const Stat& all = arr[StatType::aggregate];
  stat_row(out, name, all, all, f);
  stat_row(out, "      from large pool", arr[StatType::large_pool], all, f);
  stat_row(out, "      from small pool", arr[StatType::small_pool], all, f);
}

std::string header(int device, const DeviceStats& s) {
  std::string out = rule('=');
  out += boxed(obs::format(" {:14} cachalloc CUDA memory summary, device ID {:<17d} ", "", device));
  out += rule('-');
  out += boxed(obs::format("  {:9} CUDA OOMs: {:<12d} | {:6} cudaMalloc retries: {:<8d}  ", "", s.num_ooms, "",
                           s.num_alloc_retries));
  out += rule('=');
  out += boxed("        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ");
  return out;
}

void value_row(std::string& out, std::string_view label, std::string_view value) {
  out += boxed(obs::format(" {:<44}{:>29} ", label, value));
}

// Seconds from 1 s up, else milliseconds: most programs spend well under a
// second inside cachalloc, and "0.000 s" would say nothing.
std::string duration(std::uint64_t ns) {
  if (ns >= 1'000'000'000) return obs::format("{:.3f} s", static_cast<double>(ns) / 1e9);
  return obs::format("{:.3f} ms", static_cast<double>(ns) / 1e6);
}

}  // namespace

std::string format_size(std::int64_t sz, std::int64_t pref_sz) {
  static const char* const kUnits[] = {"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double pref = static_cast<double>(pref_sz);
  int unit = 0;
  while (unit + 1 < 6 && !(pref < 768 * 1024)) {
    ++unit;
    sz = floor_div(sz, 1024);
    pref /= 1024;
  }
  return obs::format("{:6d} {}", sz, kUnits[unit]);
}

std::string format_count(std::int64_t cnt, std::int64_t pref_cnt) {
  static const char* const kUnits[] = {" ", "K", "M"};
  double pref = static_cast<double>(pref_cnt);
  int unit = 0;
  while (unit + 1 < 3 && !(pref < 750 * 1000)) {
    ++unit;
    cnt = floor_div(cnt, 1000);
    pref /= 1000;
  }
  return obs::format("{:7d} {} ", cnt, kUnits[unit]);
}

std::string device_table(int device, const DeviceStats& s) {
  std::string out = header(device, s);
  pool_rows(out, "Allocated memory", s.allocated_bytes, format_size);
  pool_rows(out, "Active memory", s.active_bytes, format_size);
  pool_rows(out, "Requested memory", s.requested_bytes, format_size);
  pool_rows(out, "GPU reserved memory", s.reserved_bytes, format_size);
  pool_rows(out, "Non-releasable memory", s.inactive_split_bytes, format_size);
  pool_rows(out, "Allocations", s.allocation, format_count);
  pool_rows(out, "Active allocs", s.active, format_count);
  pool_rows(out, "GPU reserved segments", s.segment, format_count);
  pool_rows(out, "Non-releasable allocs", s.inactive_split, format_count);
  for (auto [name, stat] : {std::pair<const char*, const Stat*>{"Oversize allocations", &s.oversize_allocations},
                            {"Oversize GPU segments", &s.oversize_segments}}) {
    out += rule('-');
    stat_row(out, name, *stat, *stat, format_count);
  }
  // Not in PyTorch's table: blocks freed during graph captures, kept until
  // every graph made from the capture is destroyed (shim/graph_owners.h).
  // A program whose graphs live until exit still holds them here.
  out += rule('-');
  stat_row(out, "Capture-held memory", s.capture_held_bytes, s.capture_held_bytes, format_size);
  out += rule('=');
  return out;
}

// "1023.9MiB": at most 9 characters.
std::string short_size(std::size_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (unit + 1 < 5 && v >= 1024.0) {
    v /= 1024.0;
    ++unit;
  }
  return unit == 0 ? obs::format("{}B", bytes) : obs::format("{:.1f}{}", v, kUnits[unit]);
}

std::string tag_table(const DeviceReport& d) {
  if (d.tags.empty()) return "";
  std::string out = boxed(obs::format(" {:<74}", obs::format("Tags of device {} (docs/PAUSE.md)", d.device)));
  out += rule('-');
  auto row = [&](std::string_view text) { out += boxed(obs::format("{:<75.75}", text)); };
  // "in": where the backup is (host: pinned, page: pageable, or disk), else where the tag's
  // pauses put it ("-": no backup).
  row(obs::format(" {:<12} {:>7} {:>9} {:>9} {:>9} {:>9} {:>4} {:>8}", "tag", "state", "reserved", "allocated",
                  "paused", "backup", "in", "pau/res"));
  for (const TagReport& t : d.tags) {
    const TagStats& s = t.stats;
    const BackupMode where = s.backup_location != BackupMode::none ? s.backup_location : s.backup_mode;
    row(obs::format(" {:<12.12} {:>7} {:>9} {:>9} {:>9} {:>9} {:>4} {:>8}", t.name, s.paused ? "paused" : "running",
                    short_size(s.reserved_bytes), short_size(s.allocated_bytes), short_size(s.paused_bytes),
                    short_size(s.backup_bytes),
                    where == BackupMode::disk       ? "disk"
                    : where == BackupMode::host     ? "host"
                    : where == BackupMode::pageable ? "page"
                                                    : "-",
                    obs::format("{}/{}", s.pauses, s.resumes)));
  }
  std::size_t staging = 0;
  for (const TagReport& t : d.tags) staging = std::max(staging, t.stats.staging_bytes);
  if (staging != 0) row(obs::format(" disk backups stage through {} of pinned host memory", short_size(staging)));
  out += rule('=');
  return out;
}

std::int64_t device_allocations_avoided(const DeviceStats& s) {
  std::int64_t avoided = s.allocation[StatType::aggregate].allocated - s.num_device_alloc;
  return avoided > 0 ? avoided : 0;
}

double peak_fragmentation(const DeviceStats& s) {
  std::int64_t reserved = s.reserved_bytes[StatType::aggregate].peak;
  if (reserved <= 0) return 0.0;
  return 1.0 - static_cast<double>(s.active_bytes[StatType::aggregate].peak) / static_cast<double>(reserved);
}

std::string interposer_section(const ProcessReport& r) {
  std::string out = rule('=');
  out += boxed(obs::format("{:^75}", "cachalloc interposer summary"));
  out += rule('-');
  out += boxed(obs::format(" {:<73} ", "Calls by entry point"));
  for (int e = 0; e < static_cast<int>(Entry::count); ++e)
    value_row(out, obs::format("   {}", entry_name(static_cast<Entry>(e))), std::to_string(r.calls[e]));
  out += rule('-');
  out += boxed(obs::format(" {:<73} ", "Calls passed through to the driver, by reason"));
  for (int p = 0; p < static_cast<int>(Passthrough::count); ++p)
    value_row(out, obs::format("   {}", passthrough_name(static_cast<Passthrough>(p))),
              std::to_string(r.passthrough[p]));
  out += rule('-');
  for (const DeviceReport& d : r.devices) {
    value_row(out, obs::format(" Device {}: device allocations avoided", d.device),
              std::to_string(device_allocations_avoided(d.stats)));
    value_row(out, obs::format(" Device {}: peak fragmentation", d.device),
              obs::format("{:.1f} %", 100.0 * peak_fragmentation(d.stats)));
  }
  if (r.has_host) {
    const HostStats& h = r.host;
    value_row(out, " Pinned host: served (of which cache hits)",
              obs::format("{} ({})", h.allocations.allocated, h.num_cache_hits));
    value_row(out, " Pinned host: driver allocs / frees", obs::format("{} / {}", h.num_host_alloc, h.num_host_free));
    value_row(out, " Pinned host: reserved now (peak)",
              obs::format("{} ({})", format_size(h.reserved_bytes.current, h.reserved_bytes.current),
                          format_size(h.reserved_bytes.peak, h.reserved_bytes.peak)));
    value_row(out, " Pinned host: driver alloc / free time",
              obs::format("{} / {}", duration(h.host_alloc_time_ns), duration(h.host_free_time_ns)));
  }
  value_row(out, " Time inside cachalloc", duration(r.ns_inside));
  value_row(out, obs::format("   of which in {} driver calls", r.driver_calls), duration(r.ns_in_driver));
  for (int i = 0; i < static_cast<int>(DriverCall::count); ++i)
    if (r.driver_calls_by[i] != 0)
      value_row(out, obs::format("     {}", driver_call_name(static_cast<DriverCall>(i))),
                std::to_string(r.driver_calls_by[i]));
  out += rule('=');
  return out;
}

std::string summary_text(const ProcessReport& r) {
  std::string out;
  for (const DeviceReport& d : r.devices) out += device_table(d.device, d.stats) + tag_table(d);
  out += interposer_section(r);
  // Under the table, unboxed (the messages are long): what the process
  // ran without (issue 37).
  if (!r.config_errors.empty()) {
    out += obs::format("CACHALLOC_CONF items not applied ({}):\n", r.config_errors.size());
    for (const std::string& e : r.config_errors) out += "  " + e + "\n";
  }
  return out;
}

}  // namespace cachalloc::obs
