/* test_fake_driver.c — the fake libcuda.so.1 holds to the real driver's rules.
 *
 * Linked straight against the fake (no shim).  Each case (argv[1]) checks
 * one group of the behaviours measured on a real driver (H100, driver 580,
 * CUDA 13) that fake_libcuda.c copies: address ranges, pointer attributes,
 * IPC handles (across two processes: the importer is this program exec'd
 * afresh with the handles in hex on its command line), context destruction
 * and reset, peer access and VM access per device, the chunks small pinned
 * host allocations share (and the flags they report); and the fake's own test
 * machinery: fault injection and the counters of what it still holds.
 * Exit 0 pass, else a message on stderr. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>

#include "fake_libcuda.h"

#define MiB ((size_t)1 << 20)

static const char* g_case = "?";

#define CHECK(cond)                                                                     \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      fprintf(stderr, "[%s] %s:%d: check failed: %s\n", g_case, __FILE__, __LINE__, #cond); \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)
#define CHECK_CU(call) CHECK((call) == CUDA_SUCCESS)
#define CHECK_ERR(call, err) CHECK((call) == (err))
#define RUN(call) \
  do {            \
    if (call) return 1; \
  } while (0)

static struct fake_cuda_stats_t stats(void) {
  struct fake_cuda_stats_t s;
  fake_cuda_stats(&s);
  return s;
}

/* cuInit, device d's primary context retained and made current. */
static int setup(CUcontext* ctx, int device) {
  CUdevice dev;
  CHECK_CU(cuInit(0));
  CHECK_CU(cuDeviceGet(&dev, device));
  CHECK_CU(cuDevicePrimaryCtxRetain(ctx, dev));
  CHECK_CU(cuCtxSetCurrent(*ctx));
  return 0;
}

static unsigned char pattern(size_t i) { return (unsigned char)(i * 131u + (i >> 12)); }

static int fill(CUdeviceptr p, size_t n) {
  unsigned char* h = malloc(n);
  for (size_t i = 0; i < n; ++i) h[i] = pattern(i);
  CUresult r = cuMemcpyHtoD(p, h, n);
  free(h);
  CHECK_CU(r);
  return 0;
}

/* Bytes [0, n) at p hold pattern(first + i), except those in [hole, hole + hole_n) hold v. */
static int holds(CUdeviceptr p, size_t first, size_t n, size_t hole, size_t hole_n, unsigned char v) {
  unsigned char* h = malloc(n);
  CUresult r = cuMemcpyDtoH(h, p, n);
  int ok = r == CUDA_SUCCESS;
  for (size_t i = 0; ok && i < n; ++i) {
    size_t at = first + i;
    ok = h[i] == (at >= hole && at - hole < hole_n ? v : pattern(at));
    if (!ok) fprintf(stderr, "[%s] byte %zu (offset %zu) is %u\n", g_case, i, at, h[i]);
  }
  free(h);
  CHECK(ok);
  return 0;
}

/* ---------------- A. address ranges ---------------- */

static int address_range(void) {
  CUcontext ctx;
  CUdeviceptr p = 0, q = 0, base = 0;
  size_t size = 0;
  RUN(setup(&ctx, 0));
  CHECK_CU(cuMemAlloc(&p, 1000));
  for (size_t off = 0; off < 1000; off += 111) {
    base = 0;
    size = 0;
    CHECK_CU(cuMemGetAddressRange(&base, &size, p + off));
    CHECK(base == p && size == 1000); /* the requested size, not rounded */
  }
  CHECK_CU(cuMemGetAddressRange(&base, &size, p + 999));
  CHECK(base == p && size == 1000);
  CHECK_ERR(cuMemGetAddressRange(&base, &size, p + 1000), CUDA_ERROR_NOT_FOUND);
  CHECK_ERR(cuMemGetAddressRange(&base, &size, p + 4096), CUDA_ERROR_NOT_FOUND); /* inside the rounded mapping */
  base = 7;
  CHECK_CU(cuMemGetAddressRange(NULL, &size, p + 5));
  CHECK_CU(cuMemGetAddressRange(&base, NULL, p + 5));
  CHECK(base == p);
  CHECK_CU(cuMemGetAddressRange(NULL, NULL, p));
  CHECK_CU(cuMemAllocAsync(&q, 3 * MiB + 1, NULL));
  CHECK_CU(cuMemGetAddressRange(&base, &size, q + 3 * MiB));
  CHECK(base == q && size == 3 * MiB + 1);
  CHECK_ERR(cuMemGetAddressRange(&base, &size, q + 3 * MiB + 1), CUDA_ERROR_NOT_FOUND);
  CHECK_CU(cuMemFree(p));
  CHECK_ERR(cuMemGetAddressRange(&base, &size, p), CUDA_ERROR_NOT_FOUND);
  int host = 0;
  CHECK_ERR(cuMemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)&host), CUDA_ERROR_NOT_FOUND);
  CHECK_CU(cuMemFreeAsync(q, NULL));
  return 0;
}

/* ---------------- B. pointer attributes ---------------- */

static int pointer_attribute(void) {
  CUcontext ctx, c = NULL;
  CUdeviceptr p = 0, p2 = 0, dp = 0;
  unsigned u = 99;
  int i = 99;
  unsigned long long id = 0, id2 = 0, ull = 99;
  size_t sz = 0;
  void* vp = (void*)1;
  CUmemoryPool pool = (CUmemoryPool)1;
  RUN(setup(&ctx, 0));
  CHECK_CU(cuMemAlloc(&p, 5000));
  CUdeviceptr q = p + 100;
  CHECK_CU(cuPointerGetAttribute(&c, CU_POINTER_ATTRIBUTE_CONTEXT, q));
  CHECK(c == ctx);
  CHECK_CU(cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, q));
  CHECK(u == CU_MEMORYTYPE_DEVICE);
  CHECK_CU(cuPointerGetAttribute(&dp, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, q));
  CHECK(dp == q);
  CHECK_ERR(cuPointerGetAttribute(&vp, CU_POINTER_ATTRIBUTE_HOST_POINTER, q), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, q));
  CHECK(u == 0);
  CUDA_POINTER_ATTRIBUTE_P2P_TOKENS tok = {7, 7};
  CHECK_CU(cuPointerGetAttribute(&tok, CU_POINTER_ATTRIBUTE_P2P_TOKENS, q));
  CHECK(tok.p2pToken == 0 && tok.vaSpaceToken == 0xfe00);
  CHECK_CU(cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, q));
  CHECK(u == 1); /* the P2P query set it */
  CHECK_CU(cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, q));
  CHECK(id >= 1000);
  CHECK_CU(cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_IS_MANAGED, q));
  CHECK(u == 0);
  CHECK_CU(cuPointerGetAttribute(&i, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, q));
  CHECK(i == 0);
  CHECK_CU(cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, q));
  CHECK(u == 1);
  CHECK_CU(cuPointerGetAttribute(&dp, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, q));
  CHECK(dp == p);
  CHECK_CU(cuPointerGetAttribute(&sz, CU_POINTER_ATTRIBUTE_RANGE_SIZE, q));
  CHECK(sz == 5000);
  CHECK_CU(cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_MAPPED, q));
  CHECK(u == 1);
  CHECK_CU(cuPointerGetAttribute(&ull, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, q));
  CHECK(ull == 0);
  CHECK_CU(cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, q));
  CHECK(u == 1);
  CHECK_CU(cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, q));
  CHECK(u == 3);
  CHECK_CU(cuPointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, q));
  CHECK(pool == NULL);
  CHECK_CU(cuPointerGetAttribute(&sz, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, q));
  CHECK(sz == 2 * MiB);
  CHECK_CU(cuPointerGetAttribute(&vp, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, q));
  CHECK(vp == (void*)(uintptr_t)p);
  CHECK_CU(cuPointerGetAttribute(&ull, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, q));
  CHECK(ull >= 1000000 + 1000); /* the mapping's (shared: see suballocation) */
  CHECK_CU(cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE, q));
  CHECK(u == 0);
  CHECK_ERR(cuPointerGetAttribute(NULL, CU_POINTER_ATTRIBUTE_CONTEXT, q), CUDA_ERROR_INVALID_VALUE);
  CHECK_ERR(cuPointerGetAttribute(&ull, (CUpointer_attribute)0, q), CUDA_ERROR_INVALID_VALUE);
  CHECK_ERR(cuPointerGetAttribute(&ull, (CUpointer_attribute)22, q), CUDA_ERROR_INVALID_VALUE);
  /* One past the requested size: unknown. */
  u = 77;
  CHECK_ERR(cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p + 5000), CUDA_ERROR_INVALID_VALUE);
  CHECK(u == 77);
  /* Buffer ids are unique over the process's life, even at a reused address. */
  CHECK_CU(cuMemFree(p));
  for (int a = 1; a <= 21; ++a) {
    unsigned char sentinel[32];
    memset(sentinel, 0xab, sizeof sentinel);
    CHECK_ERR(cuPointerGetAttribute(sentinel, (CUpointer_attribute)a, q), CUDA_ERROR_INVALID_VALUE);
    for (size_t k = 0; k < sizeof sentinel; ++k) CHECK(sentinel[k] == 0xab);
  }
  CHECK_CU(cuMemAlloc(&p2, 5000));
  CHECK_CU(cuPointerGetAttribute(&id2, CU_POINTER_ATTRIBUTE_BUFFER_ID, p2));
  CHECK(id2 != id);
  CHECK_CU(cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p2));
  CHECK(u == 0);
  CHECK_CU(cuMemFree(p2));
  return 0;
}

/* Every attribute 1..21 but P2P_TOKENS, each in an 8-byte slot. */
enum { NATTR = 20 };
static void all_but_p2p(CUpointer_attribute* attrs, void** data, unsigned long long* slots) {
  int n = 0;
  for (int a = 1; a <= 21; ++a) {
    if (a == CU_POINTER_ATTRIBUTE_P2P_TOKENS) continue;
    attrs[n] = (CUpointer_attribute)a;
    slots[n] = 0xabababababababab;
    data[n] = &slots[n];
    n++;
  }
}
static int slot_index(int attr) { return attr < CU_POINTER_ATTRIBUTE_P2P_TOKENS ? attr - 1 : attr - 2; }
static unsigned long long slot_of(const unsigned long long* slots, int attr) { return slots[slot_index(attr)]; }
/* 4-byte attributes: the slot's first bytes, the rest left 0xab. */
static unsigned u32_of(const unsigned long long* slots, int attr) {
  unsigned v;
  memcpy(&v, &slots[slot_index(attr)], sizeof v);
  return v;
}
#define U32(attr) u32_of(slots, attr)
#define I32(attr) ((int)u32_of(slots, attr))

