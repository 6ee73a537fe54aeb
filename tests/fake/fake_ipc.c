/* fake_ipc.c — IPC memory handles and dma-buf file descriptors.
 *
 * The handle, as the real driver lays out the fields the shim relies on:
 *   [0,8)   the exporting context        [16,24) the requested size
 *   [24,28) the mapping's size / 4096    [28,32) the offset inside it
 *   [56,64) zero
 * and the fake's own fields in the rest:
 *   [8,12)  exporter pid   [12,16) its fd   [32,40) "fakeipc"
 *   [40,48) the memfd's buffer id   [48,56) zero
 * A small allocation in a shared mapping (fake_chunks.c) gets the mapping's
 * handle with its own size and offset, as on the real driver (measured:
 * such handles differ in those two fields only).  FAKE_CUDA_IPC_LAYOUT
 * gives the handle another layout, that of a driver cachalloc does not know:
 *   offset_moved  the offset at [48,52); [28,32) stays zero
 *   size_moved    the size at [48,56); [16,24) holds it rounded up to 512 B
 * The importer maps the page-aligned part of the exporter's memfd (reached
 * through /proc/<pid>/fd/<fd>) that covers [offset, offset + size).  Opening
 * and closing follow the real driver's reference rules (measured on an
 * H100); a dma-buf export is a duplicate of the allocation's memfd. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_state.h"

static const char ipc_magic[8] = "fakeipc";

struct import* fake_find_import(CUdeviceptr p) {
  for (struct import* m = fake.imports; m; m = m->next)
    if (p >= m->ptr && p - m->ptr < m->size) return m;
  return NULL;
}

void fake_drop_imports_of(struct CUctx_st* c) {
  for (struct import** p = &fake.imports; *p;) {
    struct import* m = *p;
    if (m->ctx != c) { p = &m->next; continue; }
    *p = m->next;
    munmap(m->map, m->map_len);
    free(m);
  }
}

/* ---------------- the handle ---------------- */

struct ipc_fields {
  uint64_t ctx, size, buffer_id;
  uint32_t pid, fd, pages, offset;
};

static void put(unsigned char* h, int at, const void* v, size_t n) { memcpy(h + at, v, n); }
static void get(const unsigned char* h, int at, void* v, size_t n) { memcpy(v, h + at, n); }

/* Where the size and offset lie, and where the size rounded up to 512 B
 * does (-1: nowhere), by FAKE_CUDA_IPC_LAYOUT (read once). */
struct layout { int size_at, offset_at, rounded_at; };
static struct layout handle_layout(void) {
  static const struct layout driver = {16, 28, -1}, offset_moved = {16, 48, -1}, size_moved = {48, 28, 16};
  const char* v = getenv("FAKE_CUDA_IPC_LAYOUT");
  if (v != NULL && strcmp(v, "offset_moved") == 0) return offset_moved;
  if (v != NULL && strcmp(v, "size_moved") == 0) return size_moved;
  return driver;
}

static void encode_handle(unsigned char* h, const struct ipc_fields* f) {
  const struct layout l = handle_layout();
  memset(h, 0, CU_IPC_HANDLE_SIZE);
  put(h, 0, &f->ctx, 8);
  put(h, 8, &f->pid, 4);
  put(h, 12, &f->fd, 4);
  put(h, l.size_at, &f->size, 8);
  put(h, 24, &f->pages, 4);
  put(h, l.offset_at, &f->offset, 4);
  put(h, 32, ipc_magic, 8);
  put(h, 40, &f->buffer_id, 8);
  if (l.rounded_at >= 0) {
    uint64_t rounded = fake_round_up(f->size, 512);
    put(h, l.rounded_at, &rounded, 8);
  }
}

static void decode_handle(const unsigned char* h, struct ipc_fields* f) {
  const struct layout l = handle_layout();
  get(h, 0, &f->ctx, 8);
  get(h, 8, &f->pid, 4);
  get(h, 12, &f->fd, 4);
  get(h, l.size_at, &f->size, 8);
  get(h, 24, &f->pages, 4);
  get(h, l.offset_at, &f->offset, 4);
  get(h, 40, &f->buffer_id, 8);
}

/* The whole allocation whatever pointer inside it names it (in a shared
 * mapping: the mapping's handle with the allocation's size and offset);
 * VM memory, imports and unknown pointers are CUDA_ERROR_INVALID_VALUE. */
EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle* h, CUdeviceptr p) {
  if (h == NULL) return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  CUresult r = fake_check_current();
  struct allocation* a = r == CUDA_SUCCESS ? fake_find_allocation(p) : NULL;
  if (r == CUDA_SUCCESS && a == NULL) r = CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS) {
    struct ipc_fields f = {(uint64_t)(uintptr_t)a->ctx, a->size, a->map_id, (uint32_t)getpid(),
                           (uint32_t)a->fd, (uint32_t)(a->mapping / PAGE), (uint32_t)a->offset};
    encode_handle((unsigned char*)h->reserved, &f);
    fake.stats.ipc_get++;
  }
  fake_unlock();
  return r;
}

