/* fidelity.c — the driver calls that reveal an allocation, bare and under the shim.
 *
 * Every behaviour here states what the (fake) driver answers for plain
 * cuMemAlloc allocations; meson runs each one twice, without the shim and
 * with it, so the same assertions hold for the driver's own allocations and
 * for cachalloc's blocks carved out of segments (docs/INTERPOSER.md, "Identity,
 * IPC and context lifetime").  With FIDELITY_SHIM=1 a behaviour also checks
 * that cachalloc really served the blocks from shared segments, so that it
 * cannot pass by accident.
 *
 * Usage: fidelity ROUTE BEHAVIOUR   (ROUTE: proc = static cudart's
 * cuGetProcAddress chain, dlsym = numba's dlsym on the libcuda handle)
 *        fidelity ROUTE ipc_import HANDLES...   (the importer process) */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* cuCtxDetach is tested too */
#include <unistd.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "driver_api.h"
#include "fake_libcuda.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

#define CHECK(cond)                                                                          \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      fprintf(stderr, "[%s %s] %s:%d: check failed: %s\n", g_route, g_mode, __FILE__, __LINE__, #cond); \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)
#define CHECK_CU(call) CHECK((call) == CUDA_SUCCESS)

static const char* g_route = "?";
static const char* g_mode = "bare";
static int g_shim;     /* FIDELITY_SHIM=1: cachalloc is preloaded */
static char** g_argv;

/* The driver API as the route hands it out. */
static struct {
  PFN_cuInit_v2000 init;
  PFN_cuDeviceGet_v2000 device_get;
  PFN_cuDevicePrimaryCtxRetain_v7000 retain;
  PFN_cuDevicePrimaryCtxRelease_v11000 release;
  PFN_cuDevicePrimaryCtxReset_v11000 reset;
  PFN_cuCtxSetCurrent_v4000 set_current;
  PFN_cuCtxGetCurrent_v4000 get_current;
  PFN_cuCtxCreate_v3020 ctx_create;
  PFN_cuCtxDestroy_v4000 ctx_destroy;
  PFN_cuCtxEnablePeerAccess_v4000 enable_peer;
  PFN_cuCtxDisablePeerAccess_v4000 disable_peer;
  PFN_cuStreamCreate_v2000 stream_create;
  PFN_cuStreamDestroy_v4000 stream_destroy;
  PFN_cuMemAlloc_v3020 alloc;
  PFN_cuMemFree_v3020 free;
  PFN_cuMemAllocAsync_v11020 alloc_async;
  PFN_cuMemFreeAsync_v11020 free_async;
  PFN_cuMemsetD8_v3020 memset8;
  PFN_cuMemcpyDtoH_v3020 dtoh;
  PFN_cuMemGetAddressRange_v3020 range;
  PFN_cuPointerGetAttribute_v4000 attr;
  PFN_cuPointerGetAttributes_v7000 attrs;
  PFN_cuPointerSetAttribute_v6000 set_attr;
  PFN_cuIpcGetMemHandle_v4010 ipc_get;
  PFN_cuIpcOpenMemHandle_v11000 ipc_open;
  PFN_cuIpcCloseMemHandle_v4010 ipc_close;
  PFN_cuStreamBeginCapture_v10010 begin_capture;
  PFN_cuStreamEndCapture_v10000 end_capture;
  PFN_cuCtxDetach_v2000 ctx_detach;
  PFN_cuMemRetainAllocationHandle_v11000 retain_handle;
  PFN_cuMemGetHandleForAddressRange_v11070 dmabuf;
  PFN_cuDeviceGetDefaultMemPool_v11020 default_pool;
  PFN_cuDeviceSetMemPool_v11020 set_pool;
  PFN_cuMemAddressReserve_v10020 reserve;
  PFN_cuMemAddressFree_v10020 unreserve;
  PFN_cuMemCreate_v10020 mem_create;
  PFN_cuMemRelease_v10020 mem_release;
  PFN_cuMemMap_v10020 mem_map;
  PFN_cuMemUnmap_v10020 mem_unmap;
  PFN_cuMemSetAccess_v10020 set_access;
  PFN_cuGreenCtxCreate_v12040 green_create;
  void (*fake_stats)(struct fake_cuda_stats_t*);
  int (*fake_vm_access)(CUdeviceptr, int);
  void (*fake_fail)(const char*, int, int, CUresult);
  void (*fake_fail_reset)(void);
} D;

