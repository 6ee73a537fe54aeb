// oom_message.cpp — the out-of-memory report (issue 4, item 4), in the words
// of PyTorch's "CUDA out of memory. Tried to allocate ..." message, plus what
// PyTorch leaves the user to work out: which limit refused the request, and
// what to change (issue 10, item 5).
#include <cmath>
#include <string_view>

#include "format.h"
#include "process_observer.h"
#include "size_policy.h"

namespace cachalloc::obs {

namespace {

// PyTorch's format_size() for messages: bytes, then KiB/MiB/GiB with two decimals.
std::string human(std::size_t bytes) {
  if (bytes < 1024) return obs::format("{} bytes", bytes);
  double v = static_cast<double>(bytes);
  if (bytes < MiB) return obs::format("{:.2f} KiB", v / KiB);
  if (bytes < GiB) return obs::format("{:.2f} MiB", v / MiB);
  return obs::format("{:.2f} GiB", v / GiB);
}

// The stream as the program knows it.  The ids are the shim's
// (shim/stream_ids.h), the only producer of OomReports in a process:
//   2    the pseudo-stream of cuMemAlloc/cudaMalloc blocks, which have none;
//   0    the legacy default stream (handle 0 or CU_STREAM_LEGACY);
//   odd  a thread's per-thread default stream (a token, not a handle; the
//        report is made on the allocating thread, so it is that thread's);
//   else the CUstream handle itself.
std::string stream_phrase(StreamId stream) {
  if (stream == 2) return "for cudaMalloc/cuMemAlloc (no stream)";
  if (stream == 0) return "on the legacy default stream";
  if ((stream & 1u) != 0) return "on this thread's per-thread default stream";
  return obs::format("on stream {:#x}", stream);
}

// `x` rounded up to two significant digits (0.001953 -> 0.002).
double round_up_2_digits(double x) {
  if (!(x > 0.0)) return x;
  const double scale = std::pow(10.0, 1.0 - std::floor(std::log10(x)));
  return std::ceil(x * scale - 1e-9) / scale;
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

// Why the request failed and what to do, from the first limit that refused
// it: the device itself, the per-process memory fraction, or the memory
// other allocations (of this program or of other processes) hold.
std::string reason_and_remedy(int device, const OomReport& r) {
  const bool capped = r.device_total > 0 && r.allowed < r.device_total;
  // What the cache asks the device for when no cached block fits.  With
  // expandable segments it maps pages instead (2 MiB small, 20 MiB large),
  // which for a request no larger than 1 MiB is the same 2 MiB.
  const std::size_t segment = segment_size_for(r.rounded);
  if (r.device_total > 0 && r.rounded > r.device_total)
    return obs::format(
        "The request is larger than device {}'s total memory ({}): it cannot succeed on this device, with or "
        "without cachalloc. Check the size the program computes, or split the data.",
        device, human(r.device_total));
  if (capped && segment > r.allowed) {
    const double fraction = static_cast<double>(r.allowed) / static_cast<double>(r.device_total);
    double needed = round_up_2_digits(static_cast<double>(segment) / static_cast<double>(r.device_total));
    std::string raise = needed <= 1.0 ? obs::format("to at least {:g}", needed) : "";
    return obs::format(
        "per_process_memory_fraction:{:.3g} allows cachalloc {} of the device, less than the {} segment it needs "
        "{}. Raise per_process_memory_fraction{}{}, or remove it from CACHALLOC_CONF.",
        fraction, human(r.allowed), human(segment),
        segment <= kSmallBuffer ? "even for the smallest request, so every allocation fails"
                                : "for a request of this size, so every such allocation fails",
        raise.empty() ? "" : " ", raise);
  }
  if (capped && r.reserved + segment > r.allowed)
    return obs::format(
        "The per-process memory fraction allows cachalloc {} and it already holds {} for this program, so a new "
        "{} segment would exceed it (the device itself still has {} free). Free memory the program no longer "
        "needs, or raise per_process_memory_fraction in CACHALLOC_CONF.",
        human(r.allowed), human(r.reserved), human(segment), human(r.device_free));
  if (r.tag_margin != 0 && (r.device_free < segment || r.device_free - segment < r.tag_margin))
    return obs::format(
        "A pausable (tagged) allocation must leave the memory margin free ({}, cachalloc_set_memory_margin / "
        "memory_margin_bytes), and a new {} segment would leave {} of the device's {} free. Free memory the "
        "program no longer needs, pause a tag, or lower the margin.",
        human(r.tag_margin), human(segment), human(r.device_free > segment ? r.device_free - segment : 0),
        human(r.device_free));
  if (r.device_free >= segment)
    return obs::format(
        "The driver refused a {} segment although it reports {} free (its free memory may be fragmented, or "
        "another process allocated in the meantime). Free memory the program no longer needs, or stop other "
        "processes using device {}.",
        human(segment), human(r.device_free), device);
  return obs::format(
      "The device has {} free and cachalloc needs a {} segment for this request; the rest of the device is held "
      "by this program ({} through cachalloc) and by other processes. Free memory the program no longer needs, "
      "or stop other processes using device {}.",
      human(r.device_free), human(segment), human(r.reserved), device);
}

}  // namespace

// The first two cases of reason_and_remedy(): nothing the program frees or
// waits for changes them.
const char* oom_repeat_reason(const OomReport& r) {
  if (r.device_total > 0 && r.rounded > r.device_total) return "larger_than_device";
  const bool capped = r.device_total > 0 && r.allowed < r.device_total;
  if (capped && segment_size_for(r.rounded) > r.allowed) return "per_process_memory_fraction";
  return nullptr;
}

std::size_t oom_need(const OomReport& r) {
  if (r.device_total > 0 && r.rounded > r.device_total) return r.rounded;
  return segment_size_for(r.rounded);
}

std::string repeated_oom_summary(const RepeatedOom& rep) {
  if (std::string_view(rep.reason) == "larger_than_device")
    return obs::format(
        "{} allocations on device {} were larger than its total memory ({}); the largest asked for {}. The "
        "message was printed once (the first).",
        rep.count, rep.device, human(rep.device_total), human(rep.largest_need));
  const double fraction = rep.device_total > 0 ? static_cast<double>(rep.allowed) / static_cast<double>(rep.device_total) : 0.0;
  const double needed = rep.device_total > 0
                            ? round_up_2_digits(static_cast<double>(rep.largest_need) / static_cast<double>(rep.device_total))
                            : 0.0;
  std::string remedy = needed <= 1.0 ? obs::format("raise per_process_memory_fraction to at least {:g} (what that "
                                                   "segment needs; the program may need more once it runs), or "
                                                   "remove it from CACHALLOC_CONF",
                                                   needed)
                                     : "remove per_process_memory_fraction from CACHALLOC_CONF";
  return obs::format(
      "per_process_memory_fraction:{:.3g} ({} of device {}) refused {} allocations (the message was printed once, "
      "for the first); the largest needed a {} segment: to serve every one of them, {}.",
      fraction, human(rep.allowed), rep.device, rep.count, human(rep.largest_need), remedy);
}

std::string format_oom_message(int device, const OomReport& r, const std::string& nvml_lines) {
  std::size_t unallocated = r.reserved > r.allocated ? r.reserved - r.allocated : 0;
  std::string msg = obs::format(
      "CUDA out of memory. Tried to allocate {} (rounded to {}) {}. "
      "Device {} has a total capacity of {} of which {} is free (driver). ",
      human(r.requested), human(r.rounded), stream_phrase(r.stream), device, human(r.device_total),
      human(r.device_free));
  msg += reason_and_remedy(device, r);
  if (r.reserved > 0)  // nothing reserved: nothing to say about the cache
    msg += obs::format(
        " Of the memory cachalloc reserved, {} is allocated by the program and {} is reserved by cachalloc "
        "but unallocated; the largest free cached block is {}.",
        human(r.allocated), human(unallocated), human(r.largest_free_block));
  if (fragmentation_hint(r, unallocated))
    msg += " If reserved but unallocated memory is large, try setting "
           "CACHALLOC_CONF=expandable_segments:true to avoid fragmentation.";
  if (!nvml_lines.empty()) msg += "\nMemory held per process on this device (NVML):\n" + nvml_lines;
  return msg;
}

}  // namespace cachalloc::obs
