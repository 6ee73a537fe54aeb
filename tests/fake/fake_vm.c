/* fake_vm.c — virtual memory: reservations, cuMemCreate, cuMemMap, cuMemSetAccess.
 *
 * What expandable segments use.  Reservations are PROT_NONE anonymous
 * mappings; a physical allocation is a memfd of its size; mapping puts the
 * memfd at the reserved address, so copies and memsets through the mapped
 * range really reach memory.  The created bytes count against the device
 * total like cuMemAlloc's.  cuMemSetAccess records each device's flags per
 * granule; the owning device's flags set the host protection (read/write,
 * read, none).  None of it is context memory: physical allocations,
 * mappings and reservations outlive the context current when they were
 * made, as on an H100, until released explicitly.  FAKE_CUDA_NO_POSIX_FD=1
 * makes cuMemCreate refuse shareable POSIX fd handles
 * (CUDA_ERROR_NOT_SUPPORTED), as drivers without them do. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_state.h"

/* ---------------- lookups ---------------- */

struct vm_mapping* fake_find_mapping(CUdeviceptr p) {
  for (struct vm_mapping* m = fake.mappings; m; m = m->next)
    if (p >= m->ptr && p - m->ptr < m->size) return m;
  return NULL;
}

struct reservation* fake_find_reservation(CUdeviceptr p) {
  for (struct reservation* r = fake.reservations; r; r = r->next)
    if (p >= r->base && p - r->base < r->size) return r;
  return NULL;
}

unsigned fake_vm_flags(const struct vm_mapping* m, CUdeviceptr p, int device) {
  return m->access[(p - m->ptr) / VM_GRANULARITY * MAX_DEVICES + (size_t)device];
}

/* A mapping overlapping [ptr, ptr + size). */
static int overlaps(const struct vm_mapping* m, CUdeviceptr ptr, size_t size) {
  return m->ptr < ptr + size && ptr < m->ptr + m->size;
}

/* Forgets the mapping records inside [ptr, ptr + size) (lock held). */
static void forget_mappings(CUdeviceptr ptr, size_t size) {
  for (struct vm_mapping** p = &fake.mappings; *p;) {
    struct vm_mapping* m = *p;
    if (m->ptr < ptr || m->ptr - ptr >= size) { p = &m->next; continue; }
    *p = m->next;
    free(m->access);
    free(m);
  }
}

/* ---------------- address reservations ---------------- */

