// test_config.cpp — CACHALLOC_CONF parsing: every key, exact error texts,
// PyTorch's bracket form, whitespace and case, and to_string() round trips.
#include <catch2/catch.hpp>

#include <csignal>
#include <limits>
#include <string>

#include "config.h"

using namespace cachalloc;

namespace {

constexpr std::size_t kMiBytes = std::size_t{1} << 20;

// Parses `text` into a default Config and requires success.
Config parse_ok(std::string_view text) {
  Config c;
  const std::string error = parse_config(text, &c);
  INFO("text: " << text);
  REQUIRE(error == "");
  return c;
}

// Parses `text` into a default Config and returns the error message.
std::string parse_error(std::string_view text) {
  Config c;
  return parse_config(text, &c);
}

bool same(const Config& a, const Config& b) {
  return a.max_split_size == b.max_split_size && a.max_non_split_rounding == b.max_non_split_rounding &&
         a.roundup_power2_divisions == b.roundup_power2_divisions &&
         a.garbage_collection_threshold == b.garbage_collection_threshold &&
         a.per_process_memory_fraction == b.per_process_memory_fraction &&
         a.expandable_segments == b.expandable_segments &&
         a.expandable_segments_handle_type == b.expandable_segments_handle_type &&
         a.release_before_peak == b.release_before_peak && a.release_remap == b.release_remap && a.free_sync == b.free_sync && a.fence_join == b.fence_join && a.cross_stream_reuse == b.cross_stream_reuse && a.fence_wait_max == b.fence_wait_max && a.pinned_max_cached == b.pinned_max_cached && a.stats == b.stats && a.snapshot == b.snapshot &&
         a.snapshot_signal == b.snapshot_signal && a.trace == b.trace &&
         a.trace_max_entries == b.trace_max_entries && a.log_level == b.log_level &&
         a.log_file == b.log_file && a.strict == b.strict;
}

const char* const kKnownKeys =
    "max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions, "
    "garbage_collection_threshold, per_process_memory_fraction, expandable_segments, "
    "expandable_segments_handle_type, release_before_peak, release_remap, free_sync, fence_join, fence_wait_max_mb, fence_join_frees, cross_stream_reuse, pinned_max_cached_mb, thread_cache_kb, tag, tag_cpu_backup, pause_backup_dir, stats, snapshot, snapshot_signal, trace, "
    "trace_max_entries, log_level, log_file, strict";

}  // namespace

TEST_CASE("empty text and empty items leave defaults", "[config]") {
  for (const char* text : {"", "   ", ",", ",,", " , , "}) {
    INFO(text);
    CHECK(same(parse_ok(text), Config{}));
  }
  const Config c = parse_ok("max_split_size_mb:64,");
  CHECK(c.max_split_size == 64 * kMiBytes);
  CHECK(parse_ok(",expandable_segments:true,,").expandable_segments);
}

TEST_CASE("max_split_size_mb stores bytes", "[config]") {
  CHECK(parse_ok("max_split_size_mb:64").max_split_size == (std::size_t{64} << 20));
  CHECK(parse_ok("max_split_size_mb:20").max_split_size == 20 * kMiBytes);
  CHECK(parse_ok("max_split_size_mb:unlimited").max_split_size ==
        std::numeric_limits<std::size_t>::max());
  CHECK(parse_ok("max_split_size_mb:UNLIMITED").max_split_size ==
        std::numeric_limits<std::size_t>::max());
  // The largest MiB count whose bytes fit in size_t is accepted ...
  const std::size_t largest = std::numeric_limits<std::size_t>::max() >> 20;
  CHECK(parse_ok("max_split_size_mb:" + std::to_string(largest)).max_split_size == largest << 20);
  // ... one more would overflow and is rejected.
  const std::string over = std::to_string(largest + 1);
  CHECK(parse_error("max_split_size_mb:" + over) ==
        "CACHALLOC_CONF: max_split_size_mb: '" + over +
            "' is not valid; expected an integer number of MiB >= 20, or unlimited");
}

TEST_CASE("max_split_size_mb rejects bad numbers with the exact message", "[config]") {
  const auto msg = [](const std::string& v) {
    return "CACHALLOC_CONF: max_split_size_mb: '" + v +
           "' is not valid; expected an integer number of MiB >= 20, or unlimited";
  };
  CHECK(parse_error("max_split_size_mb:19") == msg("19"));
  CHECK(parse_error("max_split_size_mb:0") == msg("0"));
  CHECK(parse_error("max_split_size_mb:-64") == msg("-64"));
  CHECK(parse_error("max_split_size_mb:+64") == msg("+64"));
  CHECK(parse_error("max_split_size_mb:20mb") == msg("20mb"));
  CHECK(parse_error("max_split_size_mb:64.5") == msg("64.5"));
  CHECK(parse_error("max_split_size_mb:") == msg(""));
  CHECK(parse_error("max_split_size_mb:abc") == msg("abc"));
  CHECK(parse_error("max_split_size_mb:99999999999999999999999") == msg("99999999999999999999999"));
}

