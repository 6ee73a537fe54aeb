// fuzz_config.cpp — CACHALLOC_CONF parser (core/config.h).
//
// Any text: parse_config must not crash, leak or hang, and
//  * a rejected text leaves the Config untouched and says why, in one
//    message that starts with "CACHALLOC_CONF: ";
//  * an accepted text is accepted whatever Config it starts from, applying
//    it twice is the same as once, and its fields are in the documented
//    ranges;
//  * Config::to_string() of an accepted Config parses back to the same
//    fields and prints the same text again.
#include <cmath>
#include <csignal>
#include <cstdint>
#include <string>
#include <string_view>

#include "config.h"
#include "fuzz_check.h"

using cachalloc::Config;

namespace {

bool same(const Config& a, const Config& b) {
  return a.max_split_size == b.max_split_size && a.max_non_split_rounding == b.max_non_split_rounding &&
         a.roundup_power2_divisions == b.roundup_power2_divisions &&
         a.garbage_collection_threshold == b.garbage_collection_threshold &&
         a.per_process_memory_fraction == b.per_process_memory_fraction &&
         a.expandable_segments == b.expandable_segments &&
         a.expandable_segments_handle_type == b.expandable_segments_handle_type && a.free_sync == b.free_sync &&
         a.stats == b.stats && a.snapshot == b.snapshot && a.snapshot_signal == b.snapshot_signal &&
         a.trace == b.trace && a.trace_max_entries == b.trace_max_entries && a.log_level == b.log_level &&
         a.log_file == b.log_file;
}

// A Config far from the defaults, to see that a rejected text changes nothing.
Config unusual() {
  Config c;
  c.max_split_size = 123u << 20;
  c.max_non_split_rounding = 7u << 20;
  c.roundup_power2_divisions.fill(8);
  c.garbage_collection_threshold = 0.25;
  c.per_process_memory_fraction = 0.5;
  c.expandable_segments = true;
  c.expandable_segments_handle_type = cachalloc::HandleType::fabric;
  c.free_sync = cachalloc::FreeSync::device;
  c.stats = "/unusual/stats";
  c.snapshot = "/unusual/snapshot";
  c.snapshot_signal = 12;
  c.trace = "/unusual/trace";
  c.trace_max_entries = 3;
  c.log_level = cachalloc::LogLevel::critical;
  c.log_file = "/unusual/log";
  return c;
}

bool power_of_two_or_zero(std::size_t v) { return (v & (v - 1)) == 0; }

void check_ranges(const Config& c) {
  FUZZ_CHECK(c.max_split_size >= (std::size_t{20} << 20));
  FUZZ_CHECK(c.max_non_split_rounding >= (std::size_t{1} << 20));
  for (std::size_t d : c.roundup_power2_divisions) FUZZ_CHECK(power_of_two_or_zero(d));
  FUZZ_CHECK(c.garbage_collection_threshold == 0.0 ||
             (c.garbage_collection_threshold > 0.0 && c.garbage_collection_threshold < 1.0));
  FUZZ_CHECK(c.per_process_memory_fraction > 0.0 && c.per_process_memory_fraction <= 1.0);
  FUZZ_CHECK(c.snapshot_signal >= 0 && c.snapshot_signal <= 64);
  FUZZ_CHECK(c.trace_max_entries >= 1);
  FUZZ_CHECK(static_cast<int>(c.expandable_segments_handle_type) >= 0 &&
             static_cast<int>(c.expandable_segments_handle_type) <= 3);
  FUZZ_CHECK(static_cast<int>(c.free_sync) >= 0 && static_cast<int>(c.free_sync) <= 3);
  FUZZ_CHECK(static_cast<int>(c.log_level) >= 0 && static_cast<int>(c.log_level) <= 6);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  Config from_unusual = unusual();
  const std::string error = parse_config(text, &from_unusual);
  if (!error.empty()) {
    FUZZ_CHECK(same(from_unusual, unusual()));  // never half-applied
    FUZZ_CHECK(error.rfind("CACHALLOC_CONF: ", 0) == 0);
    Config from_default;
    FUZZ_CHECK(!parse_config(text, &from_default).empty());  // rejection does not depend on the start
    FUZZ_CHECK(same(from_default, Config{}));
    return 0;
  }

  Config c;
  FUZZ_CHECK(parse_config(text, &c).empty());
  check_ranges(c);
  check_ranges(from_unusual);

  Config twice = c;  // idempotent
  FUZZ_CHECK(parse_config(text, &twice).empty());
  FUZZ_CHECK(same(twice, c));

  const std::string printed = c.to_string();  // round trip through the text form
  Config reread;
  const std::string reread_error = parse_config(printed, &reread);
  if (!reread_error.empty()) std::fprintf(stderr, "to_string gave '%s': %s\n", printed.c_str(), reread_error.c_str());
  FUZZ_CHECK(reread_error.empty());
  FUZZ_CHECK(same(reread, c));
  FUZZ_CHECK(reread.to_string() == printed);
  return 0;
}
