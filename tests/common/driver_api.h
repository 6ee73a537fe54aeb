/* driver_api.h — the driver's entry points, looked up the way real clients
 * look them up, for the test programs that do not link against libcuda.
 *
 * Several test programs (integration/fidelity.c, integration/faults.c,
 * integration/pluggable.c, stress/control_api.c) dlopen libcuda.so.1 (the
 * fake one) themselves and fetch each entry point through one of two routes:
 *   proc   static cudart's: cuGetProcAddress_v2 from the library, then every
 *          entry point by its base name and CUDA version through the
 *          cuGetProcAddress that it hands out
 *   dlsym  numba's and JAX's: dlsym of the exported (versioned) symbol on
 *          the libcuda handle
 * Under the shim both routes reach its hooks.  This is that machinery, once;
 * each program keeps its own table of the entry points it needs (a struct of
 * function pointers filled with DRIVER_API_ENTRY).
 *
 * One libcuda handle per process; not thread-safe while opening. */
#ifndef CACHALLOC_TESTS_DRIVER_API_H
#define CACHALLOC_TESTS_DRIVER_API_H

#include <stddef.h>

/* dlopens libcuda.so.1 (RTLD_NOW | RTLD_LOCAL) and selects the route:
 * "proc" is cuGetProcAddress, anything else dlsym.  Returns 1, or 0 when
 * the library or (route proc) cuGetProcAddress cannot be had. */
int driver_api_open(const char* route);

/* An entry point through the route: base name and version for proc, the
 * exported symbol for dlsym.  NULL, with a message on stderr, when the route
 * does not have it. */
void* driver_api_lookup(const char* base, const char* exported, int version);

/* dlsym of `name` on the libcuda handle, whatever the route (the fake's own
 * test controls, or a program that only ever uses dlsym). */
void* driver_api_symbol(const char* name);

/* 1 when every pointer of `table` (a struct of nothing but pointers, `size`
 * bytes) is set, else 0. */
int driver_api_complete(const void* table, size_t size);

/* table.field = the entry point through the route. */
#define DRIVER_API_ENTRY(table, field, base, exported, version) \
  (*(void**)&(table).field = driver_api_lookup(base, exported, version))

#endif