TEST_CASE("max_non_split_rounding_mb", "[config]") {
  CHECK(parse_ok("max_non_split_rounding_mb:1").max_non_split_rounding == 1 * kMiBytes);
  CHECK(parse_ok("max_non_split_rounding_mb:512").max_non_split_rounding == 512 * kMiBytes);
  CHECK(parse_error("max_non_split_rounding_mb:0") ==
        "CACHALLOC_CONF: max_non_split_rounding_mb: '0' is not valid; expected an integer number of "
        "MiB >= 1");
}

TEST_CASE("roundup_power2_divisions: one value fills every interval", "[config]") {
  const Config c = parse_ok("roundup_power2_divisions:4");
  for (int i = 0; i < kPower2Intervals; ++i) CHECK(c.roundup_power2_divisions[i] == 4);
  CHECK(parse_ok("roundup_power2_divisions:1").roundup_power2_divisions[7] == 1);
  const std::string expected =
      "' is not valid; expected a power of two, or [<MiB>:<divisions>,...,>:<divisions>] with MiB a "
      "power of two and divisions a power of two or 0";
  CHECK(parse_error("roundup_power2_divisions:3") ==
        "CACHALLOC_CONF: roundup_power2_divisions: '3" + expected);
  CHECK(parse_error("roundup_power2_divisions:0") ==
        "CACHALLOC_CONF: roundup_power2_divisions: '0" + expected);
  CHECK(parse_error("roundup_power2_divisions:[256:3]") ==
        "CACHALLOC_CONF: roundup_power2_divisions: '[256:3]" + expected);
}

TEST_CASE("roundup_power2_divisions: PyTorch's bracket form per interval", "[config]") {
  // 256 MiB -> interval 8, 512 MiB -> interval 9; the first key fills 0..7,
  // '>' fills 10..15.
  const Config c = parse_ok("roundup_power2_divisions:[256:1,512:2,>:8]");
  const auto& d = c.roundup_power2_divisions;
  for (int i = 0; i <= 8; ++i) CHECK(d[i] == 1);
  CHECK(d[9] == 2);
  for (int i = 10; i < kPower2Intervals; ++i) CHECK(d[i] == 8);

  // Intervals between given keys keep 0 (no rounding); 0 is accepted.
  const Config gaps = parse_ok("roundup_power2_divisions:[2:4,64:0,1024:16]");
  const auto& g = gaps.roundup_power2_divisions;
  CHECK(g[0] == 4);
  CHECK(g[1] == 4);
  for (int i = 2; i <= 9; ++i) CHECK(g[i] == 0);
  CHECK(g[6] == 0);
  CHECK(g[10] == 16);
  for (int i = 11; i < kPower2Intervals; ++i) CHECK(g[i] == 0);

  // 1 MiB is interval 0; keys past the last interval clamp to it.
  const Config clamp = parse_ok("roundup_power2_divisions:[1:2,1048576:32]");
  CHECK(clamp.roundup_power2_divisions[0] == 2);
  CHECK(clamp.roundup_power2_divisions[14] == 0);
  CHECK(clamp.roundup_power2_divisions[15] == 32);

  // '>' alone covers everything.
  const Config all = parse_ok("roundup_power2_divisions:[>:2]");
  for (int i = 0; i < kPower2Intervals; ++i) CHECK(all.roundup_power2_divisions[i] == 2);
}

TEST_CASE("roundup_power2_divisions: a repeated key replaces the whole table", "[config]") {
  const Config c = parse_ok("roundup_power2_divisions:4,roundup_power2_divisions:[512:2]");
  for (int i = 0; i <= 9; ++i) CHECK(c.roundup_power2_divisions[i] == 2);
  for (int i = 10; i < kPower2Intervals; ++i) CHECK(c.roundup_power2_divisions[i] == 0);
}

TEST_CASE("roundup_power2_divisions: bad bracket entries", "[config]") {
  for (const char* v : {"[300:2]", "[256:3]", "[256]", "[]", "[256:2,]", "[256:-2]", "[x:2]",
                        "[256:2,>:3]", "[0:2]"}) {
    INFO(v);
    CHECK(parse_error(std::string("roundup_power2_divisions:") + v)
              .starts_with("CACHALLOC_CONF: roundup_power2_divisions: '" + std::string(v) +
                           "' is not valid; expected a power of two, or ["));
  }
}

