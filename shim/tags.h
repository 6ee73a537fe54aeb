// tags.h — the calling thread's tag, and the process's tag names.
//
// Every allocation belongs to the tag current on its thread when it is made
// (docs/PAUSE.md).  The tag is a thread-local id; 0 (no tag set on the
// thread) falls back to the process's tag from CACHALLOC_CONF "tag:NAME",
// itself 0 when unset: then the allocation is untagged and takes the core's
// usual path.  current_tag_is_untagged() is the one test every allocation
// pays (two loads, one predictable branch); another front end (a per-thread
// cache) can use it to leave tagged allocations to the core.
//
// Names map to core TagIds (1, 2, ...) for the life of the process; a name
// is never forgotten, so an id stays valid in every allocator.
//
// Variants: torch_memory_saver decides the backup per allocation (a region
// says), cachalloc per tag.  A variant of a named tag is a core tag of its
// own whose backup mode is fixed (tag_variant): the allocations of a
// thread whose tag is the variant are backed up that way whatever the named
// tag's mode, and never share a segment with the named tag's other blocks.
// Pausing or resuming the name takes the named tag and all its variants;
// reports call a variant NAME+MODE ("default+none").
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "caching_allocator.h"

namespace cachalloc::shim {

namespace detail {
// The thread's tag: 0 = none set (the process's tag applies);
// kExplicitUntagged = untagged even when the process has a tag.
inline constexpr TagId kExplicitUntagged = ~TagId{0};
extern constinit thread_local TagId t_tag __attribute__((tls_model("initial-exec")));
extern std::atomic<TagId> g_process_tag;
}  // namespace detail

// True when the calling thread allocates untagged memory right now.
[[gnu::always_inline]] inline bool current_tag_is_untagged() {
  return (detail::t_tag | detail::g_process_tag.load(std::memory_order_relaxed)) == 0;
}
// The core id of the calling thread's tag (kUntagged when none).
TagId current_tag();

// The id of `name`, registered on first use; kUntagged for null or "".
// kInvalidValue-style failure (returns ~0) for a bad name.
inline constexpr TagId kBadTag = ~TagId{0};
TagId tag_id(const char* name);
// The variant of named tag `base` with backup mode `backup` (registered on
// first use); kBadTag when `base` is not a named tag.
TagId tag_variant(TagId base, BackupMode backup);
// The name of `id` ("" for kUntagged or an unknown id); a variant's is its
// named tag's.  tag_display_name: a variant's is NAME+MODE.
std::string tag_name(TagId id);
std::string tag_display_name(TagId id);
// The named tag of `id` (kUntagged for an unknown id); *fixed its backup
// mode and *is_variant whether it is a variant (either may be null).
TagId tag_base(TagId id, BackupMode* fixed = nullptr, bool* is_variant = nullptr);
// Every registered tag id that pausing "every tag" takes (NULL name): all
// but those of names set_tag_in_pause_all(false) left out.
std::vector<TagId> all_tags();
// Named tag `base` and its variants.
std::vector<TagId> tag_and_variants(TagId base);
// Sets the calling thread's tag (kUntagged: untagged).
void set_thread_tag(TagId id);
// The calling thread's own tag goes: the process's applies again.  And
// whether the thread has one of its own (set_thread_tag since).
inline void clear_thread_tag() { detail::t_tag = 0; }
inline bool thread_has_tag() { return detail::t_tag != 0; }
// Where `id` is backed up at its pauses (set per named tag, last call
// wins; a variant's is fixed and set_tag_backup leaves it alone).
void set_tag_backup(TagId id, BackupMode backup);
BackupMode tag_backup(TagId id);
// Whether a host backup of `id`'s name outlives its resume (read at each
// resume).  kUntagged: the default of every tag, those named later too,
// and every tag's own setting goes.
void set_tag_retain(TagId id, bool retain);
bool tag_retain(TagId id);

// Whether pausing every tag (a NULL name) takes `id`'s name (default true).
void set_tag_in_pause_all(TagId id, bool included);
// Reads CACHALLOC_CONF's tag once the configuration is known.
void apply_config_tag(const Config& config);

// torch_memory_saver's TMS_* environment variables (tms_env.cpp) into
// `config` and the tags' settings, where CACHALLOC_CONF said nothing;
// returns a warning per value not applied.
std::vector<std::string> apply_tms_env(Config& config);
// TMS's reading of a boolean variable (1/true/TRUE/yes/YES, 0/...); nullopt
// when unset or spelled otherwise.
std::optional<bool> tms_env_bool(const char* name);

// Process-wide settings of tags (tag_api.cpp), handed to an allocator:
// where disk backups go and whether their files are named (before each
// pause), and the memory margin of tagged allocations (at its creation).
void set_backup_files(const std::string& dir, bool named);
void set_backup_files_if_unset(const std::string& dir, bool named);
void apply_backup_files(CachingAllocator& a);
void apply_tag_settings(CachingAllocator& a);

// malloc through `a` in the calling thread's tag.  A paused tag answers
// kOutOfMemory (CUDA_ERROR_OUT_OF_MEMORY) with a warning naming it.
Status malloc_in_current_tag(CachingAllocator& a, DevicePtr* out, std::size_t size, StreamId stream);
[[gnu::always_inline]] inline Status tagged_malloc(CachingAllocator& a, DevicePtr* out, std::size_t size,
                                                   StreamId stream) {
  if (current_tag_is_untagged()) [[likely]] return a.malloc(out, size, stream);
  return malloc_in_current_tag(a, out, size, stream);
}

}  // namespace cachalloc::shim