static int pointer_attributes(void) {
  CUcontext ctx;
  CUdeviceptr p = 0;
  CUpointer_attribute attrs[NATTR];
  void* data[NATTR];
  unsigned long long slots[NATTR];
  const unsigned long long untouched = 0xabababababababab;
  unsigned long long id = 0;
  RUN(setup(&ctx, 0));
  unsigned long long block = 0;
  CHECK_CU(cuMemAlloc(&p, 5000));
  CHECK_CU(cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p));
  CHECK_CU(cuPointerGetAttribute(&block, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, p));
  CUdeviceptr q = p + 64;
  all_but_p2p(attrs, data, slots);
  CHECK_CU(cuPointerGetAttributes(NATTR, attrs, data, q));
  CHECK(slot_of(slots, CU_POINTER_ATTRIBUTE_CONTEXT) == (unsigned long long)(uintptr_t)ctx);
  CHECK(U32(CU_POINTER_ATTRIBUTE_MEMORY_TYPE) == CU_MEMORYTYPE_DEVICE);
  CHECK(slot_of(slots, CU_POINTER_ATTRIBUTE_DEVICE_POINTER) == q);
  CHECK(slot_of(slots, CU_POINTER_ATTRIBUTE_HOST_POINTER) == 0); /* NULL, success */
  CHECK(U32(CU_POINTER_ATTRIBUTE_SYNC_MEMOPS) == 0);
  CHECK(slot_of(slots, CU_POINTER_ATTRIBUTE_BUFFER_ID) == id);
  CHECK(U32(CU_POINTER_ATTRIBUTE_IS_MANAGED) == 0);
  CHECK(I32(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) == 0);
  CHECK(U32(CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE) == 1);
  CHECK(slot_of(slots, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) == p);
  CHECK(slot_of(slots, CU_POINTER_ATTRIBUTE_RANGE_SIZE) == 5000);
  CHECK(U32(CU_POINTER_ATTRIBUTE_MAPPED) == 1);
  CHECK(slot_of(slots, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES) == 0);
  CHECK(U32(CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE) == 1);
  CHECK(U32(CU_POINTER_ATTRIBUTE_ACCESS_FLAGS) == 3);
  CHECK(slot_of(slots, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE) == 0);
  CHECK(slot_of(slots, CU_POINTER_ATTRIBUTE_MAPPING_SIZE) == 2 * MiB);
  CHECK(slot_of(slots, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR) == p);
  CHECK(slot_of(slots, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID) == block);
  CHECK(U32(CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE) == 0);

  /* P2P_TOKENS stops the call: earlier attributes written, later ones not. */
  CUcontext c = NULL;
  unsigned type = 77;
  CUDA_POINTER_ATTRIBUTE_P2P_TOKENS tok;
  CUpointer_attribute three[3] = {CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_P2P_TOKENS,
                                  CU_POINTER_ATTRIBUTE_MEMORY_TYPE};
  void* three_data[3] = {&c, &tok, &type};
  CHECK_ERR(cuPointerGetAttributes(3, three, three_data, q), CUDA_ERROR_INVALID_VALUE);
  CHECK(c == ctx && type == 77);

  /* A NULL data entry is skipped. */
  c = NULL;
  type = 77;
  void* skip_data[3] = {&c, NULL, &type};
  CUpointer_attribute skip[3] = {CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_P2P_TOKENS,
                                 CU_POINTER_ATTRIBUTE_MEMORY_TYPE};
  CHECK_CU(cuPointerGetAttributes(3, skip, skip_data, q));
  CHECK(c == ctx && type == CU_MEMORYTYPE_DEVICE);

  /* Freed memory: success with defaults; RANGE_* left unwritten. */
  CHECK_CU(cuMemFree(p));
  all_but_p2p(attrs, data, slots);
  CHECK_CU(cuPointerGetAttributes(NATTR, attrs, data, q));
  CHECK(slot_of(slots, CU_POINTER_ATTRIBUTE_CONTEXT) == 0);
  CHECK(U32(CU_POINTER_ATTRIBUTE_MEMORY_TYPE) == 0);
  CHECK(slot_of(slots, CU_POINTER_ATTRIBUTE_DEVICE_POINTER) == 0);
  CHECK(slot_of(slots, CU_POINTER_ATTRIBUTE_HOST_POINTER) == q);
  CHECK(U32(CU_POINTER_ATTRIBUTE_SYNC_MEMOPS) == 0);
  CHECK(slot_of(slots, CU_POINTER_ATTRIBUTE_BUFFER_ID) == 0);
  CHECK(U32(CU_POINTER_ATTRIBUTE_IS_MANAGED) == 0);
  CHECK(I32(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) == -2);
  CHECK(U32(CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE) == 0);
  CHECK(slot_of(slots, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) == untouched);
  CHECK(slot_of(slots, CU_POINTER_ATTRIBUTE_RANGE_SIZE) == untouched);
  CHECK(U32(CU_POINTER_ATTRIBUTE_MAPPED) == 0);
  CHECK(slot_of(slots, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES) == 0);
  CHECK(U32(CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE) == 0);
  CHECK(U32(CU_POINTER_ATTRIBUTE_ACCESS_FLAGS) == 0);
  CHECK(slot_of(slots, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE) == 0);
  CHECK(slot_of(slots, CU_POINTER_ATTRIBUTE_MAPPING_SIZE) == 0);
  CHECK(slot_of(slots, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR) == 0);
  CHECK(slot_of(slots, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID) == 0);
  CHECK(U32(CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE) == 0);
  c = ctx;
  three_data[0] = &c;
  CHECK_ERR(cuPointerGetAttributes(3, three, three_data, q), CUDA_ERROR_INVALID_VALUE);
  CHECK(c == NULL && type == CU_MEMORYTYPE_DEVICE);
  return 0;
}

static int pointer_set_attribute(void) {
  CUcontext ctx;
  CUdeviceptr p = 0;
  unsigned one = 1, zero = 0, u = 7;
  RUN(setup(&ctx, 0));
  CHECK_CU(cuMemAlloc(&p, 4096));
  CHECK_CU(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p + 8));
  CHECK_CU(cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p));
  CHECK(u == 1);
  CHECK_CU(cuPointerSetAttribute(&zero, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p));
  CHECK_CU(cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p));
  CHECK(u == 0);
  CHECK_ERR(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_CONTEXT, p), CUDA_ERROR_INVALID_VALUE);
  CHECK_ERR(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p), CUDA_ERROR_INVALID_VALUE);
  CHECK_ERR(cuPointerSetAttribute(NULL, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemFree(p));
  CHECK_ERR(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p), CUDA_ERROR_INVALID_VALUE);
  return 0;
}

/* ---------------- A + B for VM memory ---------------- */

static CUmemAllocationProp vm_prop(int device) {
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

static CUmemAccessDesc access_desc(int device, CUmemAccess_flags flags) {
  CUmemAccessDesc d;
  memset(&d, 0, sizeof d);
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = device;
  d.flags = flags;
  return d;
}

/* Physical memory of `size` on `device` mapped at `at`; the owner gets RW. */
static int vm_map_rw(CUdeviceptr at, size_t size, int device, CUmemGenericAllocationHandle* h) {
  CUmemAllocationProp prop = vm_prop(device);
  CHECK_CU(cuMemCreate(h, size, &prop, 0));
  CHECK_CU(cuMemMap(at, size, 0, *h, 0));
  CUmemAccessDesc d = access_desc(device, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  CHECK_CU(cuMemSetAccess(at, size, &d, 1));
  return 0;
}

static int vm_attributes(void) {
  CUcontext ctx, c = (CUcontext)1;
  CUdeviceptr r = 0, base = 0, dp = 0;
  CUmemGenericAllocationHandle h1, h2;
  size_t size = 0, sz = 0;
  unsigned u = 9;
  unsigned long long ull = 9, block1 = 0, block2 = 0, id1 = 0, id2 = 0;
  void* vp = NULL;
  RUN(setup(&ctx, 0));
  CHECK_CU(cuMemAddressReserve(&r, 8 * MiB, 0, 0, 0));
  RUN(vm_map_rw(r + 2 * MiB, 2 * MiB, 0, &h1));
  RUN(vm_map_rw(r + 4 * MiB, 2 * MiB, 0, &h2));
  CHECK_CU(cuMemsetD8(r + 2 * MiB, 0x11, 4 * MiB));
  CHECK_CU(cuMemGetAddressRange(&base, &size, r + 2 * MiB + 5));
  CHECK(base == r + 2 * MiB && size == 2 * MiB); /* the mapped chunk */
  CHECK_CU(cuMemGetAddressRange(&base, &size, r + 6 * MiB - 1));
  CHECK(base == r + 4 * MiB && size == 2 * MiB);
  CHECK_ERR(cuMemGetAddressRange(&base, &size, r), CUDA_ERROR_NOT_FOUND);
  CHECK_ERR(cuMemGetAddressRange(&base, &size, r + 6 * MiB), CUDA_ERROR_NOT_FOUND);
  CUdeviceptr q = r + 2 * MiB + 100;
  CHECK_CU(cuPointerGetAttribute(&c, CU_POINTER_ATTRIBUTE_CONTEXT, q));
  CHECK(c == NULL);
  CHECK_CU(cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, q));
  CHECK(u == CU_MEMORYTYPE_DEVICE);
  CHECK_CU(cuPointerGetAttribute(&dp, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, q));
  CHECK(dp == q);
  CHECK_CU(cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, q));
  CHECK(u == 0);
  CHECK_CU(cuPointerGetAttribute(&ull, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, q));
  CHECK(ull == 1);
  CHECK_CU(cuPointerGetAttribute(&dp, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, q));
  CHECK(dp == r); /* the whole reservation */
  CHECK_CU(cuPointerGetAttribute(&sz, CU_POINTER_ATTRIBUTE_RANGE_SIZE, q));
  CHECK(sz == 8 * MiB);
  CHECK_CU(cuPointerGetAttribute(&vp, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, q));
  CHECK(vp == (void*)(uintptr_t)(r + 2 * MiB));
  CHECK_CU(cuPointerGetAttribute(&sz, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, q));
  CHECK(sz == 2 * MiB);
  CHECK_CU(cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_MAPPED, q));
  CHECK(u == 1);
  CHECK_CU(cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, q));
  CHECK(u == 3);
  int ord = 9;
  CHECK_CU(cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, q));
  CHECK(ord == 0);
  CHECK_CU(cuPointerGetAttribute(&block1, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, q));
  CHECK_CU(cuPointerGetAttribute(&block2, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, r + 4 * MiB));
  CHECK(block1 != block2 && block1 > 1000000);
  CHECK_CU(cuPointerGetAttribute(&id1, CU_POINTER_ATTRIBUTE_BUFFER_ID, q));
  CHECK_CU(cuPointerGetAttribute(&id2, CU_POINTER_ATTRIBUTE_BUFFER_ID, r + 4 * MiB));
  CHECK(id1 != id2 && id1 >= 1000);
  CHECK_ERR(cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, r), CUDA_ERROR_INVALID_VALUE);
  CUipcMemHandle ipc;
  CHECK_ERR(cuIpcGetMemHandle(&ipc, q), CUDA_ERROR_INVALID_VALUE); /* VM memory has no legacy handle */
  /* Unmapped: gone. */
  CHECK_CU(cuMemUnmap(r + 2 * MiB, 2 * MiB));
  CHECK_ERR(cuMemGetAddressRange(&base, &size, q), CUDA_ERROR_NOT_FOUND);
  CHECK_ERR(cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, q), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemUnmap(r + 4 * MiB, 2 * MiB));
  CHECK_CU(cuMemRelease(h1));
  CHECK_CU(cuMemRelease(h2));
  CHECK_ERR(cuMemAddressFree(r, 4 * MiB), CUDA_ERROR_INVALID_VALUE); /* not the reservation's size */
  CHECK_CU(cuMemAddressFree(r, 8 * MiB));
  return 0;
}