TEST_CASE("garbage_collection_threshold is strictly inside (0, 1)", "[config]") {
  CHECK(parse_ok("garbage_collection_threshold:0.6").garbage_collection_threshold == 0.6);
  CHECK(parse_ok("garbage_collection_threshold:1e-3").garbage_collection_threshold == 0.001);
  const auto msg = [](const std::string& v) {
    return "CACHALLOC_CONF: garbage_collection_threshold: '" + v +
           "' is not valid; expected a number strictly between 0 and 1";
  };
  for (const char* v : {"0", "1", "1.0", "-0.5", "nan", "NaN", "inf", "0.5x", "", "."}) {
    INFO(v);
    CHECK(parse_error(std::string("garbage_collection_threshold:") + v) == msg(v));
  }
}

TEST_CASE("per_process_memory_fraction is in (0, 1]", "[config]") {
  CHECK(parse_ok("per_process_memory_fraction:1").per_process_memory_fraction == 1.0);
  CHECK(parse_ok("per_process_memory_fraction:0.25").per_process_memory_fraction == 0.25);
  CHECK(parse_error("per_process_memory_fraction:0") ==
        "CACHALLOC_CONF: per_process_memory_fraction: '0' is not valid; expected a number in (0, 1]");
  CHECK(parse_error("per_process_memory_fraction:1.5") ==
        "CACHALLOC_CONF: per_process_memory_fraction: '1.5' is not valid; expected a number in (0, 1]");
}

TEST_CASE("pinned_max_cached_mb: MiB, 0 for off, or unlimited; 1024 MiB by default", "[config]") {
  CHECK(Config{}.pinned_max_cached == std::size_t{1024} << 20);
  CHECK(parse_ok("").pinned_max_cached == std::size_t{1024} << 20);
  CHECK(parse_ok("pinned_max_cached_mb:0").pinned_max_cached == 0);
  CHECK(parse_ok("pinned_max_cached_mb:64").pinned_max_cached == std::size_t{64} << 20);
  CHECK(parse_ok("pinned_max_cached_mb:Unlimited").pinned_max_cached == std::numeric_limits<std::size_t>::max());
  const std::string expected =
      "' is not valid; expected an integer number of MiB >= 0 (0 = off), or unlimited";
  CHECK(parse_error("pinned_max_cached_mb:-1") == "CACHALLOC_CONF: pinned_max_cached_mb: '-1" + expected);
  CHECK(parse_error("pinned_max_cached_mb:1.5") == "CACHALLOC_CONF: pinned_max_cached_mb: '1.5" + expected);
  CHECK(parse_error("pinned_max_cached_mb:99999999999999999999") ==
        "CACHALLOC_CONF: pinned_max_cached_mb: '99999999999999999999" + expected);
  CHECK(parse_error("pinned_max_cached:8") ==
        std::string("CACHALLOC_CONF: unknown key 'pinned_max_cached' (did you mean 'pinned_max_cached_mb'?); "
                    "known keys: ") + kKnownKeys);
}

TEST_CASE("cross_stream_reuse: segments (or true), blocks, false; segments by default", "[config]") {
  CHECK(Config{}.cross_stream_reuse == CrossStream::segments);
  CHECK(parse_ok("cross_stream_reuse:false").cross_stream_reuse == CrossStream::off);
  CHECK(parse_ok("cross_stream_reuse:true").cross_stream_reuse == CrossStream::segments);
  CHECK(parse_ok("cross_stream_reuse:Blocks").cross_stream_reuse == CrossStream::blocks);
  CHECK(parse_ok(parse_ok("cross_stream_reuse:blocks").to_string()).cross_stream_reuse == CrossStream::blocks);
  CHECK(parse_error("cross_stream_reuse:yes") ==
        "CACHALLOC_CONF: cross_stream_reuse: 'yes' is not valid; expected one of segments (or true), blocks, false");
}

TEST_CASE("fence_join_frees: 1 to 1000000 frees; 20 by default", "[config]") {
  CHECK(Config{}.fence_join_frees == 20);
  CHECK(parse_ok("fence_join_frees:40").fence_join_frees == 40);
  CHECK(parse_error("fence_join_frees:0") ==
        "CACHALLOC_CONF: fence_join_frees: '0' is not valid; expected an integer number of frees from 1 to 1000000");
  CHECK_FALSE(parse_error("fence_join_frees:1000001").empty());
  CHECK(parse_ok(parse_ok("fence_join_frees:33").to_string()).fence_join_frees == 33);
}

