/* late_plugin.c — a plugin linked against libcuda that a program dlopens
 * after its first allocation: it binds at link time a driver name newer
 * than cachalloc's headers (the fake's cuFutureWork_ptsz), loads its
 * module, then puts work on the calling thread's per-thread stream through
 * that name.  No hook sees the work; the module load is when cachalloc
 * reads the plugin's imports (shim/link_imports.h). */
#include <cuda.h>

CUresult cuFutureWork_ptsz(void* a, int b, size_t c, void* d, unsigned e, CUstream s);

__attribute__((visibility("default"))) CUresult plugin_start(void) {
  CUmodule module;
  return cuModuleLoadData(&module, "fake image");
}

__attribute__((visibility("default"))) CUresult plugin_work(void) {
  return cuFutureWork_ptsz(NULL, 1, 2, NULL, 3, NULL);
}