/* The exporter's memfd, checked by name against the handle's buffer id
 * (the fd number may have been reused since); -1 when gone. */
static int open_exporter_fd(const struct ipc_fields* f) {
  char path[64], link[128], want[48];
  snprintf(path, sizeof path, "/proc/%u/fd/%u", f->pid, f->fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return -1;
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, link, sizeof link - 1);
  link[n > 0 ? n : 0] = 0;
  snprintf(want, sizeof want, "/memfd:");
  fake_memfd_name(want + 7, sizeof want - 7, f->buffer_id);
  size_t len = strlen(want);
  if (strncmp(link, want, len) != 0 || (link[len] != 0 && link[len] != ' ')) {
    close(fd);
    return -1;
  }
  return fd;
}

static CUresult map_import(CUdeviceptr* out, const unsigned char* h, const struct ipc_fields* f) {
  int fd = open_exporter_fd(f);
  if (fd < 0) return CUDA_ERROR_INVALID_VALUE;
  size_t start = f->offset / PAGE * PAGE;
  size_t len = fake_round_up(f->offset + f->size, PAGE) - start;
  void* p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)start);
  close(fd);
  if (p == MAP_FAILED) return CUDA_ERROR_INVALID_VALUE;
  struct import* m = calloc(1, sizeof *m);
  memcpy(m->handle, h, CU_IPC_HANDLE_SIZE);
  m->map = p;
  m->map_len = len;
  m->ptr = (CUdeviceptr)(uintptr_t)p + (f->offset - start);
  m->size = f->size;
  m->pid = (pid_t)f->pid;
  m->source_id = f->buffer_id;
  m->offset = f->offset;
  m->refs = 1;
  m->ctx = fake_current;
  m->buffer_id = fake.next_buffer_id++;
  m->next = fake.imports;
  fake.imports = m;
  *out = m->ptr;
  return CUDA_SUCCESS;
}

/* The same handle again: the same pointer, one more reference.  Another
 * handle overlapping an open part of the same exporter allocation:
 * CUDA_ERROR_ALREADY_MAPPED.  Own handles: CUDA_ERROR_INVALID_CONTEXT. */
static CUresult open_handle(CUdeviceptr* out, const unsigned char* h, unsigned flags) {
  CUresult r = fake_check_current();
  if (r != CUDA_SUCCESS) return r;
  struct ipc_fields f;
  decode_handle(h, &f);
  if ((flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) || memcmp(h + 32, ipc_magic, 8) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (f.pid == (uint32_t)getpid()) return CUDA_ERROR_INVALID_CONTEXT;
  uint64_t mapped = (uint64_t)f.pages * PAGE;
  if (f.size == 0 || f.size > mapped || f.offset > mapped - f.size) return CUDA_ERROR_INVALID_VALUE;
  for (struct import* m = fake.imports; m; m = m->next)
    if (memcmp(m->handle, h, CU_IPC_HANDLE_SIZE) == 0) {
      m->refs++;
      *out = m->ptr;
      return CUDA_SUCCESS;
    }
  for (struct import* m = fake.imports; m; m = m->next)
    if (m->pid == (pid_t)f.pid && m->source_id == f.buffer_id && f.offset < m->offset + m->size &&
        m->offset < f.offset + f.size)
      return CUDA_ERROR_ALREADY_MAPPED;
  return map_import(out, h, &f);
}

EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* out, CUipcMemHandle h, unsigned int flags) {
  if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  CUresult r = open_handle(out, (const unsigned char*)h.reserved, flags);
  if (r == CUDA_SUCCESS) fake.stats.ipc_open++;
  else fake.stats.ipc_open_refused++;
  fake_unlock();
  return r;
}
EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr* out, CUipcMemHandle h, unsigned int flags) {
  return cuIpcOpenMemHandle_v2(out, h, flags);
}

/* Drops one reference; the last unmaps. */
EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
  fake_lock();
  struct import** at = &fake.imports;
  while (*at && (*at)->ptr != p) at = &(*at)->next;
  struct import* m = *at;
  if (m != NULL) {
    fake.stats.ipc_close++;
    if (--m->refs == 0) {
      *at = m->next;
      munmap(m->map, m->map_len);
      free(m);
    }
  }
  fake_unlock();
  return m != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---------------- dma-buf ---------------- */

/* A duplicate of the allocation's memfd, which keeps its memory alive
 * after the free, as the real driver does while the fd is open. */
EXPORT CUresult cuMemGetHandleForAddressRange(void* handle, CUdeviceptr dptr, size_t size, CUmemRangeHandleType type,
                                              unsigned long long flags) {
  (void)type;
  (void)flags;
  if (handle == NULL || size == 0) return CUDA_ERROR_INVALID_VALUE;
  fake_lock();
  struct allocation* a = fake_find_allocation(dptr);
  int fd = -1;
  if (a != NULL && dptr + size <= (CUdeviceptr)(uintptr_t)a->ptr + a->size) fd = dup(a->fd);
  fake_unlock();
  if (fd < 0) return CUDA_ERROR_INVALID_VALUE;
  *(int*)handle = fd;
  return CUDA_SUCCESS;
}
