/* gpu_probe.c — exits 0 when a real CUDA driver sees at least one GPU, 77
 * (meson's "skipped") otherwise.  The gpu suite runs it before each test, so
 * on a machine without a GPU every GPU test reports SKIP, never FAIL.  It
 * dlopens libcuda.so.1 (nothing to link) and uses cuInit/cuDeviceGetCount. */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>

int main(void) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  CUresult (*init)(unsigned);
  CUresult (*count)(int*);
  int n = 0;
  if (!h) {
    printf("gpu_probe: no libcuda.so.1 (%s)\n", dlerror());
    return 77;
  }
  *(void**)&init = dlsym(h, "cuInit");
  *(void**)&count = dlsym(h, "cuDeviceGetCount");
  if (!init || !count) {
    printf("gpu_probe: libcuda.so.1 lacks cuInit/cuDeviceGetCount\n");
    return 77;
  }
  if (init(0) != CUDA_SUCCESS || count(&n) != CUDA_SUCCESS || n < 1) {
    printf("gpu_probe: the CUDA driver reports no usable GPU\n");
    return 77;
  }
  printf("gpu_probe: %d GPU(s)\n", n);
  return 0;
}
