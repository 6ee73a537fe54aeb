// summary_table.h — the stats:stderr table.
//
// Per device, the layout of torch.cuda.memory_summary() (75 columns, boxed
// with '|', rows Allocated/Active/Requested/GPU reserved/Non-releasable
// memory, the allocation counts, the oversize rows; columns Cur Usage, Peak
// Usage, Tot Alloc, Tot Freed; OOM and retry counts in the header), with
// sizes and counts formatted exactly as PyTorch's _format_size/_format_count.
// Then one interposer section for the process: calls by entry point, calls
// passed through and why, device allocations avoided, peak fragmentation,
// time inside cachalloc.
#pragma once

#include <cstdint>
#include <string>

#include "process_report.h"

namespace cachalloc::obs {

// PyTorch's _format_size(sz, pref_sz): the unit is chosen from pref_sz (the
// "all" row's value, so sub-rows share its unit): "{:6d} {unit}" with units
// "B  ", "KiB", "MiB", "GiB", "TiB", "PiB", stepping while pref_sz >= 768 KiB.
std::string format_size(std::int64_t sz, std::int64_t pref_sz);
// PyTorch's _format_count(cnt, pref_cnt): "{:7d} {unit} " with units " ",
// "K", "M", stepping while pref_cnt >= 750 000.
std::string format_count(std::int64_t cnt, std::int64_t pref_cnt);

// The boxed table for one device, each line "|...|\n".
std::string device_table(int device, const DeviceStats& stats);
// The tags of a device (name, state, bytes, pause/resume counts); "" without tags.
std::string tag_table(const DeviceReport& d);

// allocation.all.allocated - num_device_alloc, clamped at 0.
std::int64_t device_allocations_avoided(const DeviceStats& stats);
// 1 - active_bytes.all.peak / reserved_bytes.all.peak; 0 when nothing was reserved.
double peak_fragmentation(const DeviceStats& stats);

// The interposer section (boxed like the tables).
std::string interposer_section(const ProcessReport& report);

// Every device table, then the interposer section.
std::string summary_text(const ProcessReport& report);

}  // namespace cachalloc::obs