TEST_CASE("fence_wait_max_mb: MiB or unlimited; 256 MiB by default, 128 with expandable segments", "[config]") {
  CHECK(Config{}.fence_wait_max == std::size_t{256} << 20);
  CHECK(parse_ok("").fence_wait_max == std::size_t{256} << 20);
  CHECK(parse_ok("expandable_segments:true").fence_wait_max == std::size_t{128} << 20);
  CHECK(parse_ok("expandable_segments:true,fence_wait_max_mb:256").fence_wait_max == std::size_t{256} << 20);
  CHECK(parse_ok("fence_wait_max_mb:512,expandable_segments:true").fence_wait_max == std::size_t{512} << 20);
  CHECK(parse_ok("expandable_segments:false").fence_wait_max == std::size_t{256} << 20);
  CHECK(parse_ok("fence_wait_max_mb:0").fence_wait_max == 0);
  CHECK(parse_ok("fence_wait_max_mb:512").fence_wait_max == std::size_t{512} << 20);
  CHECK(parse_ok("fence_wait_max_mb:unlimited").fence_wait_max == std::numeric_limits<std::size_t>::max());
  CHECK(parse_error("fence_wait_max_mb:-3") ==
        "CACHALLOC_CONF: fence_wait_max_mb: '-3' is not valid; expected an integer number of MiB >= 0, or unlimited");
  // Round trip through the dump's text form.
  CHECK(parse_ok(parse_ok("fence_wait_max_mb:unlimited").to_string()).fence_wait_max ==
        std::numeric_limits<std::size_t>::max());
  CHECK(parse_ok(parse_ok("fence_wait_max_mb:7").to_string()).fence_wait_max == std::size_t{7} << 20);
}

TEST_CASE("release_remap: off by default, true/false", "[config]") {
  CHECK_FALSE(Config{}.release_remap);
  CHECK(parse_ok("release_remap:true").release_remap);
  CHECK(parse_error("release_remap:1") == "CACHALLOC_CONF: release_remap: '1' is not valid; expected true or false");
}

TEST_CASE("release_before_peak: off by default, true/false", "[config]") {
  CHECK_FALSE(Config{}.release_before_peak);
  CHECK(parse_ok("release_before_peak:true").release_before_peak);
  CHECK_FALSE(parse_ok("release_before_peak:true,release_before_peak:false").release_before_peak);
  CHECK(parse_error("release_before_peak:on") ==
        "CACHALLOC_CONF: release_before_peak: 'on' is not valid; expected true or false");
}

TEST_CASE("expandable_segments takes true/false in any case", "[config]") {
  CHECK(parse_ok("expandable_segments:true").expandable_segments);
  CHECK(parse_ok("expandable_segments:True").expandable_segments);
  CHECK(parse_ok("expandable_segments:TRUE").expandable_segments);
  CHECK_FALSE(parse_ok("expandable_segments:true,expandable_segments:False").expandable_segments);
  CHECK(parse_error("expandable_segments:1") ==
        "CACHALLOC_CONF: expandable_segments: '1' is not valid; expected true or false");
  CHECK(parse_error("expandable_segments:yes") ==
        "CACHALLOC_CONF: expandable_segments: 'yes' is not valid; expected true or false");
}

TEST_CASE("enumerated keys", "[config]") {
  CHECK(parse_ok("expandable_segments_handle_type:auto").expandable_segments_handle_type ==
        HandleType::automatic);
  CHECK(parse_ok("expandable_segments_handle_type:posix_fd").expandable_segments_handle_type ==
        HandleType::posix_fd);
  CHECK(parse_ok("expandable_segments_handle_type:fabric").expandable_segments_handle_type ==
        HandleType::fabric);
  CHECK(parse_ok("expandable_segments_handle_type:none").expandable_segments_handle_type ==
        HandleType::none);
  CHECK(parse_error("expandable_segments_handle_type:win32") ==
        "CACHALLOC_CONF: expandable_segments_handle_type: 'win32' is not valid; expected one of auto, "
        "posix_fd, fabric, none");

  CHECK(parse_ok("free_sync:auto").free_sync == FreeSync::automatic);
  CHECK(parse_ok("free_sync:fence").free_sync == FreeSync::fence);
  CHECK(parse_ok("free_sync:stream").free_sync == FreeSync::stream);
  CHECK(parse_ok("free_sync:Device").free_sync == FreeSync::device);
  CHECK(parse_ok("").fence_join);
  CHECK(!parse_ok("fence_join:false").fence_join);
  CHECK(parse_ok("fence_join:TRUE").fence_join);
  CHECK(parse_error("fence_join:1") == "CACHALLOC_CONF: fence_join: '1' is not valid; expected true or false");
  CHECK(parse_error("free_sync:sync") ==
        "CACHALLOC_CONF: free_sync: 'sync' is not valid; expected one of auto, fence, stream, device");

  CHECK(parse_ok("log_level:trace").log_level == LogLevel::trace);
  CHECK(parse_ok("log_level:debug").log_level == LogLevel::debug);
  CHECK(parse_ok("log_level:info").log_level == LogLevel::info);
  CHECK(parse_ok("log_level:warn").log_level == LogLevel::warn);
  CHECK(parse_ok("log_level:error").log_level == LogLevel::err);
  CHECK(parse_ok("log_level:CRITICAL").log_level == LogLevel::critical);
  CHECK(parse_ok("log_level:off").log_level == LogLevel::off);
  CHECK(parse_error("log_level:verbose") ==
        "CACHALLOC_CONF: log_level: 'verbose' is not valid; expected one of trace, debug, info, warn, "
        "error, critical, off");
}