/* ---------------- C. IPC ---------------- */

struct handle_view {
  uint64_t ctx, size, buffer_id;
  uint32_t pid, fd, pages, offset;
};

static struct handle_view view(const CUipcMemHandle* h) {
  struct handle_view v;
  memcpy(&v.ctx, h->reserved + 0, 8);
  memcpy(&v.pid, h->reserved + 8, 4);
  memcpy(&v.fd, h->reserved + 12, 4);
  memcpy(&v.size, h->reserved + 16, 8);
  memcpy(&v.pages, h->reserved + 24, 4);
  memcpy(&v.offset, h->reserved + 28, 4);
  memcpy(&v.buffer_id, h->reserved + 40, 8);
  return v;
}

/* What the shim does to describe a block inside a bigger allocation. */
static CUipcMemHandle patched(CUipcMemHandle h, uint32_t offset, uint64_t size) {
  memcpy(h.reserved + 28, &offset, 4);
  memcpy(h.reserved + 16, &size, 8);
  return h;
}

static void to_hex(const CUipcMemHandle* h, char* out) {
  for (int i = 0; i < CU_IPC_HANDLE_SIZE; ++i) sprintf(out + 2 * i, "%02x", (unsigned char)h->reserved[i]);
}

static int from_hex(const char* s, CUipcMemHandle* h) {
  if (strlen(s) != 2 * CU_IPC_HANDLE_SIZE) return 1;
  for (int i = 0; i < CU_IPC_HANDLE_SIZE; ++i) {
    unsigned v;
    if (sscanf(s + 2 * i, "%2x", &v) != 1) return 1;
    h->reserved[i] = (char)v;
  }
  return 0;
}