static int load_api(const char* route) {
  if (!driver_api_open(route)) return 0;
#define L(field, base, exported, version) DRIVER_API_ENTRY(D, field, base, exported, version)
  L(init, "cuInit", "cuInit", 2000);
  L(device_get, "cuDeviceGet", "cuDeviceGet", 2000);
  L(retain, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", 7000);
  L(release, "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2", 11000);
  L(reset, "cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset_v2", 11000);
  L(set_current, "cuCtxSetCurrent", "cuCtxSetCurrent", 4000);
  L(get_current, "cuCtxGetCurrent", "cuCtxGetCurrent", 4000);
  L(ctx_create, "cuCtxCreate", "cuCtxCreate_v2", 3020);
  L(ctx_destroy, "cuCtxDestroy", "cuCtxDestroy_v2", 4000);
  L(enable_peer, "cuCtxEnablePeerAccess", "cuCtxEnablePeerAccess", 4000);
  L(disable_peer, "cuCtxDisablePeerAccess", "cuCtxDisablePeerAccess", 4000);
  L(stream_create, "cuStreamCreate", "cuStreamCreate", 2000);
  L(stream_destroy, "cuStreamDestroy", "cuStreamDestroy_v2", 4000);
  L(alloc, "cuMemAlloc", "cuMemAlloc_v2", 3020);
  L(free, "cuMemFree", "cuMemFree_v2", 3020);
  L(alloc_async, "cuMemAllocAsync", "cuMemAllocAsync", 11020);
  L(free_async, "cuMemFreeAsync", "cuMemFreeAsync", 11020);
  L(memset8, "cuMemsetD8", "cuMemsetD8_v2", 3020);
  L(dtoh, "cuMemcpyDtoH", "cuMemcpyDtoH_v2", 3020);
  L(range, "cuMemGetAddressRange", "cuMemGetAddressRange_v2", 3020);
  L(attr, "cuPointerGetAttribute", "cuPointerGetAttribute", 4000);
  L(attrs, "cuPointerGetAttributes", "cuPointerGetAttributes", 7000);
  L(set_attr, "cuPointerSetAttribute", "cuPointerSetAttribute", 6000);
  L(ipc_get, "cuIpcGetMemHandle", "cuIpcGetMemHandle", 4010);
  L(ipc_open, "cuIpcOpenMemHandle", "cuIpcOpenMemHandle_v2", 11000);
  L(ipc_close, "cuIpcCloseMemHandle", "cuIpcCloseMemHandle", 4010);
  L(begin_capture, "cuStreamBeginCapture", "cuStreamBeginCapture_v2", 10010);
  L(end_capture, "cuStreamEndCapture", "cuStreamEndCapture", 10000);
  L(ctx_detach, "cuCtxDetach", "cuCtxDetach", 2000);
  L(retain_handle, "cuMemRetainAllocationHandle", "cuMemRetainAllocationHandle", 11000);
  L(dmabuf, "cuMemGetHandleForAddressRange", "cuMemGetHandleForAddressRange", 11070);
  L(default_pool, "cuDeviceGetDefaultMemPool", "cuDeviceGetDefaultMemPool", 11020);
  L(set_pool, "cuDeviceSetMemPool", "cuDeviceSetMemPool", 11020);
  L(reserve, "cuMemAddressReserve", "cuMemAddressReserve", 10020);
  L(unreserve, "cuMemAddressFree", "cuMemAddressFree", 10020);
  L(mem_create, "cuMemCreate", "cuMemCreate", 10020);
  L(mem_release, "cuMemRelease", "cuMemRelease", 10020);
  L(mem_map, "cuMemMap", "cuMemMap", 10020);
  L(mem_unmap, "cuMemUnmap", "cuMemUnmap", 10020);
  L(set_access, "cuMemSetAccess", "cuMemSetAccess", 10020);
  L(green_create, "cuGreenCtxCreate", "cuGreenCtxCreate", 12040);
#undef L
  *(void**)&D.fake_stats = driver_api_symbol("fake_cuda_stats");
  *(void**)&D.fake_vm_access = driver_api_symbol("fake_cuda_vm_access");
  *(void**)&D.fake_fail = driver_api_symbol("fake_cuda_fail");
  *(void**)&D.fake_fail_reset = driver_api_symbol("fake_cuda_fail_reset");
  return driver_api_complete(&D, sizeof D);
}

static struct fake_cuda_stats_t stats(void) {
  struct fake_cuda_stats_t s;
  D.fake_stats(&s);
  return s;
}

static CUcontext g_ctx;

static int setup(void) {
  CUdevice dev;
  CHECK_CU(D.init(0));
  CHECK_CU(D.device_get(&dev, 0));
  CHECK_CU(D.retain(&g_ctx, dev));
  CHECK_CU(D.set_current(g_ctx));
  return 0;
}

/* Fills `n` bytes at `p` with `v` and checks they read back. */
static int fill(CUdeviceptr p, unsigned char v, size_t n) {
  CHECK_CU(D.memset8(p, v, n));
  return 0;
}

static int holds(CUdeviceptr p, unsigned char v, size_t n) {
  unsigned char* buf = malloc(n);
  if (buf == NULL) return 0;
  int ok = D.dtoh(buf, p, n) == CUDA_SUCCESS;
  for (size_t i = 0; ok && i < n; ++i) ok = buf[i] == v;
  free(buf);
  return ok;
}

/* ---------------- identity ---------------- */

static const size_t kSizes[] = {1000, 3000, 100 * KiB, 1, 4096, 777};
#define NBUF (sizeof kSizes / sizeof kSizes[0])

/* Buffers that (under the shim) share one small segment; the fake's
 * cuMemAlloc count tells whether cachalloc carved them out of one. */
static int make_buffers(CUdeviceptr* p) {
  unsigned long before = stats().mem_alloc;
  for (size_t i = 0; i < NBUF; ++i) {
    CHECK_CU(D.alloc(&p[i], kSizes[i]));
    if (fill(p[i], (unsigned char)(0x10 + i), kSizes[i])) return 1;
  }
  if (g_shim) CHECK(stats().mem_alloc - before < NBUF); /* really sub-allocated */
  return 0;
}

/* numba's device_memory_size: the range of an interior pointer, memset whole. */
static int address_range(void) {
  CUdeviceptr p[NBUF];
  if (make_buffers(p)) return 1;
  for (size_t i = 0; i < NBUF; ++i) {
    CUdeviceptr base = 0;
    size_t size = 0;
    CHECK_CU(D.range(&base, &size, p[i] + kSizes[i] / 2));
    CHECK(base == p[i]);
    CHECK(size == kSizes[i]);
    CHECK(D.range(&base, &size, p[i] + kSizes[i]) == CUDA_ERROR_NOT_FOUND || p[i] + kSizes[i] == p[(i + 1) % NBUF]);
    CHECK_CU(D.range(NULL, &size, p[i]));
    CHECK_CU(D.range(&base, NULL, p[i]));
  }
  /* Memset what the driver says the buffer is: the neighbours stay intact. */
  CUdeviceptr base = 0;
  size_t size = 0;
  CHECK_CU(D.range(&base, &size, p[1] + 17));
  if (fill(base, 0xee, size)) return 1;
  for (size_t i = 0; i < NBUF; ++i)
    CHECK(holds(p[i], i == 1 ? 0xee : (unsigned char)(0x10 + i), kSizes[i]));
  /* Freed memory is not an allocation any more. */
  CHECK_CU(D.free(p[2]));
  CHECK(D.range(&base, &size, p[2]) == CUDA_ERROR_NOT_FOUND);
  CHECK(D.range(&base, &size, p[2] + 100) == CUDA_ERROR_NOT_FOUND);
  for (size_t i = 0; i < NBUF; ++i)
    if (i != 2) CHECK_CU(D.free(p[i]));
  return 0;
}

static int pointer_attributes(void) {
  CUdeviceptr p[NBUF];
  if (make_buffers(p)) return 1;
  CUdeviceptr inner = p[1] + 100;
  CUdeviceptr start = 0, dptr = 0;
  size_t size = 0;
  unsigned long long id[NBUF];
  CUcontext ctx = NULL;
  unsigned int type = 0, mapped = 0;
  CHECK_CU(D.attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, inner));
  CHECK_CU(D.attr(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, inner));
  CHECK_CU(D.attr(&dptr, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, inner));
  CHECK_CU(D.attr(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, inner));
  CHECK_CU(D.attr(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, inner));
  CHECK_CU(D.attr(&mapped, CU_POINTER_ATTRIBUTE_MAPPED, inner));
  CHECK(start == p[1] && size == kSizes[1] && dptr == inner && ctx == g_ctx);
  CHECK(type == CU_MEMORYTYPE_DEVICE && mapped == 1);
  for (size_t i = 0; i < NBUF; ++i) {
    CHECK_CU(D.attr(&id[i], CU_POINTER_ATTRIBUTE_BUFFER_ID, p[i]));
    for (size_t j = 0; j < i; ++j) CHECK(id[i] != id[j]);
  }
  /* The plural form, for the same block. */
  CUpointer_attribute which[] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                 CU_POINTER_ATTRIBUTE_BUFFER_ID, CU_POINTER_ATTRIBUTE_MEMORY_TYPE};
  CUdeviceptr pstart = 0;
  size_t psize = 0;
  unsigned long long pid = 0;
  unsigned int ptype = 0;
  void* data[] = {&pstart, &psize, &pid, &ptype};
  CHECK_CU(D.attrs(4, which, data, inner));
  CHECK(pstart == p[1] && psize == kSizes[1] && pid == id[1] && ptype == CU_MEMORYTYPE_DEVICE);
  /* SYNC_MEMOPS can be set on a live buffer. */
  unsigned int one = 1;
  CHECK_CU(D.set_attr(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p[0]));
  /* A new allocation gets a new id, even at the same address. */
  CHECK_CU(D.free(p[4]));
  CUdeviceptr again = 0;
  unsigned long long id_again = 0;
  CHECK_CU(D.alloc(&again, kSizes[4]));
  CHECK_CU(D.attr(&id_again, CU_POINTER_ATTRIBUTE_BUFFER_ID, again));
  for (size_t i = 0; i < NBUF; ++i) CHECK(id_again != id[i]);
  if (g_shim) CHECK(again == p[4]); /* the cache handed the same block back */
  CHECK_CU(D.free(again));
  for (size_t i = 0; i < NBUF; ++i)
    if (i != 4) CHECK_CU(D.free(p[i]));
  return 0;
}

