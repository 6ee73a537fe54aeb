// config.cpp — parsing CACHALLOC_CONF and printing a Config back.
//
// The syntax is PyTorch's PYTORCH_CUDA_ALLOC_CONF ("key:value,key:[a:b]"),
// so a user can move a setting across unchanged.  The parser is a table of
// key -> handler: each handler reads one value into a Config and says only
// whether the value was good; the message (key, bad value, what is
// accepted) is built in one place so every error has the same shape.
// Parsing happens into a copy, so a bad text never half-applies.
#include "config.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <charconv>
#include <csignal>
#include <cstdint>
#include <optional>
#include <vector>

namespace cachalloc {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kUnlimited = std::numeric_limits<std::size_t>::max();

// ---------------------------------------------------------------- text helpers

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Numbers, names and brackets ignore whitespace anywhere, as PyTorch's
// tokenizer does ("2 0" reads as 20); only paths keep their inner spaces.
std::string strip_all_space(std::string_view s) {
  std::string out;
  for (char c : s)
    if (!is_space(c)) out += c;
  return out;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Whole-string unsigned integer: no sign, no suffix, no overflow.
std::optional<std::uint64_t> parse_uint(std::string_view s) {
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// Whole-string real number; NaN and infinities fail the callers' range checks.
std::optional<double> parse_real(std::string_view s) {
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// A size in MiB that still fits in size_t once converted to bytes.
std::optional<std::size_t> parse_mib(std::string_view s, std::uint64_t min_mib) {
  const auto v = parse_uint(s);
  if (!v || *v < min_mib || *v > (kUnlimited >> 20)) return std::nullopt;
  return static_cast<std::size_t>(*v) * kMiB;
}

bool is_power_of_two(std::uint64_t v) { return std::has_single_bit(v); }

// ---------------------------------------------------------------- key handlers
// Each returns false for a value it does not accept; `v` has whitespace
// already removed (or, for paths, trimmed).

bool set_max_split_size(std::string_view v, Config& c) {
  if (lower(v) == "unlimited") return (c.max_split_size = kUnlimited), true;
  const auto bytes = parse_mib(v, 20);  // PyTorch: "must be > 20" (it accepts 20)
  if (bytes) c.max_split_size = *bytes;
  return bytes.has_value();
}

bool set_max_non_split_rounding(std::string_view v, Config& c) {
  const auto bytes = parse_mib(v, 1);
  if (bytes) c.max_non_split_rounding = *bytes;
  return bytes.has_value();
}

// Interval index for a key of `mib` MiB: log2, clamped like power2_interval().
int interval_of_mib(std::uint64_t mib) {
  const int log2 = std::bit_width(mib) - 1;
  return log2 < kPower2Intervals ? log2 : kPower2Intervals - 1;
}

// One "key:divisions" entry of the bracket form, applied to `d`.
// `last` is the last interval index given so far (-1 before the first).
bool apply_division_entry(std::string_view entry, std::array<std::size_t, kPower2Intervals>& d,
                          int& last) {
  const auto colon = entry.find(':');
  if (colon == std::string_view::npos) return false;
  const auto divisions = parse_uint(entry.substr(colon + 1));
  if (!divisions || (*divisions != 0 && !is_power_of_two(*divisions))) return false;
  const std::string_view key = entry.substr(0, colon);
  if (key == ">") {  // every interval after the last one given
    for (int i = last + 1; i < kPower2Intervals; ++i) d[i] = *divisions;
    return true;
  }
  const auto mib = parse_uint(key);
  if (!mib || !is_power_of_two(*mib)) return false;
  const int index = interval_of_mib(*mib);
  if (last < 0)  // like PyTorch, the first key also covers every interval below it
    for (int i = 0; i < index; ++i) d[i] = *divisions;
  d[index] = *divisions;
  last = index;
  return true;
}

bool set_divisions_bracket(std::string_view v, Config& c) {
  if (v.size() < 3 || v.front() != '[' || v.back() != ']') return false;
  std::array<std::size_t, kPower2Intervals> d{};  // a repeated key replaces, not merges
  int last = -1;
  std::string_view rest = v.substr(1, v.size() - 2);
  while (true) {
    const auto comma = rest.find(',');
    if (!apply_division_entry(rest.substr(0, comma), d, last)) return false;
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  c.roundup_power2_divisions = d;
  return true;
}

bool set_roundup_power2_divisions(std::string_view v, Config& c) {
  if (!v.empty() && v.front() == '[') return set_divisions_bracket(v, c);
  const auto n = parse_uint(v);
  if (!n || !is_power_of_two(*n)) return false;
  c.roundup_power2_divisions.fill(static_cast<std::size_t>(*n));
  return true;
}

bool set_pinned_max_cached(std::string_view v, Config& c) {
  if (lower(v) == "unlimited") return (c.pinned_max_cached = kUnlimited), true;
  const auto bytes = parse_mib(v, 0);
  if (bytes) c.pinned_max_cached = *bytes;
  return bytes.has_value();
}

bool set_thread_cache(std::string_view v, Config& c) {
  const auto kib = parse_uint(v);
  if (!kib || *kib > (std::size_t{1} << 30)) return false;  // at most 1 TiB, no overflow below
  c.thread_cache_bytes = static_cast<std::size_t>(*kib) << 10;
  return true;
}

bool set_fence_join_frees(std::string_view v, Config& c) {
  const auto n = parse_uint(v);
  if (!n || *n < 1 || *n > 1'000'000) return false;
  c.fence_join_frees = static_cast<std::size_t>(*n);
  return true;
}

bool set_gc_threshold(std::string_view v, Config& c) {
  const auto x = parse_real(v);
  if (!x || !(*x > 0.0 && *x < 1.0)) return false;
  c.garbage_collection_threshold = *x;
  return true;
}

bool set_memory_fraction(std::string_view v, Config& c) {
  const auto x = parse_real(v);
  if (!x || !(*x > 0.0 && *x <= 1.0)) return false;
  c.per_process_memory_fraction = *x;
  return true;
}

bool set_bool(std::string_view v, bool& out) {
  const std::string s = lower(v);
  if (s != "true" && s != "false") return false;
  out = s == "true";
  return true;
}

bool set_expandable_segments(std::string_view v, Config& c) { return set_bool(v, c.expandable_segments); }
bool set_strict(std::string_view v, Config& c) { return set_bool(v, c.strict); }
bool set_release_before_peak(std::string_view v, Config& c) { return set_bool(v, c.release_before_peak); }
bool set_release_remap(std::string_view v, Config& c) { return set_bool(v, c.release_remap); }

// Looks `v` (any case) up among `names`; the index is the enum value.
template <typename Enum, std::size_t N>
bool set_enum(std::string_view v, const std::array<const char*, N>& names, Enum& out) {
  const std::string s = lower(v);
  for (std::size_t i = 0; i < N; ++i)
    if (s == names[i]) return (out = static_cast<Enum>(i)), true;
  return false;
}

constexpr std::array<const char*, 4> kHandleTypeNames{"auto", "posix_fd", "fabric", "none"};
constexpr std::array<const char*, 4> kFreeSyncNames{"auto", "fence", "stream", "device"};
constexpr std::array<const char*, 7> kLogLevelNames{"trace", "debug",    "info", "warn",
                                                    "error", "critical", "off"};

bool set_handle_type(std::string_view v, Config& c) {
  return set_enum(v, kHandleTypeNames, c.expandable_segments_handle_type);
}
bool set_free_sync(std::string_view v, Config& c) { return set_enum(v, kFreeSyncNames, c.free_sync); }
constexpr std::array<const char*, 3> kCrossStreamNames{"false", "segments", "blocks"};
bool set_cross_stream_reuse(std::string_view v, Config& c) {
  if (lower(v) == "true") return (c.cross_stream_reuse = CrossStream::segments), true;
  return set_enum(v, kCrossStreamNames, c.cross_stream_reuse);
}
bool set_fence_join(std::string_view v, Config& c) { return set_bool(v, c.fence_join); }
bool set_fence_wait_max(std::string_view v, Config& c) {
  if (lower(v) == "unlimited") return (c.fence_wait_max = kUnlimited), true;
  const auto bytes = parse_mib(v, 0);
  if (bytes) c.fence_wait_max = *bytes;
  return bytes.has_value();
}
bool set_log_level(std::string_view v, Config& c) { return set_enum(v, kLogLevelNames, c.log_level); }

bool set_path(std::string_view v, std::string& out) {
  if (v.empty()) return false;
  out = std::string(v);
  return true;
}
bool set_stats(std::string_view v, Config& c) { return set_path(v, c.stats); }
bool set_snapshot(std::string_view v, Config& c) { return set_path(v, c.snapshot); }
bool set_trace(std::string_view v, Config& c) { return set_path(v, c.trace); }
bool set_log_file(std::string_view v, Config& c) { return set_path(v, c.log_file); }
// A tag name: letters, digits, '_', '-', '.' (it appears in reports and JSON).
bool set_tag(std::string_view v, Config& c) {
  if (v.empty() || v.size() > 63) return false;
  for (char ch : v)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-' || ch == '.')) return false;
  c.tag = std::string(v);
  return true;
}
bool set_tag_cpu_backup(std::string_view v, Config& c) {
  const std::string s = lower(v);
  if (s == "disk") return (c.tag_cpu_backup = BackupMode::disk), true;
  if (s == "pageable") return (c.tag_cpu_backup = BackupMode::pageable), true;
  bool on = false;
  if (!set_bool(v, on)) return false;
  c.tag_cpu_backup = on ? BackupMode::host : BackupMode::none;
  return true;
}
bool set_pause_backup_dir(std::string_view v, Config& c) { return set_path(v, c.pause_backup_dir); }

bool set_snapshot_signal(std::string_view v, Config& c) {
  std::string s = lower(v);
  if (s.starts_with("sig")) s.erase(0, 3);
  if (s == "usr1") return (c.snapshot_signal = SIGUSR1), true;
  if (s == "usr2") return (c.snapshot_signal = SIGUSR2), true;
  const auto n = parse_uint(v);
  if (!n || *n < 1 || *n > 64) return false;
  c.snapshot_signal = static_cast<int>(*n);
  return true;
}

bool set_trace_max_entries(std::string_view v, Config& c) {
  const auto n = parse_uint(v);
  if (!n || *n < 1 || *n > kUnlimited) return false;
  c.trace_max_entries = static_cast<std::size_t>(*n);
  return true;
}

// ---------------------------------------------------------------- the key table

struct KeyHandler {
  const char* key;
  bool (*set)(std::string_view value, Config& config);
  bool is_path;          // keeps inner whitespace
  const char* expected;  // what is accepted, for the error message
};

constexpr KeyHandler kHandlers[] = {
    {"max_split_size_mb", set_max_split_size, false, "an integer number of MiB >= 20, or unlimited"},
    {"max_non_split_rounding_mb", set_max_non_split_rounding, false, "an integer number of MiB >= 1"},
    {"roundup_power2_divisions", set_roundup_power2_divisions, false,
     "a power of two, or [<MiB>:<divisions>,...,>:<divisions>] with MiB a power of two and "
     "divisions a power of two or 0"},
    {"garbage_collection_threshold", set_gc_threshold, false, "a number strictly between 0 and 1"},
    {"per_process_memory_fraction", set_memory_fraction, false, "a number in (0, 1]"},
    {"expandable_segments", set_expandable_segments, false, "true or false"},
    {"expandable_segments_handle_type", set_handle_type, false, "one of auto, posix_fd, fabric, none"},
    {"release_before_peak", set_release_before_peak, false, "true or false"},
    {"release_remap", set_release_remap, false, "true or false"},
    {"free_sync", set_free_sync, false, "one of auto, fence, stream, device"},
    {"fence_join", set_fence_join, false, "true or false"},
    {"fence_wait_max_mb", set_fence_wait_max, false, "an integer number of MiB >= 0, or unlimited"},
    {"fence_join_frees", set_fence_join_frees, false, "an integer number of frees from 1 to 1000000"},
    {"cross_stream_reuse", set_cross_stream_reuse, false, "one of segments (or true), blocks, false"},
    {"pinned_max_cached_mb", set_pinned_max_cached, false, "an integer number of MiB >= 0 (0 = off), or unlimited"},
    {"thread_cache_kb", set_thread_cache, false, "an integer number of KiB >= 0 per thread (0 = off)"},
    {"tag", set_tag, false, "a tag name (letters, digits, _ - .; at most 63)"},
    {"tag_cpu_backup", set_tag_cpu_backup, false, "true, false, pageable or disk"},
    {"pause_backup_dir", set_pause_backup_dir, true, "a directory path"},
    {"stats", set_stats, true, "stderr or a file path"},
    {"snapshot", set_snapshot, true, "a file path"},
    {"snapshot_signal", set_snapshot_signal, false, "USR1, USR2 or a signal number 1..64"},
    {"trace", set_trace, true, "a file path"},
    {"trace_max_entries", set_trace_max_entries, false, "an integer >= 1"},
    {"log_level", set_log_level, false, "one of trace, debug, info, warn, error, critical, off"},
    {"log_file", set_log_file, true, "a file path"},
    {"strict", set_strict, false, "true or false"},
};

// Keys of PyTorch's CUDAAllocatorConfig / AcceleratorAllocatorConfig
// (c10/cuda/CUDAAllocatorConfig.cpp, c10/core/AllocatorConfig.cpp) that
// cachalloc has no key for: a configuration copied from
// PYTORCH_CUDA_ALLOC_CONF names them, and they are reported as ignored,
// not as typos.  (The keys both share are in kHandlers.)
constexpr const char* kPyTorchOnlyKeys[] = {
    "backend",
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb",
    "graph_capture_record_stream_reuse",
};

bool is_pytorch_only_key(std::string_view key) {
  for (const char* k : kPyTorchOnlyKeys)
    if (key == k) return true;
  return false;
}

constexpr std::string_view kIgnoredMark = ": ignored (PyTorch-only)";

const KeyHandler* find_handler(std::string_view key) {
  for (const KeyHandler& h : kHandlers)
    if (key == h.key) return &h;
  return nullptr;
}

std::string known_keys() {
  std::string out;
  for (const KeyHandler& h : kHandlers) out += (out.empty() ? "" : ", ") + std::string(h.key);
  return out;
}

// ---------------------------------------------------------------- items

// Splits at commas outside brackets, so "a:[1:2,>:4],b:c" is two items.
std::vector<std::string_view> split_items(std::string_view text) {
  std::vector<std::string_view> items;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '[') ++depth;
    if (text[i] == ']' && depth > 0) --depth;
    if (text[i] == ',' && depth == 0) {
      items.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  items.push_back(text.substr(start));
  return items;
}

bool brackets_balanced(std::string_view s) {
  int depth = 0;
  for (char c : s) {
    depth += (c == '[') - (c == ']');
    if (depth < 0) return false;
  }
  return depth == 0;
}

// Text from the environment as a message shows it: control and non-ASCII
// bytes as \xNN (nothing reaches the terminal raw), and at most kShownBytes
// of it, so that a 1 MB CACHALLOC_CONF still gives a one-line message.
constexpr std::size_t kShownBytes = 80;

std::string shown(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < text.size() && i < kShownBytes; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (text.size() > kShownBytes) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

std::string malformed(std::string_view item) {
  return "CACHALLOC_CONF: malformed item '" + shown(item) + "'; expected key:value";
}

// Levenshtein distance, for "did you mean" (keys are short).
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The known key a misspelled `key` most likely meant ("" if none is close):
// the same key in another case, one that starts with it (PyTorch's
// max_split_size without _mb), or one at most 3 edits away.
std::string closest_key(std::string_view key) {
  if (key.size() > 64) return "";
  const std::string low = lower(key);
  const KeyHandler* best = nullptr;
  std::size_t best_distance = 4;
  for (const KeyHandler& h : kHandlers) {
    const std::string_view k = h.key;
    if (low == k || (low.size() >= 4 && k.starts_with(low))) return h.key;
    const std::size_t d = edit_distance(low, k);
    if (d < best_distance) best = &h, best_distance = d;
  }
  return best != nullptr ? best->key : "";
}

std::string unknown_key(const std::string& key) {
  const std::string guess = closest_key(key);
  return "CACHALLOC_CONF: unknown key '" + shown(key) + "'" +
         (guess.empty() ? "" : " (did you mean '" + guess + "'?)") + "; known keys: " + known_keys();
}

// Applies one "key:value" item; the value runs from the first colon on, so
// a path may hold colons of its own.
std::string apply_item(std::string_view item, Config& config) {
  const auto colon = item.find(':');
  if (colon == std::string_view::npos || !brackets_balanced(item)) return malformed(item);
  const std::string key = strip_all_space(item.substr(0, colon));
  if (key.empty() || key.find_first_of("[]") != std::string::npos) return malformed(item);
  const KeyHandler* h = find_handler(key);
  if (!h && is_pytorch_only_key(key))
    return "CACHALLOC_CONF: " + key + std::string(kIgnoredMark) + ": a key of PyTorch's own allocator that cachalloc "
           "does not implement";
  if (!h) return unknown_key(key);
  const std::string value = h->is_path ? std::string(trim(item.substr(colon + 1)))
                                       : strip_all_space(item.substr(colon + 1));
  if (h->set(value, config)) return "";
  return "CACHALLOC_CONF: " + key + ": '" + shown(value) + "' is not valid; expected " + h->expected;
}

// ---------------------------------------------------------------- printing

// Shortest text that reads back as the same double.
std::string format_real(double x) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, x);
  return ec == std::errc{} ? std::string(buf, end) : std::string("nan");
}

std::string format_divisions(const std::array<std::size_t, kPower2Intervals>& d) {
  std::string out = "[";
  for (int i = 0; i < kPower2Intervals; ++i)
    out += (i ? "," : "") + std::to_string(std::size_t{1} << i) + ":" + std::to_string(d[i]);
  return out + "]";
}

std::string format_signal(int sig) {
  if (sig == SIGUSR1) return "USR1";
  if (sig == SIGUSR2) return "USR2";
  return std::to_string(sig);
}

void append(std::string& out, std::string_view key, std::string_view value) {
  if (!out.empty()) out += ',';
  out.append(key).append(":").append(value);
}

}  // namespace

std::vector<std::string> apply_config(std::string_view text, Config* out) {
  Config parsed = *out;
  std::vector<std::string> errors;
  bool wait_max_named = false;
  for (std::string_view item : split_items(text)) {
    if (trim(item).empty()) continue;  // "" and trailing commas are fine
    std::string error = apply_item(trim(item), parsed);
    if (!error.empty()) {
      errors.push_back(std::move(error));
      continue;
    }
    wait_max_named = wait_max_named || lower(trim(item)).starts_with("fence_wait_max_mb");
  }
  // Expandable segments' default bound (config.h): only where the text
  // turned them on and set no bound of its own.
  if (parsed.expandable_segments && !out->expandable_segments && !wait_max_named &&
      parsed.fence_wait_max == Config::kFenceWaitMaxClassic)
    parsed.fence_wait_max = Config::kFenceWaitMaxExpandable;
  *out = std::move(parsed);
  return errors;
}

std::string parse_config(std::string_view text, Config* out) {
  Config parsed = *out;
  std::vector<std::string> errors = apply_config(text, &parsed);
  if (!errors.empty()) return errors.front();
  *out = std::move(parsed);
  return "";
}

std::string Config::to_string() const {
  std::string out;
  append(out, "max_split_size_mb",
         max_split_size == kUnlimited ? "unlimited" : std::to_string(max_split_size >> 20));
  append(out, "max_non_split_rounding_mb", std::to_string(max_non_split_rounding >> 20));
  append(out, "roundup_power2_divisions", format_divisions(roundup_power2_divisions));
  if (garbage_collection_threshold > 0.0)  // 0 = off has no text that parses
    append(out, "garbage_collection_threshold", format_real(garbage_collection_threshold));
  append(out, "per_process_memory_fraction", format_real(per_process_memory_fraction));
  append(out, "expandable_segments", expandable_segments ? "true" : "false");
  append(out, "expandable_segments_handle_type",
         kHandleTypeNames[static_cast<int>(expandable_segments_handle_type)]);
  append(out, "release_before_peak", release_before_peak ? "true" : "false");
  append(out, "release_remap", release_remap ? "true" : "false");
  append(out, "free_sync", kFreeSyncNames[static_cast<int>(free_sync)]);
  append(out, "fence_join", fence_join ? "true" : "false");
  append(out, "fence_wait_max_mb", fence_wait_max == kUnlimited ? "unlimited" : std::to_string(fence_wait_max >> 20));
  append(out, "fence_join_frees", std::to_string(fence_join_frees));
  append(out, "cross_stream_reuse", kCrossStreamNames[static_cast<int>(cross_stream_reuse)]);
  append(out, "pinned_max_cached_mb",
         pinned_max_cached == kUnlimited ? "unlimited" : std::to_string(pinned_max_cached >> 20));
  append(out, "thread_cache_kb", std::to_string(thread_cache_bytes >> 10));
  if (!tag.empty()) append(out, "tag", tag);
  if (tag_cpu_backup != BackupMode::none)
    append(out, "tag_cpu_backup", tag_cpu_backup == BackupMode::disk       ? "disk"
                                  : tag_cpu_backup == BackupMode::pageable ? "pageable"
                                                                           : "true");
  if (!pause_backup_dir.empty()) append(out, "pause_backup_dir", pause_backup_dir);
  // Unset paths and signal have no text that parses either; leaving them
  // out keeps the default, which is what they are.
  if (!stats.empty()) append(out, "stats", stats);
  if (!snapshot.empty()) append(out, "snapshot", snapshot);
  if (snapshot_signal != 0) append(out, "snapshot_signal", format_signal(snapshot_signal));
  if (!trace.empty()) append(out, "trace", trace);
  append(out, "trace_max_entries", std::to_string(trace_max_entries));
  append(out, "log_level", kLogLevelNames[static_cast<int>(log_level)]);
  if (!log_file.empty()) append(out, "log_file", log_file);
  if (strict) append(out, "strict", "true");
  return out;
}

bool has_config_errors(const std::vector<std::string>& messages) {
  for (const std::string& m : messages)
    if (m.find(kIgnoredMark) == std::string::npos) return true;
  return false;
}

}  // namespace cachalloc
