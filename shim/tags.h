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
#pragma once

#include <atomic>
#include <cstdint>
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
// The name of `id` ("" for kUntagged or an unknown id).
std::string tag_name(TagId id);
// Every registered tag id.
std::vector<TagId> all_tags();
// Sets the calling thread's tag (kUntagged: untagged).
void set_thread_tag(TagId id);
// Where `id` is backed up at its pauses (set per tag, last call wins).
void set_tag_backup(TagId id, BackupMode backup);
BackupMode tag_backup(TagId id);
// Reads CACHALLOC_CONF's tag once the configuration is known.
void apply_config_tag(const Config& config);

// malloc through `a` in the calling thread's tag.  A paused tag answers
// kOutOfMemory (CUDA_ERROR_OUT_OF_MEMORY) with a warning naming it.
Status malloc_in_current_tag(CachingAllocator& a, DevicePtr* out, std::size_t size, StreamId stream);
[[gnu::always_inline]] inline Status tagged_malloc(CachingAllocator& a, DevicePtr* out, std::size_t size,
                                                   StreamId stream) {
  if (current_tag_is_untagged()) [[likely]] return a.malloc(out, size, stream);
  return malloc_in_current_tag(a, out, size, stream);
}

}  // namespace cachalloc::shim
