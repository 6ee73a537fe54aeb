// backup_memory.cpp — DeviceBackend's pageable host memory for backups of
// paused tags (BackupMode::pageable, backend.h), as plain POSIX calls.
//
// Anonymous private mappings, not malloc: the pages are the kernel's from
// the first touch to munmap, so the process's resident memory drops by the
// whole backup the moment it is given back (a malloc'ed buffer may stay in
// the heap), and unlike pinned memory they cost nothing to allocate and the
// kernel may swap them under pressure.  The device copies to and from them
// are staged by the driver (slower than pinned: docs/PAUSE.md).
#include <sys/mman.h>

#include "backend.h"

namespace cachalloc {

Status DeviceBackend::pageable_alloc(std::size_t size, void** out) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    *out = nullptr;
    return kOutOfMemory;
  }
  *out = p;
  return kSuccess;
}

void DeviceBackend::pageable_free(void* ptr, std::size_t size) {
  if (ptr != nullptr) ::munmap(ptr, size);
}

}  // namespace cachalloc
