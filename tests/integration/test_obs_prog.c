/* test_obs_prog.c — a small driver-API program for test_obs_shim.sh: it
 * allocates N buffers of (i+1)*1000 bytes with cuMemAlloc_v2, frees the even
 * ones with cuMemFree_v2, and ends the way argv[1] says:
 *   exit | return | sigterm | nocuda (never touches CUDA)
 *   usr2  raise SIGUSR2, then _exit(0) (so only the signal can write a file)
 *   oom   then ask for 1 TiB, expect CUDA_ERROR_OUT_OF_MEMORY, exit(0)
 * It prints "done" on stdout before ending, so the test can check that the
 * program's own output survives. */
#include <cuda.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "test_obs_prog: %s failed: %d\n", what, (int)r);
    exit(2);
  }
  return 0;
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "exit";
  int n = argc > 2 ? atoi(argv[2]) : 10;
  if (strcmp(mode, "nocuda") != 0) {
    CUdevice dev;
    CUcontext ctx;
    check(cuInit(0), "cuInit");
    check(cuDeviceGet(&dev, 0), "cuDeviceGet");
    check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    CUdeviceptr* ptrs = calloc((size_t)n, sizeof *ptrs);
    for (int i = 0; i < n; ++i) check(cuMemAlloc_v2(&ptrs[i], (size_t)(i + 1) * 1000), "cuMemAlloc_v2");
    for (int i = 0; i < n; i += 2) check(cuMemFree_v2(ptrs[i]), "cuMemFree_v2");
    free(ptrs);
  }
  printf("done\n");
  fflush(stdout);
  if (strcmp(mode, "oom") == 0) {
    CUdeviceptr p;
    CUresult r = cuMemAlloc_v2(&p, (size_t)1 << 40);
    exit(r == CUDA_ERROR_OUT_OF_MEMORY ? 0 : 4);
  }
  if (strcmp(mode, "usr2") == 0) {
    raise(SIGUSR2);
    _exit(0);
  }
  if (strcmp(mode, "exit") == 0) exit(0);
  if (strcmp(mode, "sigterm") == 0) {
    raise(SIGTERM);
    return 3; /* not reached */
  }
  return 0;
}