TEST_CASE("path keys keep their text, colons and templates included", "[config]") {
  const Config c = parse_ok(
      "stats:/tmp/stats-%p-%h.json,snapshot:/tmp/a:b/snap-%r.pickle,trace:/tmp/t%d.json,"
      "log_file:/var/log/cachalloc.log");
  CHECK(c.stats == "/tmp/stats-%p-%h.json");
  CHECK(c.snapshot == "/tmp/a:b/snap-%r.pickle");
  CHECK(c.trace == "/tmp/t%d.json");
  CHECK(c.log_file == "/var/log/cachalloc.log");
  CHECK(parse_ok("stats:stderr").stats == "stderr");
  CHECK(parse_ok("stats: /tmp/my dir/s.json ").stats == "/tmp/my dir/s.json");
  CHECK(parse_error("stats:") == "CACHALLOC_CONF: stats: '' is not valid; expected stderr or a file path");
  CHECK(parse_error("trace:  ") == "CACHALLOC_CONF: trace: '' is not valid; expected a file path");
}

TEST_CASE("snapshot_signal takes names and numbers", "[config]") {
  CHECK(parse_ok("snapshot_signal:USR1").snapshot_signal == SIGUSR1);
  CHECK(parse_ok("snapshot_signal:sigusr2").snapshot_signal == SIGUSR2);
  CHECK(parse_ok("snapshot_signal:SIGUSR1").snapshot_signal == SIGUSR1);
  CHECK(parse_ok("snapshot_signal:usr2").snapshot_signal == SIGUSR2);
  CHECK(parse_ok("snapshot_signal:1").snapshot_signal == 1);
  CHECK(parse_ok("snapshot_signal:64").snapshot_signal == 64);
  const auto msg = [](const std::string& v) {
    return "CACHALLOC_CONF: snapshot_signal: '" + v +
           "' is not valid; expected USR1, USR2 or a signal number 1..64";
  };
  CHECK(parse_error("snapshot_signal:0") == msg("0"));
  CHECK(parse_error("snapshot_signal:65") == msg("65"));
  CHECK(parse_error("snapshot_signal:SIGINT") == msg("SIGINT"));
  CHECK(parse_error("snapshot_signal:SIG") == msg("SIG"));
}

TEST_CASE("trace_max_entries", "[config]") {
  CHECK(parse_ok("trace_max_entries:1").trace_max_entries == 1);
  CHECK(parse_ok("trace_max_entries:5000000").trace_max_entries == 5000000);
  CHECK(parse_error("trace_max_entries:0") ==
        "CACHALLOC_CONF: trace_max_entries: '0' is not valid; expected an integer >= 1");
}

