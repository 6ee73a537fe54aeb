// oom_message.cpp — the out-of-memory report (issue 4, item 4), in the words
// of PyTorch's "CUDA out of memory. Tried to allocate ..." message.
#include <fmt/format.h>

#include "process_observer.h"

namespace cachalloc::obs {

namespace {

// PyTorch's format_size() for messages: bytes, then KiB/MiB/GiB with two decimals.
std::string human(std::size_t bytes) {
  if (bytes < 1024) return fmt::format("{} bytes", bytes);
  double v = static_cast<double>(bytes);
  if (bytes < MiB) return fmt::format("{:.2f} KiB", v / KiB);
  if (bytes < GiB) return fmt::format("{:.2f} MiB", v / MiB);
  return fmt::format("{:.2f} GiB", v / GiB);
}

// Fragmentation is the likely culprit when the request would have fitted in
// the cache's unallocated reserve plus what the device could still give
// (driver free, capped by the fraction) — had the reserve been contiguous.
// A request larger than all of that is simply too big: no hint.
bool fragmentation_hint(const OomReport& r, std::size_t unallocated) {
  std::size_t under_fraction = r.allowed > r.reserved ? r.allowed - r.reserved : 0;
  std::size_t headroom = r.device_free < under_fraction ? r.device_free : under_fraction;
  return unallocated > 0 && unallocated + headroom >= r.rounded;
}

}  // namespace

std::string format_oom_message(int device, const OomReport& r, const std::string& nvml_lines) {
  std::size_t unallocated = r.reserved > r.allocated ? r.reserved - r.allocated : 0;
  std::string msg = fmt::format(
      "CUDA out of memory. Tried to allocate {} (rounded to {}) on stream {:#x}. "
      "Device {} has a total capacity of {} of which {} is free (driver). "
      "The per-process memory fraction allows {}. "
      "Of the memory cachalloc reserved, {} is allocated by the program and {} is reserved by cachalloc "
      "but unallocated; the largest free cached block is {}.",
      human(r.requested), human(r.rounded), r.stream, device, human(r.device_total), human(r.device_free),
      human(r.allowed), human(r.allocated), human(unallocated), human(r.largest_free_block));
  if (fragmentation_hint(r, unallocated))
    msg += " If reserved but unallocated memory is large, try setting "
           "CACHALLOC_CONF=expandable_segments:true to avoid fragmentation.";
  if (!nvml_lines.empty()) msg += "\nMemory held per process on this device (NVML):\n" + nvml_lines;
  return msg;
}

}  // namespace cachalloc::obs