EXPORT CUresult cuMemGetAllocationGranularity(size_t* g, const CUmemAllocationProp* prop,
                                              CUmemAllocationGranularity_flags option) {
  (void)prop;
  (void)option;
  if (g == NULL) return CUDA_ERROR_INVALID_VALUE;
  *g = VM_GRANULARITY;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t align, CUdeviceptr addr,
                                    unsigned long long flags) {
  (void)align;
  (void)addr;
  (void)flags;
  if (ptr == NULL || size == 0 || size % VM_GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  CUresult fault = fake_fault(FAULT_MEM_ADDRESS_RESERVE);
  fake_unlock();
  if (fault != CUDA_SUCCESS) return fault;
  /* Over-reserve by one granule so the range can start granule-aligned. */
  void* p = mmap(NULL, size + VM_GRANULARITY, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  uintptr_t a = ((uintptr_t)p + VM_GRANULARITY - 1) & ~(uintptr_t)(VM_GRANULARITY - 1);
  struct reservation* r = calloc(1, sizeof *r);
  r->base = (CUdeviceptr)a;
  r->size = size;
  fake_lock();
  r->next = fake.reservations;
  fake.reservations = r;
  fake.stats.vm_reserve++;
  fake_unlock();
  *ptr = (CUdeviceptr)a;
  return CUDA_SUCCESS;
}

/* Exactly a reservation (base and size). */
EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  fake_lock();
  struct reservation** at = &fake.reservations;
  while (*at && ((*at)->base != ptr || (*at)->size != size)) at = &(*at)->next;
  struct reservation* r = *at;
  if (r != NULL) {
    *at = r->next;
    free(r);
    forget_mappings(ptr, size);
    /* The granule of slack before or after stays mapped PROT_NONE: harmless. */
    munmap((void*)(uintptr_t)ptr, size);
    fake.stats.vm_release_range++;
  }
  fake_unlock();
  return r != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---------------- physical memory ---------------- */

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                            unsigned long long flags) {
  (void)flags;
  if (handle == NULL || prop == NULL || size == 0 || size % VM_GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  fake_init_once();
  CUresult r = fake_fault(FAULT_MEM_CREATE);
  if (r != CUDA_SUCCESS) {
    /* injected: nothing else looked at */
  } else if (prop->location.id < 0 || prop->location.id >= fake.device_count) {
    r = CUDA_ERROR_INVALID_DEVICE;
  } else if ((prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) &&
             fake_env_size("FAKE_CUDA_NO_POSIX_FD", 0)) {
    fake.stats.vm_create_refused++;
    r = CUDA_ERROR_NOT_SUPPORTED;
  } else if (fake.stats.live_bytes + size > fake.stats.total_bytes) {
    fake.stats.mem_alloc_failed++;
    r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  int fd = r == CUDA_SUCCESS ? memfd_create("fake-cuda-vm", MFD_CLOEXEC) : -1;
  if (r == CUDA_SUCCESS && (fd < 0 || ftruncate(fd, (off_t)size) != 0)) {
    if (fd >= 0) close(fd);
    r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (r == CUDA_SUCCESS) {
    struct physical* ph = calloc(1, sizeof *ph);
    *ph = (struct physical){fd, size, prop->location.id, fake.next_buffer_id++, fake.physicals};
    fake.physicals = ph;
    fake.stats.live_bytes += size;
    fake.stats.vm_create++;
    /* The handle carries the fd and the size (sizes are multiples of 2 MiB). */
    *handle = ((CUmemGenericAllocationHandle)size) | (CUmemGenericAllocationHandle)fd;
  }
  fake_unlock();
  return r;
}

static int handle_fd(CUmemGenericAllocationHandle h) { return (int)(h & (VM_GRANULARITY - 1)); }
static size_t handle_size(CUmemGenericAllocationHandle h) { return (size_t)(h & ~(CUmemGenericAllocationHandle)(VM_GRANULARITY - 1)); }

static struct physical** find_physical(CUmemGenericAllocationHandle h) {
  struct physical** p = &fake.physicals;
  while (*p && ((*p)->fd != handle_fd(h) || (*p)->size != handle_size(h))) p = &(*p)->next;
  return p;
}

/* Mappings keep the memory until unmapped. */
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
  fake_lock();
  struct physical** at = find_physical(h);
  struct physical* ph = *at;
  if (ph != NULL) {
    *at = ph->next;
    close(ph->fd);
    fake.stats.live_bytes -= ph->size;
    fake.stats.vm_release++;
    free(ph);
  }
  fake_unlock();
  return ph != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Only cuMemMap'ed memory has an allocation handle. */
EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* h, void* addr) {
  if (h == NULL) return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  struct vm_mapping* m = fake_find_mapping((CUdeviceptr)(uintptr_t)addr);
  if (m != NULL) *h = m->handle;
  fake_unlock();
  return m != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---------------- mapping ---------------- */

static CUresult check_map(CUdeviceptr ptr, size_t size, size_t offset, struct physical* ph) {
  if (ph == NULL || size != ph->size || offset != 0 || ptr % VM_GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
  struct reservation* r = fake_find_reservation(ptr);
  if (r == NULL || ptr + size > r->base + r->size) return CUDA_ERROR_INVALID_VALUE;
  for (struct vm_mapping* m = fake.mappings; m; m = m->next)
    if (overlaps(m, ptr, size)) return CUDA_ERROR_INVALID_VALUE;
  if (fake_current != NULL && !fake_current->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  return CUDA_SUCCESS;
}

/* The whole physical allocation, at a granule inside a reservation, over
 * nothing mapped; no access until cuMemSetAccess. */
EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                         unsigned long long flags) {
  (void)flags;
  fake_lock();
  CUresult r = fake_fault(FAULT_MEM_MAP);
  struct physical* ph = *find_physical(h);
  if (r == CUDA_SUCCESS) r = check_map(ptr, size, offset, ph);
  void* p = MAP_FAILED;
  if (r == CUDA_SUCCESS) p = mmap((void*)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, ph->fd, 0);
  if (r == CUDA_SUCCESS && p == MAP_FAILED) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    struct vm_mapping* m = calloc(1, sizeof *m);
    m->ptr = ptr;
    m->size = size;
    m->device = ph->device;
    m->handle = h;
    m->buffer_id = fake.next_buffer_id++;
    m->block_id = ph->id + BLOCK_ID_BIAS;
    m->access = calloc(size / VM_GRANULARITY * MAX_DEVICES, 1);
    m->next = fake.mappings;
    fake.mappings = m;
    fake.stats.vm_map++;
  }
  fake_unlock();
  return r;
}

/* Whole mappings only (one or more); their access is forgotten. */
EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  fake_lock();
  CUresult r = CUDA_SUCCESS;
  int whole = 0;
  for (struct vm_mapping* m = fake.mappings; r == CUDA_SUCCESS && m; m = m->next) {
    if (!overlaps(m, ptr, size)) continue;
    if (m->ptr < ptr || m->ptr + m->size > ptr + size) r = CUDA_ERROR_INVALID_VALUE;
    whole++;
  }
  if (r == CUDA_SUCCESS && whole == 0) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    if (fake_kernels_in_flight()) fake.stats.vm_unmap_in_flight++;
    forget_mappings(ptr, size);
    /* Back to reserved-but-inaccessible address space. */
    mmap((void*)(uintptr_t)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    fake.stats.vm_unmap++;
  }
  fake_unlock();
  return r;
}

/* ---------------- access ---------------- */

/* Every byte of [ptr, ptr + size) is in mappings (lock held). */
static int fully_mapped(CUdeviceptr ptr, size_t size) {
  for (CUdeviceptr at = ptr; at < ptr + size;) {
    struct vm_mapping* m = fake_find_mapping(at);
    if (m == NULL) return 0;
    at = m->ptr + m->size;
  }
  return 1;
}

static CUresult check_access_descs(const CUmemAccessDesc* desc, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (desc[i].location.id < 0 || desc[i].location.id >= fake.device_count) return CUDA_ERROR_INVALID_DEVICE;
    if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

static int host_prot(unsigned flags) {
  return flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
         : flags == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
                                                      : PROT_NONE;
}

/* Records the descriptors on each granule of the range and protects it
 * as its owner may use it (lock held). */
static void apply_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  CUdeviceptr first = ptr / VM_GRANULARITY * VM_GRANULARITY;
  for (CUdeviceptr g = first; g < ptr + size; g += VM_GRANULARITY) {
    struct vm_mapping* m = fake_find_mapping(g);
    unsigned char* flags = &m->access[(g - m->ptr) / VM_GRANULARITY * MAX_DEVICES];
    for (size_t i = 0; i < count; ++i) flags[desc[i].location.id] = (unsigned char)desc[i].flags;
    mprotect((void*)(uintptr_t)g, VM_GRANULARITY, host_prot(flags[m->device]));
  }
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  if (desc == NULL || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  CUresult r = fake_fault(FAULT_MEM_SET_ACCESS);
  if (r == CUDA_SUCCESS) r = check_access_descs(desc, count);
  if (r == CUDA_SUCCESS && !fully_mapped(ptr, size)) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    const int owner = fake_find_mapping(ptr)->device;
    for (size_t i = 0; i < count; ++i)
      if (desc[i].location.id != owner) fake.stats.set_access_peer++;
    apply_access(ptr, size, desc, count);
    fake.stats.set_access++;
  }
  fake_unlock();
  return r;
}
