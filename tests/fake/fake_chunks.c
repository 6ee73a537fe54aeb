/* fake_chunks.c — small cuMemAllocs share 2 MiB mappings, as the real driver's do.
 *
 * Measured on an H100 (driver 580): cuMemAlloc requests up to 1 MiB are
 * placed first fit, at 512 B granularity, inside 2 MiB mappings that
 * several allocations share (512 B, 1 KiB, 1.5 KiB and 100 B in a row land
 * at offsets 0, 0x200, 0x600 and 0xc00 of one mapping), a freed place is
 * reused at once, and a 2 MiB request gets a mapping of its own.  Such an
 * allocation's CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR / MAPPING_SIZE /
 * MEMORY_BLOCK_ID name the shared mapping, and its IPC handle is the
 * mapping's with the allocation's size and offset (fake_ipc.c): the
 * handles of two allocations of one mapping differ in those two fields only.
 * FAKE_CUDA_SUBALLOC_MAX (bytes, default 1 MiB; 0: never) is the largest
 * request placed so, for tests of a driver that gives every allocation a
 * mapping of its own.  A chunk is unmapped when its last allocation goes
 * (an importer's mapping of it stays valid). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_state.h"

#define UNITS (ALLOC_PAGE / SUBALLOC_UNIT)

static int is_used(const struct chunk* c, size_t u) { return (c->used[u / 8] >> (u % 8)) & 1; }
static void set_used(struct chunk* c, size_t from, size_t n, int on) {
  for (size_t u = from; u < from + n; ++u) {
    if (on) c->used[u / 8] |= (unsigned char)(1u << (u % 8));
    else c->used[u / 8] &= (unsigned char)~(1u << (u % 8));
  }
}

/* The first run of `n` free units in c, or UNITS when none. */
static size_t first_fit(const struct chunk* c, size_t n) {
  size_t run = 0;
  for (size_t u = 0; u < UNITS; ++u) {
    run = is_used(c, u) ? 0 : run + 1;
    if (run == n) return u + 1 - n;
  }
  return UNITS;
}

static struct chunk* new_chunk(struct CUctx_st* ctx) {
  struct chunk* c = calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  c->id = fake.next_buffer_id++;
  c->base = fake_map_memfd(c->id, ALLOC_PAGE, &c->fd);
  if (c->base == NULL) {
    free(c);
    return NULL;
  }
  c->ctx = ctx;
  c->next = fake.chunks;
  fake.chunks = c;
  return c;
}

size_t fake_suballoc_max(void) {
  static size_t max = (size_t)-1;
  if (max == (size_t)-1) max = fake_env_size("FAKE_CUDA_SUBALLOC_MAX", (size_t)1 << 20);
  return max;
}

int fake_chunk_place(struct allocation* a) {
  const size_t n = a->rounded / SUBALLOC_UNIT;
  struct chunk* c = fake.chunks;
  size_t at = UNITS;
  for (; c != NULL; c = c->next)
    if (c->ctx == a->ctx && (at = first_fit(c, n)) < UNITS) break;
  if (c == NULL) {
    c = new_chunk(a->ctx);
    if (c == NULL) return 0;
    at = 0;
  }
  set_used(c, at, n, 1);
  c->users++;
  a->chunk = c;
  a->offset = at * SUBALLOC_UNIT;
  a->ptr = (char*)c->base + a->offset;
  a->mapping = ALLOC_PAGE;
  a->fd = c->fd;
  a->map_id = c->id;
  return 1;
}

void fake_chunk_release(struct allocation* a) {
  struct chunk* c = a->chunk;
  set_used(c, a->offset / SUBALLOC_UNIT, a->rounded / SUBALLOC_UNIT, 0);
  if (--c->users != 0) return;
  struct chunk** p = &fake.chunks;
  while (*p != c) p = &(*p)->next;
  *p = c->next;
  munmap(c->base, ALLOC_PAGE);
  close(c->fd);
  free(c);
}