TEST_CASE("unknown keys list the known ones, with the likely intended key", "[config]") {
  CHECK(parse_error("max_split_size:64") ==
        std::string("CACHALLOC_CONF: unknown key 'max_split_size' (did you mean 'max_split_size_mb'?); known keys: ") +
            kKnownKeys);
  CHECK(parse_error("expandable_segments:true,Max_Split_Size_MB:64") ==
        std::string("CACHALLOC_CONF: unknown key 'Max_Split_Size_MB' (did you mean 'max_split_size_mb'?); known keys: ") +
            kKnownKeys);
  CHECK(parse_error("expandable_segment:true").starts_with(
      "CACHALLOC_CONF: unknown key 'expandable_segment' (did you mean 'expandable_segments'?); known keys: "));
  CHECK(parse_error("garbage_colection_threshold:0.5").starts_with(
      "CACHALLOC_CONF: unknown key 'garbage_colection_threshold' (did you mean 'garbage_collection_threshold'?)"));
  CHECK(parse_error("stat:stderr").starts_with("CACHALLOC_CONF: unknown key 'stat' (did you mean 'stats'?)"));
  // Nothing close: no guess.
  CHECK(parse_error("bogus_key:1") == std::string("CACHALLOC_CONF: unknown key 'bogus_key'; known keys: ") + kKnownKeys);
  // A key of PyTorch's own allocator is no typo (issue 37).
  CHECK(parse_error("backend:cudaMallocAsync") ==
        "CACHALLOC_CONF: backend: ignored (PyTorch-only): a key of PyTorch's own allocator that cachalloc does "
        "not implement");
}

TEST_CASE("hostile text: long values and keys are cut, control bytes escaped, one line", "[config]") {
  const std::string long_value(1 << 20, '9');  // a 1 MB number
  std::string m = parse_error("max_split_size_mb:" + long_value);
  CHECK(m == "CACHALLOC_CONF: max_split_size_mb: '" + std::string(80, '9') +
                 "... (1048576 bytes)' is not valid; expected an integer number of MiB >= 20, or unlimited");
  const std::string long_key(1 << 20, 'k');
  m = parse_error(long_key + ":1");
  CHECK(m == "CACHALLOC_CONF: unknown key '" + std::string(80, 'k') + "... (1048576 bytes)'; known keys: " +
                 kKnownKeys);
  m = parse_error(std::string(1 << 20, 'x'));  // 1 MB without a colon
  CHECK(m == "CACHALLOC_CONF: malformed item '" + std::string(80, 'x') + "... (1048576 bytes)'; expected key:value");
  // 1 MB of valid items parses (the last one wins) and is fast enough.
  std::string many;
  while (many.size() < (1u << 20)) many += "max_split_size_mb:64,expandable_segments:true,";
  CHECK(parse_ok(many).max_split_size == 64 * kMiBytes);
  // Control bytes and non-ASCII are shown as \xNN, never sent raw to a terminal.
  CHECK(parse_error("log_level:\x1b" "cpwned\x07") ==
        "CACHALLOC_CONF: log_level: '\\x1bcpwned\\x07' is not valid; expected one of trace, debug, info, warn, "
        "error, critical, off");
  CHECK(parse_error("free_sync:caf\xc3\xa9") ==
        "CACHALLOC_CONF: free_sync: 'caf\\xc3\\xa9' is not valid; expected one of auto, fence, stream, device");
  for (const std::string& bad : {long_value, long_key, std::string("a\nb:1"), std::string("log_level:\n")}) {
    const std::string e = parse_error(bad);
    CHECK(e.find('\n') == std::string::npos);
    CHECK(e.size() < 1000);
  }
}

TEST_CASE("malformed items", "[config]") {
  CHECK(parse_error("max_split_size_mb") ==
        "CACHALLOC_CONF: malformed item 'max_split_size_mb'; expected key:value");
  CHECK(parse_error("expandable_segments:true,garbage") ==
        "CACHALLOC_CONF: malformed item 'garbage'; expected key:value");
  CHECK(parse_error(":64") == "CACHALLOC_CONF: malformed item ':64'; expected key:value");
  CHECK(parse_error("roundup_power2_divisions:[256:1,512:2") ==
        "CACHALLOC_CONF: malformed item 'roundup_power2_divisions:[256:1,512:2'; expected key:value");
  CHECK(parse_error("roundup_power2_divisions:256:1]") ==
        "CACHALLOC_CONF: malformed item 'roundup_power2_divisions:256:1]'; expected key:value");
  CHECK(parse_error("[a:b]") == "CACHALLOC_CONF: malformed item '[a:b]'; expected key:value");
}

TEST_CASE("whitespace anywhere is ignored", "[config]") {
  const Config c = parse_ok(
      "  max_split_size_mb : 1 28 ,\n\texpandable_segments:  True , "
      "roundup_power2_divisions: [ 256 : 1 , 512 : 2 , > : 8 ] , garbage_collection_threshold: 0.8 ");
  CHECK(c.max_split_size == 128 * kMiBytes);
  CHECK(c.expandable_segments);
  CHECK(c.roundup_power2_divisions[8] == 1);
  CHECK(c.roundup_power2_divisions[9] == 2);
  CHECK(c.roundup_power2_divisions[15] == 8);
  CHECK(c.garbage_collection_threshold == 0.8);
}