static int ipc_local(void) {
  CUcontext ctx;
  CUdeviceptr p = 0, q = 0, got = 0;
  CUipcMemHandle h, h2;
  const size_t n = 3 * MiB + 100;
  unsigned long long id = 0;
  RUN(setup(&ctx, 0));
  CHECK_CU(cuMemAlloc(&p, n));
  CHECK_CU(cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p));
  CHECK_CU(cuIpcGetMemHandle(&h, p));
  CHECK_CU(cuIpcGetMemHandle(&h2, p + 12345));
  CHECK(memcmp(&h, &h2, sizeof h) == 0); /* the whole allocation, whoever names it */
  struct handle_view v = view(&h);
  CHECK(v.ctx == (uint64_t)(uintptr_t)ctx);
  CHECK(v.pid == (uint32_t)getpid());
  CHECK(v.size == n);
  CHECK(v.pages == 4 * MiB / 4096);
  CHECK(v.offset == 0);
  CHECK(memcmp(h.reserved + 32, "fakeipc", 8) == 0);
  CHECK(v.buffer_id == id);
  for (int i = 48; i < 64; ++i) CHECK(h.reserved[i] == 0);
  CHECK(stats().ipc_get == 2);
  /* The exporter cannot open its own handle. */
  unsigned long refused = stats().ipc_open_refused;
  CHECK_ERR(cuIpcOpenMemHandle(&got, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_ERROR_INVALID_CONTEXT);
  CUipcMemHandle bad = h;
  bad.reserved[33] ^= 1;
  CHECK_ERR(cuIpcOpenMemHandle(&got, bad, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_ERROR_INVALID_VALUE);
  CHECK(stats().ipc_open_refused == refused + 2);
  CHECK(fake_cuda_live_imports() == 0);
  /* Unknown, interior-past-the-end and freed pointers; no context. */
  int host = 0;
  CHECK_ERR(cuIpcGetMemHandle(&h2, (CUdeviceptr)(uintptr_t)&host), CUDA_ERROR_INVALID_VALUE);
  CHECK_ERR(cuIpcGetMemHandle(&h2, p + n), CUDA_ERROR_INVALID_VALUE);
  CHECK_ERR(cuIpcGetMemHandle(NULL, p), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemAlloc(&q, 4096));
  CHECK_CU(cuMemFree(q));
  CHECK_ERR(cuIpcGetMemHandle(&h2, q), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuCtxSetCurrent(NULL));
  CHECK_ERR(cuIpcGetMemHandle(&h2, p), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_CU(cuCtxSetCurrent(ctx));
  CHECK_ERR(cuIpcCloseMemHandle(p), CUDA_ERROR_INVALID_VALUE);
  CHECK(stats().ipc_get == 2 && stats().ipc_close == 0);
  /* Both entry points of the open exist and behave alike. */
  typedef CUresult (*open_fn)(CUdeviceptr*, CUipcMemHandle, unsigned);
  open_fn plain = (open_fn)fake_cuda_lookup_raw("cuIpcOpenMemHandle");
  CHECK(plain != NULL && (void*)plain != fake_cuda_lookup_raw("cuIpcOpenMemHandle_v2"));
  CHECK_ERR(plain(&got, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_CU(cuMemFree(p));
  return 0;
}

/* Runs this program again, fresh, as `role` with the handles in hex. */
static int spawn(const char* role, const CUipcMemHandle* hs, int nh) {
  char hex[8][2 * CU_IPC_HANDLE_SIZE + 1];
  char* argv[12] = {"test_fake_driver", (char*)role};
  for (int i = 0; i < nh; ++i) {
    to_hex(&hs[i], hex[i]);
    argv[2 + i] = hex[i];
  }
  argv[2 + nh] = NULL;
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  int status = 0;
  CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  return 0;
}

enum { H_A, H_B, H_C, H_D, H_W, H_E, H_COUNT };

/* The exporter's 4 MiB allocation holds pattern(i); the importer opens
 * parts of it through patched handles, writes 0xEE into [1 MiB, +4 KiB)
 * and the exporter sees it. */
static int ipc_cross_process(void) {
  CUcontext ctx;
  CUdeviceptr p = 0, filler = 0;
  CUipcMemHandle w, hs[H_COUNT];
  RUN(setup(&ctx, 0));
  CHECK_CU(cuMemAlloc(&p, 4 * MiB));
  RUN(fill(p, 4 * MiB));
  CHECK_CU(cuIpcGetMemHandle(&w, p));
  hs[H_A] = patched(w, 0, MiB);
  hs[H_B] = patched(w, MiB, MiB);
  hs[H_C] = patched(w, 2 * MiB + 512, 8192); /* not page-aligned */
  hs[H_D] = patched(w, MiB / 2, MiB);        /* overlaps A and B */
  hs[H_W] = w;                               /* the whole allocation */
  hs[H_E] = patched(w, 3 * MiB, MiB + 4096); /* past the mapping */
  RUN(spawn("importer", hs, H_COUNT));
  RUN(holds(p, 0, 4 * MiB, MiB, 4096, 0xee));
  /* A handle of freed memory no longer opens, even with its fd number reused. */
  CHECK_CU(cuMemFree(p));
  CHECK_CU(cuMemAlloc(&filler, 4 * MiB));
  RUN(spawn("stale_importer", &w, 1));
  CHECK_CU(cuMemFree(filler));
  return 0;
}

static int importer(int argc, char** argv) {
  CUcontext ctx;
  CUipcMemHandle hs[H_COUNT];
  CUdeviceptr pa = 0, pa2 = 0, pb = 0, pc = 0, pd = 0, x = 0, base = 0;
  size_t size = 0;
  const unsigned flags = CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS;
  CHECK(argc == 2 + H_COUNT);
  for (int i = 0; i < H_COUNT; ++i) CHECK(from_hex(argv[2 + i], &hs[i]) == 0);
  RUN(setup(&ctx, 0));
  CHECK_CU(cuIpcOpenMemHandle(&pa, hs[H_A], flags));
  RUN(holds(pa, 0, MiB, 0, 0, 0));
  CHECK_CU(cuMemGetAddressRange(&base, &size, pa + 100));
  CHECK(base == pa && size == MiB);
  CUcontext c = NULL;
  CHECK_CU(cuPointerGetAttribute(&c, CU_POINTER_ATTRIBUTE_CONTEXT, pa));
  CHECK(c == ctx);
  CHECK_CU(cuIpcOpenMemHandle(&pb, hs[H_B], flags));
  RUN(holds(pb, MiB, MiB, 0, 0, 0));
  CHECK_CU(cuIpcOpenMemHandle(&pc, hs[H_C], flags));
  CHECK(pc % 4096 == 512);
  RUN(holds(pc, 2 * MiB + 512, 8192, 0, 0, 0));
  CHECK_CU(cuMemGetAddressRange(&base, &size, pc + 8191));
  CHECK(base == pc && size == 8192);
  CHECK_ERR(cuMemGetAddressRange(&base, &size, pc + 8192), CUDA_ERROR_NOT_FOUND);
  /* The same bytes again: the same pointer, one more reference. */
  CHECK_CU(cuIpcOpenMemHandle(&pa2, hs[H_A], flags));
  CHECK(pa2 == pa);
  CHECK(fake_cuda_live_imports() == 3);
  /* Overlapping an open part: refused. */
  CHECK_ERR(cuIpcOpenMemHandle(&x, hs[H_D], flags), CUDA_ERROR_ALREADY_MAPPED);
  CHECK_ERR(cuIpcOpenMemHandle(&x, hs[H_W], flags), CUDA_ERROR_ALREADY_MAPPED);
  CHECK_ERR(cuIpcOpenMemHandle(&x, hs[H_E], flags), CUDA_ERROR_INVALID_VALUE);
  /* Writes reach the exporter's memory. */
  CHECK_CU(cuMemsetD8(pb, 0xee, 4096));
  /* Closing one part leaves the others readable. */
  CHECK_CU(cuIpcCloseMemHandle(pb));
  CHECK(fake_cuda_live_imports() == 2);
  CHECK_ERR(cuMemGetAddressRange(&base, &size, pb), CUDA_ERROR_NOT_FOUND);
  RUN(holds(pa, 0, MiB, 0, 0, 0));
  RUN(holds(pc, 2 * MiB + 512, 8192, 0, 0, 0));
  CHECK_ERR(cuIpcOpenMemHandle(&x, hs[H_D], flags), CUDA_ERROR_ALREADY_MAPPED); /* A is still open */
  CHECK_CU(cuIpcCloseMemHandle(pa));
  RUN(holds(pa, 0, MiB, 0, 0, 0)); /* one reference left */
  CHECK_CU(cuIpcCloseMemHandle(pa));
  CHECK_ERR(cuIpcCloseMemHandle(pa), CUDA_ERROR_INVALID_VALUE);
  CHECK(fake_cuda_live_imports() == 1);
  /* Nothing open overlaps D any more (C starts at 2 MiB + 512). */
  CHECK_CU(cuIpcOpenMemHandle(&pd, hs[H_D], flags));
  RUN(holds(pd, MiB / 2, MiB, MiB, 4096, 0xee));
  CHECK_CU(cuIpcCloseMemHandle(pd));
  CHECK_CU(cuIpcCloseMemHandle(pc));
  CHECK(fake_cuda_live_imports() == 0);
  struct fake_cuda_stats_t s = stats();
  CHECK(s.ipc_open == 5 && s.ipc_close == 5 && s.ipc_open_refused == 4 && s.ipc_get == 0);
  return 0;
}

static int stale_importer(int argc, char** argv) {
  CUcontext ctx;
  CUipcMemHandle h;
  CUdeviceptr x = 0;
  CHECK(argc == 3 && from_hex(argv[2], &h) == 0);
  RUN(setup(&ctx, 0));
  CHECK_ERR(cuIpcOpenMemHandle(&x, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_ERROR_INVALID_VALUE);
  CHECK(fake_cuda_live_imports() == 0 && stats().ipc_open_refused == 1);
  return 0;
}

/* Small cuMemAllocs share a 2 MiB mapping, placed first fit at 512 B
 * granularity (measured on an H100: 512 B, 1 KiB, 1.5 KiB and 100 B land at
 * offsets 0, 0x200, 0x600 and 0xc00); the mapping attributes name it and the
 * IPC handles differ in the size and offset fields only. */
static int suballocation(void) {
  CUcontext ctx;
  static const size_t sizes[] = {512, 1024, 1536, 100};
  static const size_t at[] = {0, 0x200, 0x600, 0xc00};
  CUdeviceptr p[4], big = 0, again = 0, base = 0;
  CUipcMemHandle h[4];
  unsigned long long block[4], big_block = 0;
  size_t size = 0;
  RUN(setup(&ctx, 0));
  for (int i = 0; i < 4; ++i) {
    CHECK_CU(cuMemAlloc(&p[i], sizes[i]));
    CHECK(p[i] == p[0] + at[i]);
    CHECK_CU(cuMemGetAddressRange(&base, &size, p[i]));
    CHECK(base == p[i] && size == sizes[i]);
    CHECK_CU(cuPointerGetAttribute(&base, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, p[i]));
    CHECK(base == p[0]);
    CHECK_CU(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, p[i]));
    CHECK(size == 2 * MiB);
    CHECK_CU(cuPointerGetAttribute(&block[i], CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, p[i]));
    CHECK(block[i] == block[0]);
    CHECK_CU(cuIpcGetMemHandle(&h[i], p[i]));
    struct handle_view v = view(&h[i]);
    CHECK(v.size == sizes[i] && v.offset == at[i] && v.pages == 2 * MiB / 4096);
    for (int b = 0; b < CU_IPC_HANDLE_SIZE; ++b)
      if (b < 16 || (b >= 24 && b < 28) || b >= 32) CHECK(h[i].reserved[b] == h[0].reserved[b]);
  }
  /* 2 MiB gets a mapping of its own. */
  CHECK_CU(cuMemAlloc(&big, 2 * MiB));
  CHECK_CU(cuPointerGetAttribute(&base, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, big));
  CHECK_CU(cuPointerGetAttribute(&big_block, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, big));
  CHECK(base == big && big_block != block[0]);
  /* A freed place is reused at once. */
  CHECK_CU(cuMemFree(p[1]));
  CHECK_CU(cuMemAlloc(&again, 700));
  CHECK(again == p[1]);
  CHECK_CU(cuMemFree(again));
  for (int i = 0; i < 4; ++i)
    if (i != 1) CHECK_CU(cuMemFree(p[i]));
  CHECK_CU(cuMemFree(big));
  CHECK(stats().live_allocs == 0 && stats().live_bytes == 0);
  return 0;
}

/* FAKE_CUDA_SUBALLOC_MAX=0: every allocation has a mapping of its own. */
static int suballocation_off(void) {
  CUcontext ctx;
  CUdeviceptr p[2], base = 0;
  RUN(setup(&ctx, 0));
  for (int i = 0; i < 2; ++i) {
    CUipcMemHandle h;
    CHECK_CU(cuMemAlloc(&p[i], 512));
    CHECK_CU(cuPointerGetAttribute(&base, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, p[i]));
    CHECK(base == p[i]);
    CHECK_CU(cuIpcGetMemHandle(&h, p[i]));
    CHECK(view(&h).offset == 0);
  }
  CHECK(p[1] - p[0] >= 2 * MiB || p[0] - p[1] >= 2 * MiB);
  for (int i = 0; i < 2; ++i) CHECK_CU(cuMemFree(p[i]));
  return 0;
}

/* FAKE_CUDA_IPC_LAYOUT (offset_moved, size_moved): the handle of the second
 * allocation of a shared mapping carries its size and offset elsewhere, and
 * an importer (of the same layout) still maps exactly its bytes. */
static int ipc_moved_layout(void) {
  CUcontext ctx;
  CUdeviceptr first = 0, p = 0;
  CUipcMemHandle h;
  const char* layout = getenv("FAKE_CUDA_IPC_LAYOUT");
  CHECK(layout != NULL);
  RUN(setup(&ctx, 0));
  CHECK_CU(cuMemAlloc(&first, 512));
  CHECK_CU(cuMemAlloc(&p, 1000));
  CHECK(p == first + 512);
  RUN(fill(p, 1000));
  CHECK_CU(cuIpcGetMemHandle(&h, p));
  uint64_t at16 = 0, at48 = 0;
  uint32_t at28 = 0, at48_32 = 0;
  memcpy(&at16, h.reserved + 16, 8);
  memcpy(&at28, h.reserved + 28, 4);
  memcpy(&at48, h.reserved + 48, 8);
  memcpy(&at48_32, h.reserved + 48, 4);
  if (strcmp(layout, "offset_moved") == 0) CHECK(at16 == 1000 && at28 == 0 && at48_32 == 512);
  else CHECK(strcmp(layout, "size_moved") == 0 && at16 == 1024 && at28 == 512 && at48 == 1000);
  RUN(spawn("layout_importer", &h, 1));
  CHECK_CU(cuMemFree(p));
  CHECK_CU(cuMemFree(first));
  return 0;
}

static int layout_importer(int argc, char** argv) {
  CUcontext ctx;
  CUipcMemHandle h;
  CUdeviceptr x = 0, base = 0;
  size_t size = 0;
  CHECK(argc == 3 && from_hex(argv[2], &h) == 0);
  RUN(setup(&ctx, 0));
  CHECK_CU(cuIpcOpenMemHandle(&x, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  CHECK_CU(cuMemGetAddressRange(&base, &size, x));
  CHECK(base == x && size == 1000);
  RUN(holds(x, 0, 1000, 0, 0, 0));
  CHECK_CU(cuIpcCloseMemHandle(x));
  return 0;
}

/* ---------------- D. contexts ---------------- */

static int primary_context(void) {
  CUcontext c1, c2, cur = NULL;
  CUdeviceptr p = 0, q = 0;
  CUevent e, e2;
  CUstream s;
  CUdevice dev = -1;
  unsigned flags = 9;
  int active = 9;
  size_t f = 0, t = 0;
  CHECK_CU(cuInit(0));
  CHECK_CU(cuDevicePrimaryCtxGetState(0, &flags, &active));
  CHECK(flags == 0 && active == 0);
  CHECK_CU(cuDevicePrimaryCtxRetain(&c1, 0));
  CHECK_CU(cuDevicePrimaryCtxRetain(&c2, 0));
  CHECK(c1 == c2);
  CHECK_CU(cuDevicePrimaryCtxGetState(0, &flags, &active));
  CHECK(active == 1);
  unsigned long long id1 = 0, id2 = 0, id_cur = 0;
  CHECK_ERR(cuCtxGetId(NULL, &id_cur), CUDA_ERROR_INVALID_CONTEXT); /* none current */
  CHECK_CU(cuCtxGetId(c1, &id1));
  CHECK(id1 != 0);
  CHECK_CU(cuCtxSetCurrent(c1));
  CHECK_CU(cuCtxGetId(NULL, &id_cur)); /* NULL: the current context */
  CHECK(id_cur == id1);
  CHECK_ERR(cuCtxGetId(c1, NULL), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemAlloc(&p, MiB));
  CHECK_CU(cuEventCreate(&e, 0));
  CHECK_CU(cuStreamCreate(&s, 0));
  CHECK_ERR(cuCtxDestroy(c1), CUDA_ERROR_INVALID_CONTEXT); /* a primary context */
  CHECK_CU(cuDevicePrimaryCtxRelease(0));
  CHECK_CU(cuDevicePrimaryCtxGetState(0, &flags, &active));
  CHECK(active == 1 && stats().ctx_destroyed == 0);
  /* Reset destroys whatever the count. */
  CHECK(stats().live_allocs == 1);
  CHECK_CU(cuDevicePrimaryCtxReset(0));
  CHECK_CU(cuDevicePrimaryCtxGetState(0, &flags, &active));
  CHECK(active == 0);
  struct fake_cuda_stats_t st = stats();
  CHECK(st.ctx_destroyed == 1 && st.live_allocs == 0 && st.live_bytes == 0);
  CHECK_CU(cuCtxGetCurrent(&cur));
  CHECK(cur == c1); /* still current, as on the real driver */
  CHECK_ERR(cuCtxGetId(c1, &id2), CUDA_ERROR_CONTEXT_IS_DESTROYED); /* no id until retained again */
  CHECK_ERR(cuMemAlloc(&q, MiB), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CHECK_ERR(cuMemGetInfo(&f, &t), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CHECK_ERR(cuCtxGetDevice(&dev), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CHECK_ERR(cuCtxSynchronize(), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CHECK_ERR(cuEventCreate(&e2, 0), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CHECK(stats().dead_context_calls == 0); /* refusals the real driver makes cleanly */
  CHECK_ERR(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
  /* Objects of the destroyed context: refused and counted. */
  CHECK(cuEventRecord(e, NULL) != CUDA_SUCCESS);
  CHECK(cuEventQuery(e) != CUDA_SUCCESS);
  CHECK(cuEventSynchronize(e) != CUDA_SUCCESS);
  CHECK(cuEventDestroy(e) != CUDA_SUCCESS);
  CHECK(cuStreamDestroy(s) != CUDA_SUCCESS);
  CHECK(stats().dead_context_calls == 5);
  /* Retained again: the same handle, a new generation and a new id. */
  CHECK_CU(cuDevicePrimaryCtxRetain(&c2, 0));
  CHECK(c2 == c1);
  CHECK_CU(cuCtxGetId(c2, &id2));
  CHECK(id2 != 0 && id2 != id1);
  CHECK_CU(cuMemAlloc(&q, MiB));
  CHECK_CU(cuCtxGetDevice(&dev));
  CHECK(dev == 0);
  CHECK(cuEventQuery(e) != CUDA_SUCCESS); /* still of the old generation */
  CHECK(stats().dead_context_calls == 6);
  CHECK_CU(cuEventCreate(&e2, 0));
  CHECK_CU(cuEventRecord(e2, NULL));
  CHECK_CU(cuEventQuery(e2));
  CHECK_CU(cuEventDestroy(e2));
  /* The last release destroys it; one more is refused. */
  CHECK_CU(cuDevicePrimaryCtxRelease(0));
  CHECK_CU(cuDevicePrimaryCtxGetState(0, &flags, &active));
  CHECK(active == 0 && stats().ctx_destroyed == 2 && stats().live_allocs == 0);
  CHECK_ERR(cuCtxGetId(c1, &id_cur), CUDA_ERROR_CONTEXT_IS_DESTROYED); /* the last release ends it too */
  CHECK_ERR(cuDevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_CU(cuDevicePrimaryCtxReset(0)); /* inactive: nothing to destroy */
  CHECK(stats().ctx_destroyed == 2);
  CHECK_ERR(cuDevicePrimaryCtxRetain(&c2, 1), CUDA_ERROR_INVALID_DEVICE);
  /* The unversioned entry points behave alike. */
  typedef CUresult (*dev_fn)(CUdevice);
  dev_fn release_v1 = (dev_fn)fake_cuda_lookup_raw("cuDevicePrimaryCtxRelease");
  dev_fn reset_v1 = (dev_fn)fake_cuda_lookup_raw("cuDevicePrimaryCtxReset");
  CHECK(release_v1 != NULL && reset_v1 != NULL);
  CHECK_CU(cuDevicePrimaryCtxRetain(&c2, 0));
  CHECK_CU(cuDevicePrimaryCtxRetain(&c2, 0));
  CHECK_CU(release_v1(0));
  CHECK_CU(cuDevicePrimaryCtxGetState(0, &flags, &active));
  CHECK(active == 1);
  CHECK_CU(reset_v1(0));
  CHECK_CU(cuDevicePrimaryCtxGetState(0, &flags, &active));
  CHECK(active == 0 && stats().ctx_destroyed == 3);
  return 0;
}

static int ctx_destroy(void) {
  CUcontext c1, c2, c3, cur = (CUcontext)1;
  CUdeviceptr p = 0, q = 0, r = 0, res = 0, base = 0;
  CUmemGenericAllocationHandle h;
  CUevent e, e2;
  CUstream s, s2;
  size_t size = 0;
  CHECK_CU(cuInit(0));
  CHECK_CU(cuCtxCreate(&c1, NULL, 0, 0));
  CHECK_CU(cuMemAlloc(&p, MiB));
  CHECK_CU(cuMemAllocAsync(&q, 5000, NULL));
  CHECK_CU(cuEventCreate(&e, 0));
  CHECK_CU(cuStreamCreate(&s, 0));
  CHECK_CU(cuMemAddressReserve(&res, 4 * MiB, 0, 0, 0));
  RUN(vm_map_rw(res, 2 * MiB, 0, &h));
  CHECK(fake_cuda_vm_access(res, 0) == 3);
  CHECK_CU(cuCtxCreate(&c2, NULL, 0, 0)); /* now current */
  CHECK_CU(cuMemAlloc(&r, MiB));
  CHECK_CU(cuEventCreate(&e2, 0));
  CHECK_CU(cuStreamCreate(&s2, 0));
  CHECK(stats().live_allocs == 3);
  unsigned long long id1 = 0, id2 = 0;
  CHECK_CU(cuCtxGetId(c1, &id1));
  CHECK_CU(cuCtxGetId(c2, &id2));
  CHECK(id1 != 0 && id2 != 0 && id1 != id2); /* one id per context */
  CHECK_CU(cuCtxDestroy(c1));
  struct fake_cuda_stats_t st = stats();
  CHECK(st.ctx_destroyed == 1 && st.live_allocs == 1);
  CHECK_ERR(cuCtxGetId(c1, &id1), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CHECK(stats().dead_context_calls == 0); /* asking a handle for its id touches nothing of the context */
  CHECK_ERR(cuMemGetAddressRange(&base, &size, p), CUDA_ERROR_NOT_FOUND);
  /* cuMemCreate memory and reservations outlive the context (cuda.h;
   * measured on an H100): still mapped, and released explicitly below. */
  CHECK_CU(cuMemGetAddressRange(&base, &size, res));
  CHECK(fake_cuda_vm_access(res, 0) == 3);
  CHECK_CU(cuMemGetAddressRange(&base, &size, r));
  CHECK_ERR(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
  CHECK_ERR(cuMemFreeAsync(q, NULL), CUDA_ERROR_INVALID_VALUE);
  CHECK(stats().dead_context_calls == 0);
  /* Each call on the dead context's objects is refused and counted. */
  CHECK(cuEventRecord(e, NULL) != CUDA_SUCCESS);
  CHECK(cuEventQuery(e) != CUDA_SUCCESS);
  CHECK(cuEventSynchronize(e) != CUDA_SUCCESS);
  CHECK(cuEventDestroy(e) != CUDA_SUCCESS);
  CHECK(cuStreamDestroy(s) != CUDA_SUCCESS);
  CUmemAccessDesc d = access_desc(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  CHECK_CU(cuMemSetAccess(res, 2 * MiB, &d, 1));
  CHECK_CU(cuMemUnmap(res, 2 * MiB));
  CHECK_CU(cuMemRelease(h));
  CHECK_CU(cuMemAddressFree(res, 4 * MiB));
  CHECK(cuCtxDestroy(c1) != CUDA_SUCCESS); /* destroyed twice */
  CHECK(stats().dead_context_calls == 6);
  /* A live event recorded on the dead context's stream. */
  CHECK(cuEventRecord(e2, s) != CUDA_SUCCESS);
  CHECK(stats().dead_context_calls == 7 && stats().record_on_dead_stream == 1);
  /* c2's objects are untouched. */
  CHECK_CU(cuEventRecord(e2, s2));
  CHECK_CU(cuEventQuery(e2));
  CHECK_CU(cuStreamDestroy(s2));
  CHECK_CU(cuEventDestroy(e2));
  /* The dead context made current again: refusals. */
  CHECK_CU(cuCtxSetCurrent(c1));
  CHECK_ERR(cuMemAlloc(&p, 4096), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CHECK_ERR(cuCtxSynchronize(), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  /* Destroying the current context pops it from this thread. */
  CHECK_CU(cuCtxCreate(&c3, NULL, 0, 0));
  CHECK_CU(cuCtxDestroy(c3));
  CHECK_CU(cuCtxGetCurrent(&cur));
  CHECK(cur == NULL);
  CHECK(stats().ctx_destroyed == 2);
  CHECK_CU(cuCtxSetCurrent(c2));
  CHECK_CU(cuMemFree(r));
  CHECK_CU(cuCtxDestroy(c2));
  return 0;
}

/* ---------------- E. peer access, peer copies, VM access ---------------- */

static int peer_access(void) {
  CUcontext c0, c1, c0b, cur;
  CUdeviceptr a = 0, b = 0;
  RUN(setup(&c1, 1));
  RUN(setup(&c0, 0));
  CHECK_CU(cuCtxEnablePeerAccess(c1, 0));
  CHECK_ERR(cuCtxEnablePeerAccess(c1, 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
  CHECK_ERR(cuCtxEnablePeerAccess(c0, 0), CUDA_ERROR_INVALID_DEVICE);
  CHECK_ERR(cuCtxEnablePeerAccess(c1, 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuCtxDisablePeerAccess(c1));
  CHECK_ERR(cuCtxDisablePeerAccess(c1), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
  CHECK(stats().peer_enable == 1 && stats().peer_disable == 1);
  /* Another context of the same device is no peer. */
  CHECK_CU(cuCtxCreate(&c0b, NULL, 0, 0));
  CHECK_CU(cuCtxSetCurrent(c0));
  CHECK_ERR(cuCtxEnablePeerAccess(c0b, 0), CUDA_ERROR_INVALID_DEVICE);
  /* Access is per direction. */
  CHECK_CU(cuCtxEnablePeerAccess(c1, 0));
  CHECK_CU(cuCtxSetCurrent(c1));
  CHECK_ERR(cuCtxDisablePeerAccess(c0), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
  CHECK_CU(cuCtxEnablePeerAccess(c0, 0));
  /* A reset peer loses its grants; no current context is refused. */
  CHECK_CU(cuDevicePrimaryCtxReset(1));
  CHECK_CU(cuCtxSetCurrent(c0));
  CHECK_ERR(cuCtxEnablePeerAccess(c1, 0), CUDA_ERROR_INVALID_CONTEXT); /* c1 is inactive */
  CHECK_CU(cuDevicePrimaryCtxRetain(&cur, 1));
  CHECK(cur == c1);
  CHECK_ERR(cuCtxDisablePeerAccess(c1), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
  CHECK_CU(cuCtxEnablePeerAccess(c1, 0));
  CHECK_CU(cuCtxSetCurrent(NULL));
  CHECK_ERR(cuCtxEnablePeerAccess(c1, 0), CUDA_ERROR_INVALID_CONTEXT);
  CHECK(stats().peer_enable == 4 && stats().peer_disable == 1);
  /* Peer copies and 32-bit memsets. */
  CHECK_CU(cuCtxSetCurrent(c0));
  CHECK_CU(cuMemAlloc(&a, 4096));
  CHECK_CU(cuCtxSetCurrent(c1));
  CHECK_CU(cuMemAlloc(&b, 4096));
  CHECK_CU(cuMemsetD32(a, 0xdeadbeef, 1024));
  CHECK_CU(cuMemsetD8(b, 0, 4096));
  CHECK_CU(cuMemcpyPeer(b + 4, c1, a, c0, 8));
  uint32_t w[4];
  CHECK_CU(cuMemcpyDtoH(w, b, sizeof w));
  CHECK(w[0] == 0 && w[1] == 0xdeadbeef && w[2] == 0xdeadbeef && w[3] == 0);
  CHECK_ERR(cuMemsetD32(a + 1, 0, 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemFree(a));
  CHECK_CU(cuMemFree(b));
  return 0;
}

/* Touches p in a child; returns its fate: 0 fine, else the signal. */
static int touch_in_child(CUdeviceptr p) {
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    *(volatile unsigned char*)(uintptr_t)p = 1;
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status);
}

static int vm_access(void) {
  CUcontext ctx;
  CUdeviceptr r = 0, p = 0;
  CUmemGenericAllocationHandle h;
  RUN(setup(&ctx, 0));
  CHECK_CU(cuMemAddressReserve(&r, 6 * MiB, 0, 0, 0));
  CUmemAllocationProp prop = vm_prop(0);
  CHECK_CU(cuMemCreate(&h, 4 * MiB, &prop, 0));
  CHECK_CU(cuMemMap(r, 4 * MiB, 0, h, 0));
  CHECK_ERR(cuMemMap(r, 4 * MiB, 0, h, 0), CUDA_ERROR_INVALID_VALUE); /* already mapped there */
  CHECK(fake_cuda_vm_access(r, 0) == 0); /* no access until granted */
  CUmemAccessDesc two[2] = {access_desc(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
                            access_desc(1, CU_MEM_ACCESS_FLAGS_PROT_READ)};
  CHECK_CU(cuMemSetAccess(r, 4 * MiB, two, 2));
  CHECK(fake_cuda_vm_access(r, 0) == 3);
  CHECK(fake_cuda_vm_access(r + 3 * MiB, 1) == 1);
  CHECK(fake_cuda_vm_access(r, 2) == 0);
  CHECK(stats().set_access_peer == 1);
  CHECK_CU(cuMemsetD8(r, 0x42, 4 * MiB)); /* the owner's read/write reaches the host */
  /* Revoking one device on part of the range. */
  CUmemAccessDesc revoke = access_desc(1, CU_MEM_ACCESS_FLAGS_PROT_NONE);
  CHECK_CU(cuMemSetAccess(r + 2 * MiB, 2 * MiB, &revoke, 1));
  CHECK(fake_cuda_vm_access(r + 2 * MiB, 1) == 0);
  CHECK(fake_cuda_vm_access(r, 1) == 1);
  CHECK(fake_cuda_vm_access(r + 2 * MiB, 0) == 3);
  CHECK(stats().set_access_peer == 2);
  unsigned u = 0;
  CHECK_CU(cuPointerGetAttribute(&u, CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, r));
  CHECK(u == 3);
  /* Bad descriptors and unmapped ranges are refused, changing nothing. */
  CUmemAccessDesc bad = access_desc(3, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  CHECK_ERR(cuMemSetAccess(r, 2 * MiB, &bad, 1), CUDA_ERROR_INVALID_DEVICE);
  CHECK_ERR(cuMemSetAccess(r + 4 * MiB, 2 * MiB, two, 1), CUDA_ERROR_INVALID_VALUE);
  CHECK_ERR(cuMemSetAccess(r + 2 * MiB, 4 * MiB, two, 1), CUDA_ERROR_INVALID_VALUE);
  CHECK(stats().set_access_peer == 2);
  /* Not VM-mapped: -1. */
  CHECK(fake_cuda_vm_access(r + 4 * MiB, 0) == -1);
  CHECK_CU(cuMemAlloc(&p, 4096));
  CHECK(fake_cuda_vm_access(p, 0) == -1);
  CHECK_CU(cuMemFree(p));
  /* The owner revoked: the host loses access too. */
  CUmemAccessDesc owner_none = access_desc(0, CU_MEM_ACCESS_FLAGS_PROT_NONE);
  CHECK_CU(cuMemSetAccess(r + 2 * MiB, 2 * MiB, &owner_none, 1));
  CHECK(touch_in_child(r + 2 * MiB) == SIGSEGV);
  CHECK(touch_in_child(r) == 0);
  /* Part of a mapping cannot be unmapped; unmapping forgets the access. */
  CHECK_ERR(cuMemUnmap(r, 2 * MiB), CUDA_ERROR_INVALID_VALUE);
  CHECK_ERR(cuMemUnmap(r + 4 * MiB, 2 * MiB), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemUnmap(r, 4 * MiB));
  CHECK(fake_cuda_vm_access(r, 0) == -1);
  CHECK_CU(cuMemMap(r, 4 * MiB, 0, h, 0));
  CHECK(fake_cuda_vm_access(r, 0) == 0 && fake_cuda_vm_access(r, 1) == 0);
  CHECK_CU(cuMemUnmap(r, 4 * MiB));
  CHECK_CU(cuMemRelease(h));
  CHECK_ERR(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(cuMemAddressFree(r, 6 * MiB));
  struct fake_cuda_stats_t st = stats();
  CHECK(st.vm_map == 2 && st.vm_unmap == 2 && st.dead_context_calls == 0);
  return 0;
}

/* ---------------- cuGetProcAddress ---------------- */

static int proc_address(void) {
  static const struct { const char* base; int version; const char* impl; } rows[] = {
    {"cuMemGetAddressRange", 3020, "cuMemGetAddressRange_v2"},
    {"cuMemGetAddressRange", 3010, NULL},
    {"cuPointerGetAttribute", 4000, "cuPointerGetAttribute"},
    {"cuPointerGetAttributes", 7000, "cuPointerGetAttributes"},
    {"cuPointerGetAttributes", 6050, NULL},
    {"cuPointerSetAttribute", 6000, "cuPointerSetAttribute"},
    {"cuIpcGetMemHandle", 4010, "cuIpcGetMemHandle"},
    {"cuIpcOpenMemHandle", 13000, "cuIpcOpenMemHandle_v2"},
    {"cuIpcOpenMemHandle", 11000, "cuIpcOpenMemHandle_v2"},
    {"cuIpcOpenMemHandle", 10020, "cuIpcOpenMemHandle"},
    {"cuIpcOpenMemHandle", 4000, NULL},
    {"cuIpcCloseMemHandle", 4010, "cuIpcCloseMemHandle"},
    {"cuCtxDestroy", 4000, "cuCtxDestroy_v2"},
    {"cuDevicePrimaryCtxReset", 11000, "cuDevicePrimaryCtxReset_v2"},
    {"cuDevicePrimaryCtxReset", 7000, "cuDevicePrimaryCtxReset"},
    {"cuDevicePrimaryCtxRelease", 12000, "cuDevicePrimaryCtxRelease_v2"},
    {"cuDevicePrimaryCtxRelease", 7000, "cuDevicePrimaryCtxRelease"},
    {"cuDevicePrimaryCtxGetState", 7000, "cuDevicePrimaryCtxGetState"},
    {"cuCtxEnablePeerAccess", 4000, "cuCtxEnablePeerAccess"},
    {"cuCtxDisablePeerAccess", 4000, "cuCtxDisablePeerAccess"},
    {"cuMemGetAllocationGranularity", 10020, "cuMemGetAllocationGranularity"},
    {"cuMemAddressReserve", 10020, "cuMemAddressReserve"},
    {"cuMemAddressFree", 10020, "cuMemAddressFree"},
    {"cuMemCreate", 10020, "cuMemCreate"},
    {"cuMemRelease", 10020, "cuMemRelease"},
    {"cuMemMap", 10020, "cuMemMap"},
    {"cuMemUnmap", 10020, "cuMemUnmap"},
    {"cuMemSetAccess", 10020, "cuMemSetAccess"},
    {"cuMemSetAccess", 10010, NULL},
    {"cuMemcpyPeer", 4000, "cuMemcpyPeer"},
    {"cuMemsetD32", 3020, "cuMemsetD32_v2"},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; ++i) {
    void* fn = (void*)1;
    CUdriverProcAddressQueryResult status;
    CUresult r = cuGetProcAddress_v2(rows[i].base, &fn, rows[i].version, CU_GET_PROC_ADDRESS_DEFAULT, &status);
    if (rows[i].impl == NULL) {
      CHECK(r == CUDA_ERROR_NOT_FOUND && fn == NULL && status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
      continue;
    }
    void* want = fake_cuda_lookup_raw(rows[i].impl);
    if (r != CUDA_SUCCESS || fn != want || want == NULL)
      fprintf(stderr, "[%s] %s at %d: not %s\n", g_case, rows[i].base, rows[i].version, rows[i].impl);
    CHECK(r == CUDA_SUCCESS && fn == want && want != NULL);
  }
  return 0;
}

/* ---------------- fault injection and leak counters ---------------- */

/* One call of each fault point, on objects made beforehand. */
struct fault_objects {
  CUstream s;
  CUevent e;
  CUdeviceptr va;                 /* a 4 MiB reservation */
  CUmemGenericAllocationHandle h; /* 2 MiB, unmapped */
  CUdeviceptr mapped;             /* va + 2 MiB: 2 MiB mapped, read/write */
  CUmemGenericAllocationHandle mapped_h;
};
static struct fault_objects g_fo;

static CUresult call_point(const char* name) {
  static CUdeviceptr p;
  static CUevent e;
  static CUstream s;
  static CUmemGenericAllocationHandle h;
  CUmemAllocationProp prop = vm_prop(0);
  CUresult r;
  if (strcmp(name, "cuMemAlloc_v2") == 0) {
    r = cuMemAlloc(&p, MiB);
    if (r == CUDA_SUCCESS) cuMemFree(p);
  } else if (strcmp(name, "cuMemAllocAsync") == 0) {
    r = cuMemAllocAsync(&p, MiB, NULL);
    if (r == CUDA_SUCCESS) cuMemFreeAsync(p, NULL);
  } else if (strcmp(name, "cuEventCreate") == 0) {
    r = cuEventCreate(&e, 0);
    if (r == CUDA_SUCCESS) cuEventDestroy(e);
  } else if (strcmp(name, "cuEventRecord") == 0) {
    r = cuEventRecord(g_fo.e, g_fo.s);
  } else if (strcmp(name, "cuEventQuery") == 0) {
    r = cuEventQuery(g_fo.e);
  } else if (strcmp(name, "cuEventSynchronize") == 0) {
    r = cuEventSynchronize(g_fo.e);
  } else if (strcmp(name, "cuCtxSynchronize") == 0) {
    r = cuCtxSynchronize();
  } else if (strcmp(name, "cuStreamCreate") == 0) {
    r = cuStreamCreate(&s, 0);
    if (r == CUDA_SUCCESS) cuStreamDestroy(s);
  } else if (strcmp(name, "cuStreamQuery") == 0) {
    r = cuStreamQuery(g_fo.s);
  } else if (strcmp(name, "cuMemCreate") == 0) {
    r = cuMemCreate(&h, 2 * MiB, &prop, 0);
    if (r == CUDA_SUCCESS) cuMemRelease(h);
  } else if (strcmp(name, "cuMemMap") == 0) {
    r = cuMemMap(g_fo.va, 2 * MiB, 0, g_fo.h, 0);
    if (r == CUDA_SUCCESS) cuMemUnmap(g_fo.va, 2 * MiB);
  } else if (strcmp(name, "cuMemSetAccess") == 0) {
    /* Flips the owner's access of the mapped granule; a failed call changes nothing. */
    const int was = fake_cuda_vm_access(g_fo.mapped, 0);
    const CUmemAccessDesc flip = access_desc(0, was == 3 ? CU_MEM_ACCESS_FLAGS_PROT_READ : CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    r = cuMemSetAccess(g_fo.mapped, 2 * MiB, &flip, 1);
    if (fake_cuda_vm_access(g_fo.mapped, 0) != (r == CUDA_SUCCESS ? (int)flip.flags : was)) return CUDA_ERROR_ILLEGAL_STATE;
  } else if (strcmp(name, "cuMemAddressReserve") == 0) {
    r = cuMemAddressReserve(&p, 2 * MiB, 0, 0, 0);
    if (r == CUDA_SUCCESS) cuMemAddressFree(p, 2 * MiB);
  } else {
    r = CUDA_ERROR_ILLEGAL_STATE;
  }
  return r;
}

static const char* const fault_points[] = {
  "cuMemAlloc_v2", "cuMemAllocAsync", "cuEventCreate", "cuEventRecord", "cuEventQuery",
  "cuEventSynchronize", "cuCtxSynchronize", "cuStreamCreate", "cuStreamQuery", "cuMemCreate",
  "cuMemMap", "cuMemSetAccess", "cuMemAddressReserve",
};
#define NPOINTS (sizeof fault_points / sizeof fault_points[0])

/* The counters of two snapshots match, failures_injected aside. */
static int same_but_injected(struct fake_cuda_stats_t a, struct fake_cuda_stats_t b) {
  a.failures_injected = b.failures_injected = 0;
  return memcmp(&a, &b, sizeof a) == 0;
}

/* Chosen failures: the after+1-th call and count-1 more fail with the
 * error asked for, change nothing, and the next call works; count < 0 lasts
 * until reset; CUDA_SUCCESS picks the entry point's own error. */
static int faults(void) {
  CUcontext ctx;
  RUN(setup(&ctx, 0));
  CUmemAllocationProp prop = vm_prop(0);
  CHECK_CU(cuStreamCreate(&g_fo.s, 0));
  CHECK_CU(cuEventCreate(&g_fo.e, 0));
  CHECK_CU(cuMemAddressReserve(&g_fo.va, 4 * MiB, 0, 0, 0));
  CHECK_CU(cuMemCreate(&g_fo.h, 2 * MiB, &prop, 0));
  g_fo.mapped = g_fo.va + 2 * MiB;
  RUN(vm_map_rw(g_fo.mapped, 2 * MiB, 0, &g_fo.mapped_h));
  for (size_t i = 0; i < NPOINTS; ++i) {
    const char* name = fault_points[i];
    g_case = name;
    const CUresult err = (CUresult)(700 + i);
    unsigned long before_err = fake_cuda_injected(err);
    fake_cuda_fail(name, 1, 2, err);
    CHECK_CU(call_point(name)); /* `after` calls go through */
    for (int k = 0; k < 2; ++k) {
      struct fake_cuda_stats_t before = stats();
      CHECK_ERR(call_point(name), err);
      struct fake_cuda_stats_t after = stats();
      CHECK(same_but_injected(before, after) && after.failures_injected == before.failures_injected + 1);
    }
    CHECK_CU(call_point(name));
    CHECK(fake_cuda_injected(err) == before_err + 2);
    /* Until reset. */
    fake_cuda_fail(name, 0, -1, err);
    for (int k = 0; k < 5; ++k) CHECK_ERR(call_point(name), err);
    fake_cuda_fail_reset();
    CHECK_CU(call_point(name));
    /* The entry point's own error. */
    fake_cuda_fail(name, 0, 1, CUDA_SUCCESS);
    CUresult own = call_point(name);
    CHECK(own == CUDA_ERROR_OUT_OF_MEMORY || own == CUDA_ERROR_UNKNOWN);
    CHECK_CU(call_point(name));
    /* count 0 disarms. */
    fake_cuda_fail(name, 0, -1, err);
    fake_cuda_fail(name, 0, 0, err);
    CHECK_CU(call_point(name));
  }
  g_case = "faults";
  /* A _ptsz variant counts as its base name. */
  typedef CUresult (*record_fn)(CUevent, CUstream);
  record_fn record_ptsz = (record_fn)fake_cuda_lookup_raw("cuEventRecord_ptsz");
  CHECK(record_ptsz != NULL);
  fake_cuda_fail("cuEventRecord", 0, 1, CUDA_ERROR_UNKNOWN);
  CHECK_ERR(record_ptsz(g_fo.e, NULL), CUDA_ERROR_UNKNOWN);
  CHECK_CU(record_ptsz(g_fo.e, NULL));
  /* Random mode: reproducible per seed, about the probability asked for. */
  char pattern[2][200];
  for (int run = 0; run < 2; ++run) {
    CHECK(fake_cuda_fail_random("7:300:cuEventQuery,cuStreamQuery") == 0);
    int failed = 0;
    for (int k = 0; k < 200; ++k) {
      CUresult r = cuEventQuery(g_fo.e);
      CHECK(r == CUDA_SUCCESS || r == CUDA_ERROR_UNKNOWN);
      pattern[run][k] = r != CUDA_SUCCESS;
      failed += r != CUDA_SUCCESS;
      (void)cuStreamQuery(g_fo.s); /* other entry points do not shift the pattern */
      if (run == 1) (void)cuStreamQuery(g_fo.s);
    }
    CHECK(failed > 30 && failed < 90);
  }
  CHECK(memcmp(pattern[0], pattern[1], sizeof pattern[0]) == 0);
  CHECK(fake_cuda_fail_random("8:300:cuEventQuery") == 0);
  int differs = 0;
  for (int k = 0; k < 200; ++k) differs += (cuEventQuery(g_fo.e) != CUDA_SUCCESS) != pattern[0][k];
  CHECK(differs > 0);
  CHECK(fake_cuda_fail_random("1:1000:cuMemAlloc_v2:719") == 0);
  CHECK_ERR(call_point("cuMemAlloc_v2"), CUDA_ERROR_LAUNCH_FAILED);
  CHECK_CU(call_point("cuEventCreate")); /* not listed */
  CHECK(fake_cuda_fail_random("1:0:cuMemAlloc_v2") == 0);
  CHECK_CU(call_point("cuMemAlloc_v2"));
  CHECK(fake_cuda_fail_random("1:1000:cuMemAlloc_v2") == 0);
  CHECK(fake_cuda_fail_random(NULL) == 0); /* disarms */
  CHECK_CU(call_point("cuMemAlloc_v2"));
  static const char* const malformed[] = {"", "x:1:cuEventQuery", "1:1001:cuEventQuery", "1:10:cuBogus",
                                          "1:10:cuEventQuery:abc", "1:10", "1:10:cuEventQuery,", "1:10:cuEventQuery:0"};
  CHECK(fake_cuda_fail_random("1:1000:cuEventQuery") == 0);
  for (size_t i = 1; i < sizeof malformed / sizeof malformed[0]; ++i) CHECK(fake_cuda_fail_random(malformed[i]) == -1);
  CHECK_ERR(cuEventQuery(g_fo.e), CUDA_ERROR_UNKNOWN); /* a malformed spec changed nothing */
  fake_cuda_fail_reset();
  CHECK_CU(cuEventQuery(g_fo.e));
  return 0;
}

/* FAKE_CUDA_FAIL_RANDOM=3:1000:cuStreamQuery,cuEventCreate:2 (meson):
 * armed from the start, stopped by reset. */
static int faults_env(void) {
  CUcontext ctx;
  CUstream s;
  CUevent e;
  RUN(setup(&ctx, 0));
  CHECK_ERR(cuStreamQuery(NULL), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_ERR(cuEventCreate(&e, 0), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_CU(cuStreamCreate(&s, 0));
  CHECK(stats().failures_injected == 2 && fake_cuda_injected(CUDA_ERROR_OUT_OF_MEMORY) == 2);
  fake_cuda_fail_reset();
  CHECK_CU(cuStreamQuery(s));
  CHECK_CU(cuEventCreate(&e, 0));
  CHECK_CU(cuEventDestroy(e));
  CHECK_CU(cuStreamDestroy(s));
  return 0;
}

/* cuStreamQuery, and what the fake still holds. */
static int live_counters(void) {
  CUcontext ctx, c2;
  CUstream s, s2;
  CUevent e, e2;
  RUN(setup(&ctx, 0));
  struct fake_cuda_stats_t st = stats();
  CHECK(st.live_events == 0 && st.live_streams == 0 && st.live_vm_handles == 0 && st.live_reservations == 0 &&
        st.live_mappings == 0 && st.failures_injected == 0);
  CHECK_CU(cuStreamCreate(&s, 0));
  CHECK_CU(cuEventCreate(&e, 0));
  CHECK(stats().live_events == 1 && stats().live_streams == 1);
  /* Busy while held, or while a held stream it is ordered after is. */
  CHECK_CU(cuStreamQuery(s));
  fake_cuda_hold_stream(s, 1);
  CHECK_ERR(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
  CHECK_ERR(cuStreamQuery(NULL), CUDA_ERROR_NOT_READY); /* the legacy stream waits for s */
  fake_cuda_hold_stream(s, 0);
  CHECK_CU(cuStreamQuery(s));
  CHECK_CU(cuStreamQuery(CU_STREAM_LEGACY));
  typedef CUresult (*query_fn)(CUstream);
  query_fn query_ptsz = (query_fn)fake_cuda_lookup_raw("cuStreamQuery_ptsz");
  CHECK(query_ptsz != NULL);
  fake_cuda_hold_stream(CU_STREAM_PER_THREAD, 1);
  CHECK_ERR(query_ptsz(NULL), CUDA_ERROR_NOT_READY); /* 0 is the per-thread stream there */
  CHECK_CU(cuStreamQuery(s));
  fake_cuda_hold_stream(CU_STREAM_PER_THREAD, 0);
  CHECK_CU(query_ptsz(NULL));
  /* VM objects. */
  CUdeviceptr va;
  CUmemGenericAllocationHandle h;
  CHECK_CU(cuMemAddressReserve(&va, 4 * MiB, 0, 0, 0));
  RUN(vm_map_rw(va, 2 * MiB, 0, &h));
  st = stats();
  CHECK(st.live_vm_handles == 1 && st.live_reservations == 1 && st.live_mappings == 1);
  CHECK_CU(cuMemRelease(h)); /* the mapping keeps the memory */
  CHECK(stats().live_vm_handles == 0 && stats().live_mappings == 1);
  CHECK_CU(cuMemUnmap(va, 2 * MiB));
  CHECK(stats().live_mappings == 0);
  CHECK_CU(cuMemAddressFree(va, 4 * MiB));
  CHECK(stats().live_reservations == 0);
  /* Destroyed objects, and those of a destroyed context, are not held. */
  CHECK_CU(cuEventDestroy(e));
  CHECK_CU(cuStreamDestroy(s));
  CHECK(stats().live_events == 0 && stats().live_streams == 0);
  CHECK_CU(cuCtxCreate(&c2, NULL, 0, 0));
  CHECK_CU(cuStreamCreate(&s2, 0));
  CHECK_CU(cuEventCreate(&e2, 0));
  CHECK_CU(cuEventCreate(&e, 0));
  CHECK_CU(cuEventDestroy(e));
  CHECK(stats().live_events == 1 && stats().live_streams == 1);
  CHECK_CU(cuCtxDestroy(c2));
  CHECK(stats().live_events == 0 && stats().live_streams == 0);
  CHECK(cuEventDestroy(e2) != CUDA_SUCCESS); /* freed with its context */
  CHECK(stats().live_events == 0);
  return 0;
}

/* ---------------- F. pinned host memory ---------------- */

/* The flags cuMemHostGetFlags answers for p. */
static unsigned host_flags_of(void* p) {
  unsigned f = 0xdead;
  return cuMemHostGetFlags(&f, p) == CUDA_SUCCESS ? f : 0xdead;
}

static int in_chunk_of(const void* p, const void* first) {
  const uintptr_t base = (uintptr_t)first & ~(uintptr_t)(2 * MiB - 1);
  return (uintptr_t)p >= base && (uintptr_t)p < base + 2 * MiB;
}

/* Small pinned allocations share 2 MiB chunks, and every allocation in a
 * chunk reports the chunk's flags (its first allocation's) | DEVICEMAP, as
 * the real driver (H100, driver 580) does; write-combined ones and 1 MiB
 * requests are apart and report their own. */
static int host_chunks(void) {
  CUcontext ctx;
  RUN(setup(&ctx, 0));
  const size_t K256 = 256 << 10;
  void *a = NULL, *b = NULL, *wc = NULL, *wc2 = NULL, *big = NULL, *c = NULL, *d = NULL;
  CHECK_CU(cuMemHostAlloc(&a, K256, 0));
  CHECK_CU(cuMemHostAlloc(&b, K256, CU_MEMHOSTALLOC_PORTABLE));
  CHECK((char*)b == (char*)a + K256); /* adjacent, as measured */
  CHECK(host_flags_of(a) == CU_MEMHOSTALLOC_DEVICEMAP);
  CHECK(host_flags_of(b) == CU_MEMHOSTALLOC_DEVICEMAP);        /* the chunk's, not 0x3 */
  CHECK(host_flags_of((char*)b + 100) == CU_MEMHOSTALLOC_DEVICEMAP);
  CHECK_CU(cuMemHostAlloc(&wc, K256, CU_MEMHOSTALLOC_WRITECOMBINED));
  CHECK(!in_chunk_of(wc, a));
  CHECK(host_flags_of(wc) == (CU_MEMHOSTALLOC_WRITECOMBINED | CU_MEMHOSTALLOC_DEVICEMAP));
  const unsigned wcp = CU_MEMHOSTALLOC_WRITECOMBINED | CU_MEMHOSTALLOC_PORTABLE;
  CHECK_CU(cuMemHostAlloc(&wc2, K256, wcp));
  CHECK(!in_chunk_of(wc2, a) && !in_chunk_of(wc2, wc));
  CHECK(host_flags_of(wc2) == (wcp | CU_MEMHOSTALLOC_DEVICEMAP));
  CHECK_CU(cuMemHostAlloc(&big, MiB, CU_MEMHOSTALLOC_PORTABLE)); /* a mapping of its own */
  CHECK(!in_chunk_of(big, a));
  CHECK(host_flags_of(big) == (CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
  /* Unified addressing: a device alias without the DEVICEMAP flag. */
  CUdeviceptr alias = 0;
  CHECK_CU(cuMemHostGetDevicePointer(&alias, a, 0));
  CHECK(alias == (CUdeviceptr)(uintptr_t)a);
  /* Each allocation is exactly its size: the rest of the chunk is nobody's. */
  CUdeviceptr base = 0;
  size_t size = 0;
  CHECK_CU(cuMemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)b + 10));
  CHECK(base == (CUdeviceptr)(uintptr_t)b && size == K256);
  CHECK_ERR(cuMemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)b + K256), CUDA_ERROR_NOT_FOUND);
  CHECK(host_flags_of((char*)b + K256) == 0xdead);
  /* A freed place is reused by the next request that fits... */
  CHECK_CU(cuMemFreeHost(a));
  CHECK_CU(cuMemHostAlloc(&d, 5000, CU_MEMHOSTALLOC_PORTABLE));
  CHECK(d == a);
  CHECK(host_flags_of(d) == CU_MEMHOSTALLOC_DEVICEMAP);
  /* ...and an emptied chunk goes: a later request starts a fresh one. */
  CHECK_CU(cuMemFreeHost(d));
  CHECK_CU(cuMemFreeHost(b));
  CHECK_CU(cuMemHostAlloc(&c, K256, CU_MEMHOSTALLOC_PORTABLE));
  CHECK(host_flags_of(c) == (CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
  /* A destroyed context frees its chunks' allocations with the rest. */
  CUcontext c2;
  void* e = NULL;
  CHECK_CU(cuCtxCreate(&c2, NULL, 0, 0));
  CHECK_CU(cuMemHostAlloc(&e, K256, 0));
  CHECK(!in_chunk_of(e, c)); /* chunks are per context */
  CHECK_CU(cuCtxDestroy(c2));
  CHECK(stats().host_dropped_with_context == 1);
  CHECK(host_flags_of(e) == 0xdead);
  CHECK_CU(cuCtxSetCurrent(ctx));
  CHECK_CU(cuMemFreeHost(c));
  CHECK_CU(cuMemFreeHost(wc));
  CHECK_CU(cuMemFreeHost(wc2));
  CHECK_CU(cuMemFreeHost(big));
  CHECK(stats().live_host_allocs == 0);
  return 0;
}

/* FAKE_CUDA_HOST_SUBALLOC_BELOW=0: every allocation its own, its own flags. */
static int host_chunks_off(void) {
  CUcontext ctx;
  RUN(setup(&ctx, 0));
  void *a = NULL, *b = NULL;
  CHECK_CU(cuMemHostAlloc(&a, 4096, 0));
  CHECK_CU(cuMemHostAlloc(&b, 4096, CU_MEMHOSTALLOC_PORTABLE));
  CHECK(host_flags_of(b) == (CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
  CHECK_CU(cuMemFreeHost(a));
  CHECK_CU(cuMemFreeHost(b));
  return 0;
}

struct test_case {
  const char* name;
  int (*run)(void);
};

static const struct test_case cases[] = {
  {"address_range", address_range},
  {"pointer_attribute", pointer_attribute},
  {"pointer_attributes", pointer_attributes},
  {"pointer_set_attribute", pointer_set_attribute},
  {"vm_attributes", vm_attributes},
  {"ipc_local", ipc_local},
  {"ipc_cross_process", ipc_cross_process},
  {"suballocation", suballocation},
  {"suballocation_off", suballocation_off},
  {"ipc_moved_layout", ipc_moved_layout},
  {"primary_context", primary_context},
  {"ctx_destroy", ctx_destroy},
  {"peer_access", peer_access},
  {"vm_access", vm_access},
  {"proc_address", proc_address},
  {"faults", faults},
  {"faults_env", faults_env},
  {"live_counters", live_counters},
  {"host_chunks", host_chunks},
  {"host_chunks_off", host_chunks_off},
};

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s CASE\n", argv[0]);
    return 2;
  }
  g_case = argv[1];
  if (strcmp(argv[1], "importer") == 0) return importer(argc, argv);
  if (strcmp(argv[1], "stale_importer") == 0) return stale_importer(argc, argv);
  if (strcmp(argv[1], "layout_importer") == 0) return layout_importer(argc, argv);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
    if (strcmp(cases[i].name, argv[1]) == 0) return cases[i].run();
  fprintf(stderr, "unknown case %s\n", argv[1]);
  return 2;
}
