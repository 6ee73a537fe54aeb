// tms_c_api.cpp — torch_memory_saver's C entry points (the `tms_*`
// functions its binary exports), over cachalloc's tag API, so that a
// program that drives TMS from C or through ctypes (`ctypes.CDLL(None)
// .tms_pause`, as TMS's own cuda_vmm_granularity test does) runs unchanged
// with cachalloc preloaded instead (docs/PAUSE.md, "For torch_memory_saver
// users").
//
// TMS keeps, per thread, whether the thread is in an "interesting region"
// and the region's tag and backup choices, and tags an allocation only
// inside a region.  Here the same per-thread state is kept, and every
// setter hands the resulting tag and backup mode to
// cachalloc_set_tag_with_backup (outside a region: the thread untagged), so
// that cachalloc's allocator sees exactly what TMS's would.  What differs
// from TMS: a bad argument is ignored with the tag API's error code, never
// an exit; XPU entry points are absent (CUDA only); tms_torch_malloc/free
// are cachalloc_malloc/free's job (use_with_torch).
#include <cstdint>
#include <cstring>

#include "cachalloc.h"

#define CACHALLOC_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

struct RegionConfig {
  bool interesting = false;
  char tag[64] = "default";  // TMS's default tag; names as cachalloc's (<= 63 bytes)
  bool cpu_backup = false;
  bool pageable = false;     // cpu_backup_backend "mmap" (TMS's pageable host backup)
  bool disk_backup = false;
};

thread_local RegionConfig t_config;

int backup_mode(const RegionConfig& c) {
  if (c.disk_backup) return CACHALLOC_BACKUP_DISK;
  if (c.cpu_backup) return c.pageable ? CACHALLOC_BACKUP_PAGEABLE : CACHALLOC_BACKUP_HOST;
  return CACHALLOC_BACKUP_NONE;
}

// The thread's tag from its region state: inside a region the region's tag
// and backup, outside none.
int apply(const RegionConfig& c) {
  return c.interesting ? cachalloc_set_tag_with_backup(c.tag, backup_mode(c)) : cachalloc_set_tag(nullptr);
}

}  // namespace

CACHALLOC_EXPORT void tms_set_interesting_region(bool is_interesting_region) {
  t_config.interesting = is_interesting_region;
  apply(t_config);
}

CACHALLOC_EXPORT bool tms_get_interesting_region() { return t_config.interesting; }

CACHALLOC_EXPORT void tms_set_current_tag(const char* tag) {
  if (tag == nullptr || std::strlen(tag) >= sizeof t_config.tag) return;  // (TMS exits on NULL)
  RegionConfig next = t_config;
  std::strcpy(next.tag, tag);
  if (!next.interesting || apply(next) == CACHALLOC_SUCCESS) t_config = next;
}

CACHALLOC_EXPORT const char* tms_get_current_tag() { return t_config.tag; }

CACHALLOC_EXPORT bool tms_get_enable_cpu_backup() { return t_config.cpu_backup; }

CACHALLOC_EXPORT void tms_set_enable_cpu_backup(bool enable_cpu_backup) {
  t_config.cpu_backup = enable_cpu_backup;
  apply(t_config);
}

CACHALLOC_EXPORT const char* tms_get_cpu_backup_backend() { return t_config.pageable ? "mmap" : "pinned"; }

CACHALLOC_EXPORT void tms_set_cpu_backup_backend(const char* backend) {
  if (backend == nullptr) return;
  if (std::strcmp(backend, "pinned") != 0 && std::strcmp(backend, "mmap") != 0) return;  // (TMS exits)
  t_config.pageable = std::strcmp(backend, "mmap") == 0;
  apply(t_config);
}

CACHALLOC_EXPORT bool tms_get_enable_disk_backup() { return t_config.disk_backup; }

CACHALLOC_EXPORT void tms_set_enable_disk_backup(bool enable_disk_backup) {
  t_config.disk_backup = enable_disk_backup;
  apply(t_config);
}

// TMS names a file per allocation in the directory (cachalloc's named files).
CACHALLOC_EXPORT void tms_set_disk_backup_dir(const char* dir) {
  if (dir != nullptr) cachalloc_set_pause_backup_dir(dir, 1);
}

CACHALLOC_EXPORT void tms_set_retain_cpu_backup(bool retain_cpu_backup) {
  cachalloc_set_tag_retain_backup(nullptr, retain_cpu_backup ? 1 : 0);
}

CACHALLOC_EXPORT bool tms_get_retain_cpu_backup() { return cachalloc_get_tag_retain_backup(nullptr) == 1; }

// NULL or "": every tag (TMS's and cachalloc's meaning alike).
CACHALLOC_EXPORT int tms_pause(const char* tag) {
  return cachalloc_pause(tag != nullptr && *tag != '\0' ? tag : nullptr);
}

CACHALLOC_EXPORT int tms_resume(const char* tag) {
  return cachalloc_resume(tag != nullptr && *tag != '\0' ? tag : nullptr);
}

CACHALLOC_EXPORT std::uint8_t* tms_get_cpu_backup_pointer(const std::uint8_t* gpu_ptr, std::uint64_t size) {
  void* host = nullptr;
  if (cachalloc_get_backup_pointer(gpu_ptr, static_cast<std::size_t>(size), &host) != CACHALLOC_SUCCESS) return nullptr;
  return static_cast<std::uint8_t*>(host);
}