TEST_CASE("a key given twice: the last wins", "[config]") {
  CHECK(parse_ok("max_split_size_mb:64,max_split_size_mb:128").max_split_size == 128 * kMiBytes);
}

TEST_CASE("*out is unchanged on error", "[config]") {
  Config c;
  REQUIRE(parse_config("max_split_size_mb:64,stats:/tmp/s.json", &c) == "");
  const Config before = c;
  // The good items before the bad one must not be applied either.
  CHECK(parse_config("max_split_size_mb:256,expandable_segments:true,free_sync:nope", &c) != "");
  CHECK(same(c, before));
  CHECK(parse_config("log_level:debug,bogus:1", &c) != "");
  CHECK(same(c, before));
  CHECK(parse_config("roundup_power2_divisions:[256:1,300:2]", &c) != "");
  CHECK(same(c, before));
  CHECK(c.max_split_size == 64 * kMiBytes);
  CHECK(c.stats == "/tmp/s.json");
}

TEST_CASE("parsing starts from *out, not from defaults", "[config]") {
  Config c;
  c.log_level = LogLevel::debug;
  REQUIRE(parse_config("free_sync:fence", &c) == "");
  CHECK(c.log_level == LogLevel::debug);
  CHECK(c.free_sync == FreeSync::fence);
}

TEST_CASE("to_string of the defaults", "[config]") {
  CHECK(Config{}.to_string() ==
        "max_split_size_mb:unlimited,max_non_split_rounding_mb:20,"
        "roundup_power2_divisions:[1:0,2:0,4:0,8:0,16:0,32:0,64:0,128:0,256:0,512:0,1024:0,2048:0,"
        "4096:0,8192:0,16384:0,32768:0],per_process_memory_fraction:1,expandable_segments:false,"
        "expandable_segments_handle_type:auto,release_before_peak:false,release_remap:false,free_sync:auto,fence_join:true,fence_wait_max_mb:256,fence_join_frees:20,cross_stream_reuse:segments,pinned_max_cached_mb:1024,thread_cache_kb:1024,trace_max_entries:1048576,log_level:warn");
}

TEST_CASE("to_string round-trips every value", "[config]") {
  SECTION("defaults") { CHECK(same(parse_ok(Config{}.to_string()), Config{})); }
  SECTION("everything set") {
    const Config c = parse_ok(
        "max_split_size_mb:300,max_non_split_rounding_mb:7,"
        "roundup_power2_divisions:[2:1,64:0,256:4,>:16],garbage_collection_threshold:0.1,"
        "per_process_memory_fraction:0.3,expandable_segments:true,"
        "expandable_segments_handle_type:fabric,release_before_peak:true,release_remap:true,free_sync:device,fence_join:false,cross_stream_reuse:false,pinned_max_cached_mb:0,stats:/tmp/s-%p.json,"
        "snapshot:/tmp/a:b.pickle,snapshot_signal:SIGUSR2,trace:/tmp/t.json,"
        "trace_max_entries:77,log_level:error,log_file:/tmp/l.log");
    const std::string text = c.to_string();
    INFO(text);
    const Config back = parse_ok(text);
    CHECK(same(back, c));
    CHECK(back.to_string() == text);
  }
  SECTION("values set in code, not from text") {
    Config c;
    c.max_split_size = std::numeric_limits<std::size_t>::max() >> 20 << 20;
    c.garbage_collection_threshold = 0.7234567891234;
    c.per_process_memory_fraction = 1.0 / 3.0;
    c.snapshot_signal = 12;
    c.pinned_max_cached = std::numeric_limits<std::size_t>::max();
    c.log_level = LogLevel::off;
    c.roundup_power2_divisions[3] = 8;
    CHECK(same(parse_ok(c.to_string()), c));
  }
}

TEST_CASE("thread_cache_kb: KiB per thread, 0 turns the per-thread caches off") {
  CHECK(Config{}.thread_cache_bytes == 1024 * 1024);
  CHECK(parse_ok("thread_cache_kb:256").thread_cache_bytes == 256 * 1024);
  CHECK(parse_ok("thread_cache_kb:0").thread_cache_bytes == 0);
  CHECK(parse_error("thread_cache_kb:-1") != "");
  CHECK(parse_error("thread_cache_kb:1k") != "");
  CHECK(parse_error("thread_cache_kb:99999999999") != "");
}

