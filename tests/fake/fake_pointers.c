/* fake_pointers.c — what a device pointer lies in: address ranges and pointer attributes.
 *
 * One view (struct region) of cuMemAlloc memory, IPC imports and VM
 * mappings answers cuMemGetAddressRange and the pointer attributes, as the
 * real driver answers them (measured on an H100, driver 580): a
 * cuMemAlloc allocation is exactly the requested bytes (its mapping is the
 * rounded memfd, or the 2 MiB one it shares with other small allocations),
 * a VM mapping is the mapped chunk inside its reservation, an import is the
 * handle's size; page-locked host memory (fake_host.c) is host memory of
 * exactly the requested (or registered) bytes. */
#include <string.h>

#include "fake_state.h"

struct region {
  CUdeviceptr base; size_t size;               /* cuMemGetAddressRange */
  CUdeviceptr range_start; size_t range_size;  /* RANGE_START_ADDR / RANGE_SIZE */
  CUdeviceptr map_base; size_t map_size;       /* MAPPING_BASE_ADDR / MAPPING_SIZE */
  struct CUctx_st* ctx;
  int device;
  unsigned long long buffer_id, block_id, handle_types;
  unsigned ipc_capable, access;
  unsigned* sync_memops;
  int host;                                    /* page-locked host memory */
};

/* Host memory has no SYNC_MEMOPS of its own to set: writes go nowhere. */
static unsigned host_sync_memops;

static void region_of_host(struct region* r, struct host_block* b) {
  r->base = r->range_start = r->map_base = (CUdeviceptr)(uintptr_t)b->ptr;
  r->size = r->range_size = r->map_size = b->size;
  r->ctx = b->ctx;
  r->device = b->ctx ? b->ctx->device : 0;
  r->buffer_id = b->buffer_id;
  r->block_id = b->buffer_id + BLOCK_ID_BIAS;
  r->access = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r->sync_memops = &host_sync_memops;
  r->host = 1;
}

static void region_of_allocation(struct region* r, struct allocation* a) {
  r->base = r->range_start = (CUdeviceptr)(uintptr_t)a->ptr;
  r->map_base = r->base - a->offset;
  r->size = r->range_size = a->size;
  r->map_size = a->mapping;
  r->ctx = a->ctx;
  r->device = a->ctx->device;
  r->buffer_id = a->buffer_id;
  r->block_id = a->map_id + BLOCK_ID_BIAS;  /* the mapping's, shared or not */
  r->ipc_capable = 1;
  r->access = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r->sync_memops = &a->sync_memops;
}

static void region_of_import(struct region* r, struct import* m) {
  r->base = r->range_start = r->map_base = m->ptr;
  r->size = r->range_size = m->size;
  r->map_size = fake_round_up(m->size, ALLOC_PAGE);
  r->ctx = m->ctx;
  r->device = m->ctx->device;
  r->buffer_id = m->buffer_id;
  r->block_id = m->buffer_id + BLOCK_ID_BIAS;
  r->ipc_capable = 1;
  r->access = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r->sync_memops = &m->sync_memops;
}

/* RANGE_* is the whole reservation; ACCESS_FLAGS is what the current
 * context's device (else the owner) was granted at p. */
static void region_of_mapping(struct region* r, struct vm_mapping* m, CUdeviceptr p) {
  struct reservation* res = fake_find_reservation(m->ptr);
  r->base = r->map_base = m->ptr;
  r->size = r->map_size = m->size;
  r->range_start = res ? res->base : m->ptr;
  r->range_size = res ? res->size : m->size;
  r->device = m->device;
  r->buffer_id = m->buffer_id;
  r->block_id = m->block_id;
  r->handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  r->access = fake_vm_flags(m, p, fake_current && fake_current->alive ? fake_current->device : m->device);
  r->sync_memops = &m->sync_memops;
}

/* Fills *r for p; 0 when p is in no live memory (lock held). */
static int find_region(CUdeviceptr p, struct region* r) {
  memset(r, 0, sizeof *r);
  struct allocation* a = fake_find_allocation(p);
  if (a) { region_of_allocation(r, a); return 1; }
  struct import* m = fake_find_import(p);
  if (m) { region_of_import(r, m); return 1; }
  struct vm_mapping* v = fake_find_mapping(p);
  if (v) { region_of_mapping(r, v, p); return 1; }
  struct host_block* h = fake_find_host((uintptr_t)p);
  if (h) { region_of_host(r, h); return 1; }
  return 0;
}

/* ---------------- address ranges ---------------- */

