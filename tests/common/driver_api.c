/* driver_api.c — see driver_api.h. */
#define _GNU_SOURCE
#include "driver_api.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include <cuda.h>
#include <cudaTypedefs.h>

static void* g_libcuda;
static PFN_cuGetProcAddress_v12000 g_gpa; /* route proc; NULL for dlsym */

int driver_api_open(const char* route) {
  g_libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (g_libcuda == NULL) return 0;
  if (strcmp(route, "proc") == 0) {
    PFN_cuGetProcAddress_v12000 entry = (PFN_cuGetProcAddress_v12000)dlsym(g_libcuda, "cuGetProcAddress_v2");
    CUdriverProcAddressQueryResult status;
    if (entry == NULL || entry("cuGetProcAddress", (void**)&g_gpa, 12000, 0, &status) != CUDA_SUCCESS) return 0;
  }
  return 1;
}

void* driver_api_lookup(const char* base, const char* exported, int version) {
  void* fn = NULL;
  if (g_gpa != NULL) {
    CUdriverProcAddressQueryResult status;
    if (g_gpa(base, &fn, version, 0, &status) != CUDA_SUCCESS) fn = NULL;
  } else {
    fn = dlsym(g_libcuda, exported);
  }
  if (fn == NULL) fprintf(stderr, "lookup of %s failed\n", exported);
  return fn;
}

void* driver_api_symbol(const char* name) { return dlsym(g_libcuda, name); }

int driver_api_complete(const void* table, size_t size) {
  void* const* slots = (void* const*)table;
  for (size_t i = 0; i < size / sizeof(void*); ++i)
    if (slots[i] == NULL) return 0;
  return 1;
}