TEST_CASE("config: tag and tag_cpu_backup set the process's tag") {
  Config c;
  CHECK(parse_config("tag:kv_cache,tag_cpu_backup:true", &c).empty());
  CHECK(c.tag == "kv_cache");
  CHECK(c.tag_cpu_backup == BackupMode::host);
  CHECK(c.to_string().find("tag:kv_cache") != std::string::npos);
  Config d;
  CHECK_FALSE(parse_config("tag:bad!name", &d).empty());
  CHECK_FALSE(parse_config("tag:a/b", &d).empty());
}

TEST_CASE("config: tag_cpu_backup:disk and pause_backup_dir (disk backups of paused tags)") {
  Config c;
  CHECK(c.tag_cpu_backup == BackupMode::none);
  CHECK(c.pause_backup_dir.empty());  // $TMPDIR, else /tmp
  REQUIRE(parse_config("tag:weights,tag_cpu_backup:DISK,pause_backup_dir:/var/tmp/my backups", &c).empty());
  CHECK(c.tag_cpu_backup == BackupMode::disk);
  CHECK(c.pause_backup_dir == "/var/tmp/my backups");  // a path keeps inner spaces
  Config back;
  REQUIRE(parse_config(c.to_string(), &back).empty());  // round trip
  CHECK(back.tag_cpu_backup == BackupMode::disk);
  CHECK(back.pause_backup_dir == c.pause_backup_dir);
  CHECK(parse_ok("tag_cpu_backup:false").tag_cpu_backup == BackupMode::none);
  CHECK(parse_error("tag_cpu_backup:tape").find("true, false, pageable or disk") != std::string::npos);
  CHECK(parse_error("pause_backup_dir:") != "");
}

TEST_CASE("config: tag_cpu_backup:pageable (pageable host memory) round-trips") {
  Config c;
  REQUIRE(parse_config("tag:weights,tag_cpu_backup:Pageable", &c).empty());
  CHECK(c.tag_cpu_backup == BackupMode::pageable);
  Config back;
  REQUIRE(parse_config(c.to_string(), &back).empty());
  CHECK(back.tag_cpu_backup == BackupMode::pageable);
}

// Issue 37: a typo costs its own key, never the others (the shim applies
// CACHALLOC_CONF with apply_config and stays active).
TEST_CASE("apply_config: good keys apply, each bad item gives one message", "[config]") {
  Config c;
  const auto errors = apply_config("stats:/tmp/x.json,expandable_segment:true, max_split_size_mb:3,"
                                   "log_level:info,nocolon",
                                   &c);
  CHECK(c.stats == "/tmp/x.json");
  CHECK(c.log_level == LogLevel::info);
  CHECK(c.max_split_size == std::numeric_limits<std::size_t>::max());  // the bad value changed nothing
  REQUIRE(errors.size() == 3);
  CHECK(errors[0].find("unknown key 'expandable_segment' (did you mean 'expandable_segments'?)") != std::string::npos);
  CHECK(errors[1].find("max_split_size_mb: '3' is not valid") != std::string::npos);
  CHECK(errors[2].find("malformed item 'nocolon'") != std::string::npos);
  CHECK(apply_config("stats:stderr, expandable_segments:false", &c).empty());
}

TEST_CASE("apply_config: PyTorch-only keys are reported as ignored, not as typos", "[config]") {
  for (const char* key : {"backend:native", "pinned_use_cuda_host_register:True", "pinned_num_register_threads:8",
                          "pinned_use_background_threads:true", "release_lock_on_cudamalloc:true"}) {
    Config c;
    const auto errors = apply_config(std::string(key) + ",max_split_size_mb:64", &c);
    INFO(key);
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].find("ignored (PyTorch-only)") != std::string::npos);
    CHECK(errors[0].find("unknown key") == std::string::npos);
    CHECK(c.max_split_size == 64 * kMiBytes);
    CHECK_FALSE(parse_config(key, &c).empty());  // the all-or-nothing parse still refuses it
  }
}

TEST_CASE("strict exits for errors, not for PyTorch-only keys it recognised", "[config]") {
  Config c;
  CHECK_FALSE(has_config_errors(apply_config("backend:native,pinned_use_cuda_host_register:True", &c)));
  CHECK(has_config_errors(apply_config("backend:native,expandable_segment:true", &c)));
  CHECK(has_config_errors(apply_config("max_split_size_mb:1", &c)));
  CHECK_FALSE(has_config_errors(apply_config("expandable_segments:true", &c)));
}

TEST_CASE("strict: a key of its own, printed back", "[config]") {
  CHECK_FALSE(parse_ok("").strict);
  CHECK(parse_ok("strict:true").strict);
  CHECK(parse_ok("strict:true").to_string().find("strict:true") != std::string::npos);
  CHECK(parse_ok("strict:false").to_string().find("strict") == std::string::npos);
}
