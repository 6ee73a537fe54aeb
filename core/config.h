// config.h — every setting a user can give in CACHALLOC_CONF.
//
// Syntax is PyTorch's PYTORCH_CUDA_ALLOC_CONF: "key:value,key:[a:b,c:d]",
// whitespace ignored.  parse_config() either fills a Config completely or
// returns one message naming the key, the bad value and what is accepted;
// it never falls back silently to a default for bad input.
#pragma once

#include <array>
#include <cstddef>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "types.h"

namespace cachalloc {

enum class HandleType { automatic, posix_fd, fabric, none };
// How a plain cuMemFree/cudaFree makes its block safe to reuse (docs/DESIGN.md):
//   stream — reuse in stream order on the legacy stream (PyTorch's rule);
//   fence  — events on every live stream, reuse once they complete;
//   device — synchronize the context, as cudaFree itself does;
//   automatic — stream while the context has no other stream, else fence.
enum class FreeSync { automatic, fence, stream, device };
// What a request may take from another stream's free memory, ordered on the
// device (core/steal_path.cpp): nothing; a whole free segment, which moves
// to it; or also a free block of a segment the other stream still uses,
// lent until its free (whose event must complete before it goes back).
enum class CrossStream { off, segments, blocks };
enum class LogLevel { trace, debug, info, warn, err, critical, off };

// roundup_power2_divisions is given per power-of-two size interval, as in
// PyTorch: entry 0 covers sizes below 2 MiB, entry i sizes in
// [2^i MiB, 2^(i+1) MiB), the last entry everything from 32 GiB up.
// 0 means "no power-of-two rounding" for that interval.
inline constexpr int kPower2Intervals = 16;

struct Config {
  // --- caching core ---
  std::size_t max_split_size = std::numeric_limits<std::size_t>::max();  // bytes; max() = unlimited
  std::size_t max_non_split_rounding = 20u << 20;                          // bytes
  std::array<std::size_t, kPower2Intervals> roundup_power2_divisions{};    // per interval
  double garbage_collection_threshold = 0.0;                               // 0 = off
  double per_process_memory_fraction = 1.0;
  bool expandable_segments = false;
  HandleType expandable_segments_handle_type = HandleType::automatic;
  // With expandable segments: before a grow would map more than the
  // process ever had mapped, whole free runs go back first (after one
  // device synchronization), so the high-water mark stays at what the
  // program needs at once (core/expandable.cpp, release_before_new_peak).
  // Off by default (it re-maps what it released); the launcher's
  // --torch-async sets it, as CUDA's pool keeps no such slack.
  bool release_before_peak = false;
  // With release_before_peak: the free runs a grow takes are mapped a second
  // time at the grow's address, after a context-wide fence is joined, and
  // their old addresses are unmapped once that fence completes, instead of
  // a device synchronization, unmap and fresh map (core/remap_release.cpp).
  // Off by default: not yet verified on a GPU.
  bool release_remap = false;
  // --- interposer ---
  FreeSync free_sync = FreeSync::automatic;
  // A miss that would grow the cache while freed blocks wait behind fences
  // that could serve it orders all later work after the fences instead
  // (cuCtxWaitEvent; core/ledger_fences.cpp, join_for) and reuses them.
  bool fence_join = true;
  // Cross-stream reuse (core/steal_path.cpp): a miss that would grow the
  // cache takes another stream's freed memory instead, its stream made to
  // wait on the device for the donor stream's work (an event recorded on
  // the donor, cuStreamWaitEvent; no host wait), as CUDA's stream-ordered
  // pool reuses across streams.  segments (the default): whole free
  // segments; blocks: also blocks of segments the donor still uses, lent
  // (and so expandable segments' blocks); off (false): each stream reuses
  // only its own frees (the behaviour before issue 36).
  CrossStream cross_stream_reuse = CrossStream::segments;
  // The most bytes of plain frees that may wait behind fences: once more
  // wait (and at least 20 frees, so that the two driver calls of a join
  // stay at 0.1 per free), the free itself joins them (core/ledger_fences.cpp,
  // bound_waiting).  kUnlimited: only misses join.
  // By default 256 MiB with classic segments and 128 MiB with expandable
  // ones (parse_config picks the second when expandable_segments:true and
  // the text sets no bound): the bounds that kept peak memory within +2 %
  // of PyTorch's own allocator on the side-stream and DDP programs at the
  // fewest driver calls measured (docs/BENCHMARKS.md section 5; 64 MiB cost
  // 0.12-0.16 driver calls per free there).
  static constexpr std::size_t kFenceWaitMaxClassic = std::size_t{256} << 20;
  static constexpr std::size_t kFenceWaitMaxExpandable = std::size_t{128} << 20;
  std::size_t fence_wait_max = kFenceWaitMaxClassic;
  // Frees that must wait before a join (past fence_wait_max, or at a small
  // request's miss): a join is two driver calls (an event recorded for the
  // whole context and the context's wait for it), so 20 keeps joins at 0.1
  // driver calls per free at most.  More: fewer calls, more bytes waiting
  // between joins (docs/BENCHMARKS.md section 5 has the curve).
  static constexpr std::size_t kDefaultFenceJoinFrees = 20;
  std::size_t fence_join_frees = kDefaultFenceJoinFrees;
  // --- pinned host memory (core/host_cache.h, docs/HOST.md) ---
  // Bytes of freed pinned blocks kept for reuse; 0 turns the host cache off
  // (cuMemHostAlloc and friends go to the driver unchanged).  On by
  // default, bounded: 1 GiB of idle page-locked memory per process at most
  // (PyTorch's own host cache has no bound; docs/HOST.md, "Configuration").
  static constexpr std::size_t kDefaultPinnedMaxCached = std::size_t{1024} << 20;
  std::size_t pinned_max_cached = kDefaultPinnedMaxCached;
  // --- per-thread front caches (core/thread_cache.h) ---
  // Bytes of small blocks each host thread may own in its front cache per
  // context (blocks it holds freed for its own reuse plus those it handed
  // out again); 0 turns the layer off.  Flushed at thread exit, empty_cache,
  // a miss that would grow the cache, OOM, snapshots and context death.
  static constexpr std::size_t kDefaultThreadCacheBytes = std::size_t{1024} << 10;
  std::size_t thread_cache_bytes = kDefaultThreadCacheBytes;
  // --- tags (pause/resume, docs/PAUSE.md) ---
  // The tag of every allocation of threads that set none (cachalloc_set_tag);
  // "" = untagged.  tag_cpu_backup: where that tag's pauses back it up
  // (true = pinned host memory, pageable = pageable host memory, disk = a
  // file in pause_backup_dir, false = none).
  std::string tag;
  BackupMode tag_cpu_backup = BackupMode::none;
  // Directory of the files of disk backups ("" = $TMPDIR, else /tmp).
  std::string pause_backup_dir;
  // A disk backup goes through two pinned staging buffers of this many
  // bytes (host memory it uses whatever the tag's size).  Not a
  // CACHALLOC_CONF key: tests shrink it.
  std::size_t pause_backup_chunk = std::size_t{64} << 20;
  // --- observability ---
  std::string stats;                 // "" = no dump, "stderr", or a path template
  std::string snapshot;              // path template, "" = none
  int snapshot_signal = 0;           // signal number, 0 = none
  std::string trace;                 // path template, "" = none
  std::size_t trace_max_entries = 1u << 20;
  LogLevel log_level = LogLevel::warn;
  std::string log_file;              // "" = stderr
  // A bad configuration (any message of apply_config) ends the process with
  // status 1 at start-up instead of running with the good keys.  Also set
  // by CACHALLOC_STRICT=1 (shim/process_state.cpp).
  bool strict = false;

  // The text form of every key, in CACHALLOC_CONF syntax (for dumps).
  std::string to_string() const;
};

// Parses `text` into `*out` (which starts from defaults).  Returns "" on
// success, else one human-readable message; a bad text changes nothing.
std::string parse_config(std::string_view text, Config* out);

// Applies every good item of `text` to `*out` and returns one message per
// item it could not apply (empty: all applied): a malformed item, an
// unknown key (with the likely one), a bad value, or a key of PyTorch's
// allocator that cachalloc does not implement ("ignored (PyTorch-only)").
// What the shim uses: a typo costs its own key, never the others.
std::vector<std::string> apply_config(std::string_view text, Config* out);

// Whether any of apply_config's messages is an error rather than a
// PyTorch-only key it recognised and ignored: what strict exits for (a
// configuration copied from PYTORCH_CUDA_ALLOC_CONF is not a typo).
bool has_config_errors(const std::vector<std::string>& messages);

}  // namespace cachalloc