/* A freed buffer answers like any address the driver does not know. */
static int freed_attributes(void) {
  CUdeviceptr p[NBUF];
  if (make_buffers(p)) return 1;
  CUdeviceptr gone = p[3];
  CHECK_CU(D.free(gone));
  static char host[64];
  CUdeviceptr unknown = (CUdeviceptr)(uintptr_t)host;
  for (int a = 1; a <= 21; ++a) {
    unsigned long long v[4] = {0x5a5a5a5a5a5aULL, 0x5a5a5a5a5a5aULL, 0, 0};
    CHECK(D.attr(v, (CUpointer_attribute)a, gone) == CUDA_ERROR_INVALID_VALUE);
    CHECK(v[0] == 0x5a5a5a5a5a5aULL); /* nothing written */
    unsigned long long got[2] = {0x77, 0x77}, want[2] = {0x77, 0x77};
    CUpointer_attribute at = (CUpointer_attribute)a;
    void* dg = got;
    void* dw = want;
    CUresult rg = D.attrs(1, &at, &dg, gone);
    CUresult rw = D.attrs(1, &at, &dw, unknown);
    CHECK(rg == rw);
    if (a == CU_POINTER_ATTRIBUTE_HOST_POINTER) {
      CHECK(got[0] == gone && want[0] == unknown);
    } else {
      CHECK(got[0] == want[0] && got[1] == want[1]);
    }
  }
  unsigned int one = 1;
  CHECK(D.set_attr(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, gone) == CUDA_ERROR_INVALID_VALUE);
  for (size_t i = 0; i < NBUF; ++i)
    if (i != 3) CHECK_CU(D.free(p[i]));
  return 0;
}

/* ---------------- IPC ---------------- */

static void to_hex(const CUipcMemHandle* h, char* out) {
  for (int i = 0; i < CU_IPC_HANDLE_SIZE; ++i) sprintf(out + 2 * i, "%02x", (unsigned char)h->reserved[i]);
}
static void from_hex(const char* s, CUipcMemHandle* h) {
  for (int i = 0; i < CU_IPC_HANDLE_SIZE; ++i) {
    unsigned x = 0;
    sscanf(s + 2 * i, "%2x", &x);
    h->reserved[i] = (char)x;
  }
}