/* cuMemAlloc memory: exactly the requested bytes (not the rounded
 * mapping); VM memory: the mapped chunk; imports: the handle's size. */
EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr p) {
  struct region r;
  fake_lock();
  int found = find_region(p, &r);
  fake_unlock();
  if (!found) return CUDA_ERROR_NOT_FOUND;
  if (base) *base = r.base;
  if (size) *size = r.size;
  return CUDA_SUCCESS;
}

/* ---------------- pointer attributes ---------------- */

/* One attribute of live memory (lock held).  `plural`: as
 * cuPointerGetAttributes answers, which differs on HOST_POINTER (NULL,
 * success) and P2P_TOKENS (refused). */
static CUresult attr_live(const struct region* r, CUdeviceptr p, CUpointer_attribute a, void* data, int plural) {
  switch (a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext*)data = r->ctx; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned*)data = r->host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr*)data = p; break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      if (r->host) {
        *(void**)data = (void*)(uintptr_t)p;
        break;
      }
      if (!plural) return CUDA_ERROR_INVALID_VALUE;
      *(void**)data = NULL;
      break;
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS: {
      if (plural) return CUDA_ERROR_INVALID_VALUE;
      CUDA_POINTER_ATTRIBUTE_P2P_TOKENS t = {0, 0xfe00};
      memcpy(data, &t, sizeof t);
      *r->sync_memops = 1;
      break;
    }
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: *(unsigned*)data = *r->sync_memops; break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long*)data = r->buffer_id; break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(unsigned*)data = 0; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int*)data = r->device; break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: *(unsigned*)data = r->ipc_capable; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr*)data = r->range_start; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t*)data = r->range_size; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(unsigned*)data = 1; break;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: *(unsigned long long*)data = r->handle_types; break;
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE: *(unsigned*)data = 1; break;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: *(unsigned*)data = r->access; break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: *(CUmemoryPool*)data = NULL; break;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: *(size_t*)data = r->map_size; break;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: *(void**)data = (void*)(uintptr_t)r->map_base; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID: *(unsigned long long*)data = r->block_id; break;
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE: *(unsigned*)data = 0; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

/* cuPointerGetAttributes on memory the driver does not know: defaults,
 * the queried address as HOST_POINTER, RANGE_* left unwritten. */
static CUresult attr_unknown(CUdeviceptr p, CUpointer_attribute a, void* data) {
  switch (a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext*)data = NULL; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr*)data = 0; break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER: *(void**)data = (void*)(uintptr_t)p; break;
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS: return CUDA_ERROR_INVALID_VALUE;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int*)data = -2; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID: *(unsigned long long*)data = 0; break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: *(CUmemoryPool*)data = NULL; break;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: *(size_t*)data = 0; break;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: *(void**)data = NULL; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_MAPPED:
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE: *(unsigned*)data = 0; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

/* Unknown or freed memory: CUDA_ERROR_INVALID_VALUE, nothing written. */
EXPORT CUresult cuPointerGetAttribute(void* data, CUpointer_attribute a, CUdeviceptr p) {
  if (data == NULL) return CUDA_ERROR_INVALID_VALUE;
  struct region r;
  fake_lock();
  CUresult res = find_region(p, &r) ? attr_live(&r, p, a, data, 0) : CUDA_ERROR_INVALID_VALUE;
  fake_unlock();
  return res;
}

/* Stops at the first refused attribute (those before it stay written);
 * a NULL data[i] is skipped. */
EXPORT CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute* attrs, void** data, CUdeviceptr p) {
  if (n > 0 && (attrs == NULL || data == NULL)) return CUDA_ERROR_INVALID_VALUE;
  struct region r;
  fake_lock();
  int found = find_region(p, &r);
  CUresult res = CUDA_SUCCESS;
  for (unsigned i = 0; i < n && res == CUDA_SUCCESS; ++i)
    if (data[i] != NULL) res = found ? attr_live(&r, p, attrs[i], data[i], 1) : attr_unknown(p, attrs[i], data[i]);
  fake_unlock();
  return res;
}

/* Only SYNC_MEMOPS can be set, on live memory. */
EXPORT CUresult cuPointerSetAttribute(const void* value, CUpointer_attribute a, CUdeviceptr p) {
  if (value == NULL || a != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS) return CUDA_ERROR_INVALID_VALUE;
  struct region r;
  fake_lock();
  int found = find_region(p, &r);
  if (found) *r.sync_memops = *(const unsigned*)value != 0;
  fake_unlock();
  return found ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