/* The importer: argv = handles as "hex:size:fill"; checks each buffer
 * (contents and the range the driver reports), writes 0xa0+i into the
 * first two, closes the third and re-checks the rest, then (if asked)
 * waits for a line on stdin and, under the shim, checks buffer 3 still
 * holds its old contents. */
static int ipc_import(int argc, char** argv) {
  if (setup()) return 1;
  int n = argc;
  CUdeviceptr p[16];
  size_t size[16];
  unsigned fillv[16];
  CHECK(n <= 16);
  for (int i = 0; i < n; ++i) {
    CUipcMemHandle h;
    char hex[2 * CU_IPC_HANDLE_SIZE + 1];
    CHECK(sscanf(argv[i], "%128[0-9a-f]:%zu:%u", hex, &size[i], &fillv[i]) == 3);
    from_hex(hex, &h);
    CHECK_CU(D.ipc_open(&p[i], h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    CHECK(holds(p[i], (unsigned char)fillv[i], size[i]));
    CUdeviceptr base = 0;
    size_t len = 0;
    CHECK_CU(D.range(&base, &len, p[i]));
    CHECK(base == p[i] && len == size[i]);
  }
  for (int i = 0; i < 2 && i < n; ++i)
    if (fill(p[i], (unsigned char)(0xa0 + i), size[i])) return 1;
  if (n > 2) CHECK_CU(D.ipc_close(p[2]));
  for (int i = 0; i < n; ++i)
    if (i != 2) CHECK(holds(p[i], i < 2 ? (unsigned char)(0xa0 + i) : (unsigned char)fillv[i], size[i]));
  printf("imported\n");
  fflush(stdout);
  char line[8];
  /* The exporter freed buffer 3 and allocated more: cachalloc keeps an
   * exported block, but the driver hands a freed small allocation's place
   * out again at once (measured), so only the shim promises this. */
  if (fgets(line, sizeof line, stdin) != NULL && g_shim) CHECK(holds(p[3], (unsigned char)fillv[3], size[3]));
  for (int i = 0; i < n; ++i)
    if (i != 2) CHECK_CU(D.ipc_close(p[i]));
  return 0;
}

/* Starts the importer (a fresh process, with or without the shim). */
static pid_t spawn_importer(char** handles, int n, int bare, int* to_child, FILE** from_child) {
  int in[2], out[2];
  if (pipe(in) != 0 || pipe(out) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    close(in[1]);
    close(out[0]);
    if (bare) unsetenv("LD_PRELOAD");
    char* args[24] = {g_argv[0], (char*)g_route, "ipc_import"};
    for (int i = 0; i < n; ++i) args[3 + i] = handles[i];
    args[3 + n] = NULL;
    execv("/proc/self/exe", args);
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  *to_child = in[1];
  *from_child = fdopen(out[0], "r");
  return pid;
}

static int ipc_export(int bare_importer) {
  CUdeviceptr p[NBUF];
  if (make_buffers(p)) return 1;
  char hexes[NBUF][2 * CU_IPC_HANDLE_SIZE + 64];
  char* args[NBUF];
  for (size_t i = 0; i < NBUF; ++i) {
    CUipcMemHandle h;
    /* one export through an interior pointer, as a library might */
    CHECK_CU(D.ipc_get(&h, i == 4 ? p[i] + 1 : p[i]));
    to_hex(&h, hexes[i]);
    sprintf(hexes[i] + 2 * CU_IPC_HANDLE_SIZE, ":%zu:%u", kSizes[i], (unsigned)(0x10 + i));
    args[i] = hexes[i];
  }
  /* A process cannot open its own handles. */
  CUipcMemHandle own;
  CUdeviceptr self = 0;
  from_hex(hexes[0], &own);
  CHECK(D.ipc_open(&self, own, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != CUDA_SUCCESS);
  int to_child = -1;
  FILE* from_child = NULL;
  pid_t pid = spawn_importer(args, (int)NBUF, bare_importer, &to_child, &from_child);
  CHECK(pid > 0);
  char line[64] = "";
  CHECK(fgets(line, sizeof line, from_child) != NULL && strcmp(line, "imported\n") == 0);
  /* The importer wrote exactly buffers 0 and 1. */
  for (size_t i = 0; i < NBUF; ++i)
    CHECK(holds(p[i], i < 2 ? (unsigned char)(0xa0 + i) : (unsigned char)(0x10 + i), kSizes[i]));
  /* Buffer 3 is freed while the importer maps it: its memory must not be
   * handed out again (the driver keeps exported memory alive). */
  CHECK_CU(D.free(p[3]));
  CUdeviceptr fresh[8];
  for (int i = 0; i < 8; ++i) {
    CHECK_CU(D.alloc(&fresh[i], kSizes[3]));
    if (fill(fresh[i], 0x33, kSizes[3])) return 1;
  }
  CHECK(write(to_child, "go\n", 3) == 3);
  close(to_child);
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  fclose(from_child);
  for (int i = 0; i < 8; ++i) CHECK_CU(D.free(fresh[i]));
  for (size_t i = 0; i < NBUF; ++i)
    if (i != 3) CHECK_CU(D.free(p[i]));
  return 0;
}

/* The handle layout (docs/INTERPOSER.md, IPC).  Three buffers: `a` at the
 * start of a small segment (under the shim) but smaller than it, `b` inside
 * that segment, `w` a 12 MiB buffer that is a whole segment of its own.
 * Bare, or under the shim on a driver whose layout cachalloc proves (the
 * fake's default), each exports and a bare importer maps exactly its bytes
 * and writes only them.  With FIDELITY_IPC_REFUSED=1 under the shim (a fake
 * driver of another layout, FAKE_CUDA_IPC_LAYOUT, or one that gives every
 * allocation its own mapping, FAKE_CUDA_SUBALLOC_MAX=0) the layout cannot
 * be proven: `a` and `b` are refused with CUDA_ERROR_NOT_SUPPORTED and a
 * logged reason instead of a handle of the wrong memory, and `w` still
 * exports as the driver's own handle.  Under the shim a probe whose
 * cuMemAlloc fails first makes that export fail with the driver's error. */
static int ipc_layout(void) {
  const char* env = getenv("FIDELITY_IPC_REFUSED");
  const int refused = g_shim && env != NULL && strcmp(env, "1") == 0;
  const size_t sizes[3] = {1000, 3000, 12 * MiB};
  CUdeviceptr p[3];
  for (int i = 0; i < 3; ++i) {
    CHECK_CU(D.alloc(&p[i], sizes[i]));
    if (fill(p[i], (unsigned char)(0x40 + i), sizes[i])) return 1;
  }
  /* Under the shim, where the blocks lie (MAPPING_* describe the segment):
   * a at its start, b inside, w alone. */
  CUdeviceptr map[3];
  size_t map_size = 0;
  for (int i = 0; i < 3; ++i) CHECK_CU(D.attr(&map[i], CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, p[i]));
  CHECK_CU(D.attr(&map_size, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, p[2]));
  if (g_shim) CHECK(map[0] == p[0] && map[1] == p[0] && p[1] > p[0] && map[2] == p[2] && map_size == sizes[2]);
  /* A probe whose driver call fails decides nothing: the export returns
   * the driver's error, and the next export probes again (below). */
  if (g_shim && !refused) {
    CUipcMemHandle scratch;
    D.fake_fail("cuMemAlloc_v2", 0, 1, CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(D.ipc_get(&scratch, p[1]) == CUDA_ERROR_OUT_OF_MEMORY);
    D.fake_fail_reset();
  }
  /* The exports, with stderr caught for cachalloc's log. */
  char path[] = "/tmp/cachalloc-ipclayout-XXXXXX";
  int log_fd = mkstemp(path);
  CHECK(log_fd >= 0);
  unlink(path);
  int saved = dup(2);
  dup2(log_fd, 2);
  CUipcMemHandle h[3];
  CUresult r[3];
  for (int i = 0; i < 3; ++i) r[i] = D.ipc_get(&h[i], p[i]);
  dup2(saved, 2);
  close(saved);
  char text[4096] = {0};
  CHECK(pread(log_fd, text, sizeof text - 1, 0) >= 0);
  close(log_fd);
  if (text[0] != 0) fprintf(stderr, "[%s %s] logged: %s", g_route, g_mode, text);
  if (refused) {
    CHECK(r[0] == CUDA_ERROR_NOT_SUPPORTED && r[1] == CUDA_ERROR_NOT_SUPPORTED && r[2] == CUDA_SUCCESS);
    CHECK(strstr(text, "cuIpcGetMemHandle") != NULL && strstr(text, "layout") != NULL);
    CHECK(strstr(text, "refusing") != NULL);
  } else {
    CHECK(r[0] == CUDA_SUCCESS && r[1] == CUDA_SUCCESS && r[2] == CUDA_SUCCESS);
    CHECK(strstr(text, "refusing") == NULL && strstr(text, "error") == NULL);
  }
  /* A bare importer of what was exported (w alone when refused). */
  const int first = refused ? 2 : 0;
  char hexes[3][2 * CU_IPC_HANDLE_SIZE + 64];
  char* args[3];
  for (int i = first; i < 3; ++i) {
    to_hex(&h[i], hexes[i]);
    sprintf(hexes[i] + 2 * CU_IPC_HANDLE_SIZE, ":%zu:%u", sizes[i], (unsigned)(0x40 + i));
    args[i - first] = hexes[i];
  }
  int to_child = -1;
  FILE* from_child = NULL;
  pid_t pid = spawn_importer(args, 3 - first, 1, &to_child, &from_child);
  CHECK(pid > 0);
  char line[64] = "";
  CHECK(fgets(line, sizeof line, from_child) != NULL && strcmp(line, "imported\n") == 0);
  close(to_child);
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  fclose(from_child);
  /* The importer wrote 0xa0 + k into the k-th buffer it opened (the first
   * two), and nothing else. */
  for (int i = 0; i < 3; ++i) {
    const int k = i - first;
    CHECK(holds(p[i], k >= 0 && k < 2 ? (unsigned char)(0xa0 + k) : (unsigned char)(0x40 + i), sizes[i]));
  }
  for (int i = 0; i < 3; ++i) CHECK_CU(D.free(p[i]));
  return 0;
}

/* The first exports, from eight threads at once: all succeed, and under
 * the shim the layout probe ran once (three driver allocations, freed);
 * later exports probe no more. */
#define NEXPORT 8
struct export_job {
  CUdeviceptr p;
  CUresult r;
};
static void* export_one(void* arg) {
  struct export_job* j = arg;
  CUipcMemHandle h;
  D.set_current(g_ctx);
  j->r = D.ipc_get(&h, j->p);
  return NULL;
}
static int ipc_probe_once(void) {
  struct export_job jobs[NEXPORT];
  pthread_t threads[NEXPORT];
  for (int i = 0; i < NEXPORT; ++i) CHECK_CU(D.alloc(&jobs[i].p, 1000 + 100 * (size_t)i));
  const struct fake_cuda_stats_t before = stats();
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < NEXPORT; ++i) CHECK(pthread_create(&threads[i], NULL, export_one, &jobs[i]) == 0);
    for (int i = 0; i < NEXPORT; ++i) CHECK(pthread_join(threads[i], NULL) == 0);
    for (int i = 0; i < NEXPORT; ++i) CHECK(jobs[i].r == CUDA_SUCCESS);
    const struct fake_cuda_stats_t now = stats();
    CHECK(now.mem_alloc - before.mem_alloc == (g_shim ? 3u : 0u));
    CHECK(now.mem_free - before.mem_free == now.mem_alloc - before.mem_alloc);
  }
  for (int i = 0; i < NEXPORT; ++i) CHECK_CU(D.free(jobs[i].p));
  return 0;
}

/* A global-mode capture forbids allocating: under the shim the first
 * export waits for the capture's end rather than let the layout probe
 * invalidate it (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), then works.  A
 * relaxed capture does not stop the probe. */
static int ipc_probe_capture(void) {
  CUstream s;
  CUdeviceptr p = 0;
  CUipcMemHandle h;
  CUgraph g;
  CHECK_CU(D.stream_create(&s, 0));
  CHECK_CU(D.alloc(&p, 3000));
  CHECK_CU(D.begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK(D.ipc_get(&h, p) == (g_shim ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS));
  CHECK_CU(D.end_capture(s, &g));
  CHECK_CU(D.begin_capture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  CHECK_CU(D.ipc_get(&h, p));
  CHECK_CU(D.end_capture(s, &g));
  CHECK_CU(D.free(p));
  CHECK_CU(D.stream_destroy(s));
  return 0;
}

/* Expandable segments are cuMemMap'ed memory: no legacy IPC handle. */
static int ipc_expandable(void) {
  CUdeviceptr p = 0;
  CUipcMemHandle h;
  CHECK_CU(D.alloc(&p, 4096));
  CHECK(D.ipc_get(&h, p) == (g_shim ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS));
  CHECK_CU(D.free(p));
  return 0;
}

/* ---------------- context lifetime ---------------- */

/* Allocates, frees and uses a stream so that the cache holds segments and
 * pooled events of the context that is about to die. */
static int warm_cache(size_t n) {
  CUstream s;
  CUdeviceptr a = 0, b = 0;
  CHECK_CU(D.stream_create(&s, 0));
  CHECK_CU(D.alloc(&a, n));
  CHECK_CU(D.alloc_async(&b, n, s));
  CHECK_CU(D.free_async(b, NULL)); /* another stream: an event */
  CHECK_CU(D.free(a));
  CHECK_CU(D.stream_destroy(s));
  return 0;
}

static int usable_allocations(int count) {
  CUdeviceptr p[16];
  for (int i = 0; i < count; ++i) {
    CHECK_CU(D.alloc(&p[i], 1000 + 4096 * (size_t)i));
    if (fill(p[i], (unsigned char)i, 1000)) return 1;
  }
  for (int i = 0; i < count; ++i) CHECK(holds(p[i], (unsigned char)i, 1000));
  for (int i = 0; i < count; ++i) CHECK_CU(D.free(p[i]));
  return 0;
}

/* Physical pages and reservations outlive contexts (expandable segments):
 * those of destroyed contexts must have gone back, leaving at most what the
 * live context holds (a reservation and a page per pool and stream used). */
static int no_leaked_vm(void) {
  struct fake_cuda_stats_t s = stats();
  CHECK(s.vm_reserve - s.vm_release_range <= 3);
  CHECK(s.vm_create - s.vm_release <= 3);
  return 0;
}

/* cudaDeviceReset: the primary context dies and comes back with the same handle. */
static int primary_reset(void) {
  CUdevice dev = 0;
  for (int round = 0; round < 3; ++round) {
    if (warm_cache(4096)) return 1;
    CUdeviceptr kept = 0;
    CHECK_CU(D.alloc(&kept, 512));
    CHECK_CU(D.reset(dev));
    CUdeviceptr none = 0;
    CHECK(D.alloc(&none, 100) != CUDA_SUCCESS); /* the current context is gone */
    CUcontext again = NULL;
    CHECK_CU(D.retain(&again, dev));
    CHECK(again == g_ctx); /* the same handle value, a new context */
    CHECK_CU(D.set_current(again));
    if (usable_allocations(8)) return 1;
    CHECK(D.free(kept) == CUDA_ERROR_INVALID_VALUE); /* died with the old context */
  }
  CHECK(stats().dead_context_calls == 0);
  CHECK(stats().ctx_destroyed == 3);
  return no_leaked_vm();
}

static int ctx_destroy_with(int detach) {
  CUdevice dev = 0;
  for (int round = 0; round < 3; ++round) {
    CUcontext own = NULL;
    CHECK_CU(D.ctx_create(&own, 0, dev));
    if (warm_cache(8192)) return 1;
    CHECK_CU(detach ? D.ctx_detach(own) : D.ctx_destroy(own));
    CHECK_CU(D.set_current(g_ctx));
    if (usable_allocations(4)) return 1;
  }
  /* The primary context cannot be destroyed this way; its cache stays. */
  CHECK(D.ctx_destroy(g_ctx) == CUDA_ERROR_INVALID_CONTEXT);
  if (usable_allocations(4)) return 1;
  CHECK(stats().dead_context_calls == 0);
  return no_leaked_vm();
}

static int ctx_destroy(void) { return ctx_destroy_with(0); }
static int ctx_detach(void) { return ctx_destroy_with(1); }

/* Only the last release destroys the primary context. */
static int primary_release(void) {
  CUdevice dev = 0;
  CUcontext extra = NULL;
  CHECK_CU(D.retain(&extra, dev)); /* two references */
  if (warm_cache(4096)) return 1;
  unsigned long before = stats().mem_alloc;
  CHECK_CU(D.release(dev));
  if (usable_allocations(1)) return 1; /* the context lives on */
  if (g_shim) CHECK(stats().mem_alloc == before); /* and its cache with it */
  CHECK_CU(D.release(dev)); /* the last reference */
  CHECK(stats().ctx_destroyed == 1);
  CUcontext again = NULL;
  CHECK_CU(D.retain(&again, dev));
  CHECK_CU(D.set_current(again));
  if (usable_allocations(8)) return 1;
  CHECK(stats().dead_context_calls == 0);
  return 0;
}

/* ---------------- calls around the allocation paths ---------------- */

/* During a capture the driver frees only graph allocations: a cuMemFreeAsync
 * of ordinary memory is refused and changes nothing. */
static int capture_free(void) {
  CUstream s;
  CUdeviceptr p = 0;
  CHECK_CU(D.stream_create(&s, 0));
  CHECK_CU(D.alloc_async(&p, 4096, s));
  if (fill(p, 0x42, 4096)) return 1;
  CHECK_CU(D.begin_capture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  CHECK(D.free_async(p, s) == CUDA_ERROR_INVALID_VALUE);
  CUgraph g;
  CHECK_CU(D.end_capture(s, &g));
  /* p is still the program's: nothing else gets it. */
  CUdeviceptr q = 0;
  CHECK_CU(D.alloc_async(&q, 4096, s));
  CHECK(q != p);
  CHECK(holds(p, 0x42, 4096));
  CHECK_CU(D.free_async(q, s));
  CHECK_CU(D.free_async(p, s));
  CHECK_CU(D.stream_destroy(s));
  return 0;
}

/* cuMemAllocAsync allocates on the stream's device: a stream of another
 * context is not served from the current context's cache. */
static int other_context_stream(void) {
  CUcontext c1 = NULL;
  CUstream s1;
  CUdeviceptr b = 0, p = 0;
  CHECK_CU(D.retain(&c1, 1));
  CHECK_CU(D.set_current(c1));
  CHECK_CU(D.stream_create(&s1, 0)); /* device 1 has a stream, no allocation yet */
  CHECK_CU(D.set_current(g_ctx));
  CHECK_CU(D.alloc(&b, 1000));
  unsigned long before = stats().mem_alloc_async;
  CHECK_CU(D.alloc_async(&p, 4096, s1));
  CHECK(stats().mem_alloc_async == before + 1); /* the driver allocated it */
  CHECK_CU(D.free_async(p, s1));
  /* The current context's own stream is still served from its cache. */
  CUstream s0;
  CHECK_CU(D.stream_create(&s0, 0));
  before = stats().mem_alloc_async;
  CHECK_CU(D.alloc_async(&p, 4096, s0));
  if (g_shim) CHECK(stats().mem_alloc_async == before);
  CHECK_CU(D.free_async(p, s0));
  CHECK_CU(D.stream_destroy(s0));
  CHECK_CU(D.free(b));
  CHECK_CU(D.set_current(c1));
  CHECK_CU(D.stream_destroy(s1));
  return 0;
}

/* A program that configures a memory pool wants the pool's memory. */
static int pools_configured(void) {
  CUstream s;
  CUdeviceptr p = 0, q = 0;
  CUmemoryPool pool;
  CHECK_CU(D.stream_create(&s, 0));
  unsigned long before = stats().mem_alloc_async;
  CHECK_CU(D.alloc_async(&p, 4096, s));
  if (g_shim) CHECK(stats().mem_alloc_async == before); /* served by cachalloc */
  CHECK_CU(D.default_pool(&pool, 0));
  CHECK_CU(D.set_pool(0, pool));
  before = stats().mem_alloc_async;
  CHECK_CU(D.alloc_async(&q, 4096, s));
  CHECK(stats().mem_alloc_async == before + 1);
  CHECK_CU(D.free_async(q, s));
  CHECK_CU(D.free_async(p, s));
  CHECK_CU(D.stream_destroy(s));
  return 0;
}

/* No physical allocation handle for a block (its page would start at
 * another block), and no shareable handle type. */
static int allocation_handle(void) {
  CUdeviceptr p[NBUF];
  if (make_buffers(p)) return 1;
  CUmemGenericAllocationHandle h = 0;
  unsigned long long types = 99;
  for (size_t i = 0; i < NBUF; ++i) {
    CHECK(D.retain_handle(&h, (void*)(uintptr_t)(p[i] + 1)) == CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(D.attr(&types, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, p[i]));
    CHECK(types == 0);
  }
  for (size_t i = 0; i < NBUF; ++i) CHECK_CU(D.free(p[i]));
  return 0;
}

/* A dma-buf export keeps the block from being handed out again. */
static int dmabuf_export(void) {
  CUdeviceptr p[NBUF];
  if (make_buffers(p)) return 1;
  int fd = -1;
  CHECK_CU(D.dmabuf(&fd, p[1], kSizes[1], CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
  CHECK(fd >= 0);
  CHECK_CU(D.free(p[1]));
  for (int i = 0; i < 8; ++i) {
    CUdeviceptr q = 0;
    CHECK_CU(D.alloc(&q, kSizes[1]));
    if (g_shim) CHECK(q != p[1]); /* retained: never reused while its segment lives */
  }
  close(fd);
  return 0;
}

/* The program's own virtual memory works as ever; cachalloc's blocks are
 * cuMemAlloc memory to it, which the VM calls refuse. */
static int vmm_calls(void) {
  const size_t page = 2 * MiB;
  CUdeviceptr va = 0, p = 0;
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemAccessDesc rw = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CHECK_CU(D.reserve(&va, 2 * page, 0, 0, 0));
  CHECK_CU(D.mem_create(&h, page, &prop, 0));
  CHECK_CU(D.mem_map(va, page, 0, h, 0));
  CHECK_CU(D.set_access(va, page, &rw, 1));
  if (fill(va, 0x61, 4096)) return 1;
  CHECK(holds(va, 0x61, 4096));
  CHECK_CU(D.alloc(&p, 20 * MiB)); /* a block; a whole 20 MiB page under expandable segments */
  CHECK(D.mem_unmap(p, 20 * MiB) != CUDA_SUCCESS);
  CHECK(D.set_access(p, 20 * MiB, &rw, 1) != CUDA_SUCCESS);
  if (fill(p, 0x62, 20 * MiB)) return 1; /* still mapped and usable */
  CHECK(holds(p, 0x62, 20 * MiB));
  CHECK_CU(D.free(p));
  CHECK_CU(D.mem_unmap(va, page));
  CHECK_CU(D.mem_release(h));
  CHECK_CU(D.unreserve(va, 2 * page));
  return 0;
}

/* Green contexts are not supported: the first one is announced on stderr. */
static int green_context(void) {
  char path[] = "/tmp/fidelity-green-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  int saved = dup(2);
  dup2(fd, 2);
  CUgreenCtx g = NULL;
  CUdevResourceDesc desc = NULL;
  CUresult r = D.green_create(&g, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM);
  dup2(saved, 2);
  close(saved);
  char text[2048] = "";
  lseek(fd, 0, SEEK_SET);
  ssize_t n = read(fd, text, sizeof text - 1);
  text[n > 0 ? n : 0] = 0;
  close(fd);
  unlink(path);
  CHECK(r == CUDA_SUCCESS);
  CHECK((strstr(text, "does not support green contexts") != NULL) == g_shim);
  return 0;
}

/* ---------------- peer access (expandable segments) ---------------- */

static int peer_access(void) {
  CUcontext c1 = NULL;
  CUdevice d1 = 1;
  CHECK_CU(D.retain(&c1, d1));
  /* Access granted before device 1 allocated anything. */
  CHECK_CU(D.enable_peer(c1, 0)); /* from device 0 (current) to device 1 */
  CHECK_CU(D.set_current(c1));
  CUdeviceptr x = 0, y = 0;
  CHECK_CU(D.alloc(&x, 1000));
  int expect = g_shim ? 3 : -1; /* bare: cuMemAlloc memory, not cuMemMap'ed */
  CHECK(D.fake_vm_access(x, 0) == expect);
  CHECK_CU(D.alloc(&y, 30 * MiB)); /* new pages, later */
  CHECK(D.fake_vm_access(y, 0) == expect);
  CHECK(D.fake_vm_access(y + 25 * MiB, 0) == expect);
  /* Revoked on disable (from device 0's context). */
  CHECK_CU(D.set_current(g_ctx));
  CHECK_CU(D.disable_peer(c1));
  CHECK(D.fake_vm_access(x, 0) == (g_shim ? 0 : -1));
  CHECK(D.fake_vm_access(y, 0) == (g_shim ? 0 : -1));
  CHECK(D.enable_peer(c1, 0) == CUDA_SUCCESS);
  CHECK(D.fake_vm_access(y, 0) == expect);
  CHECK_CU(D.set_current(c1));
  CHECK_CU(D.free(x));
  CHECK_CU(D.free(y));
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  g_argv = argv;
  g_route = argv[1];
  g_shim = getenv("FIDELITY_SHIM") != NULL && strcmp(getenv("FIDELITY_SHIM"), "1") == 0;
  g_mode = g_shim ? "shim" : "bare";
  setvbuf(stderr, NULL, _IONBF, 0);
  if (!load_api(argv[1])) {
    fprintf(stderr, "the route could not reach every driver function\n");
    return 1;
  }
  const char* b = argv[2];
  if (strcmp(b, "ipc_import") == 0) return ipc_import(argc - 3, argv + 3);
  if (setup()) return 1;
  if (strcmp(b, "address_range") == 0) return address_range();
  if (strcmp(b, "pointer_attributes") == 0) return pointer_attributes();
  if (strcmp(b, "freed_attributes") == 0) return freed_attributes();
  if (strcmp(b, "ipc_shim_importer") == 0) return ipc_export(0);
  if (strcmp(b, "ipc_bare_importer") == 0) return ipc_export(1);
  if (strcmp(b, "ipc_expandable") == 0) return ipc_expandable();
  if (strcmp(b, "ipc_layout") == 0) return ipc_layout();
  if (strcmp(b, "ipc_probe_once") == 0) return ipc_probe_once();
  if (strcmp(b, "ipc_probe_capture") == 0) return ipc_probe_capture();
  if (strcmp(b, "primary_reset") == 0) return primary_reset();
  if (strcmp(b, "ctx_destroy") == 0) return ctx_destroy();
  if (strcmp(b, "ctx_detach") == 0) return ctx_detach();
  if (strcmp(b, "capture_free") == 0) return capture_free();
  if (strcmp(b, "other_context_stream") == 0) return other_context_stream();
  if (strcmp(b, "pools_configured") == 0) return pools_configured();
  if (strcmp(b, "allocation_handle") == 0) return allocation_handle();
  if (strcmp(b, "dmabuf_export") == 0) return dmabuf_export();
  if (strcmp(b, "vmm_calls") == 0) return vmm_calls();
  if (strcmp(b, "green_context") == 0) return green_context();
  if (strcmp(b, "primary_release") == 0) return primary_release();
  if (strcmp(b, "peer_access") == 0) return peer_access();
  fprintf(stderr, "unknown behaviour %s\n", b);
  return 2;
}
