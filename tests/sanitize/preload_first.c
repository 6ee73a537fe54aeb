/* preload_first.c — `meson test --wrapper` for the sanitizer builds.
 *
 *   preload-first RUNTIME PROGRAM [ARGS...]
 *
 * Runs PROGRAM with ARGS.  When LD_PRELOAD names libcachalloc.so (the
 * integration tests preload the shim that way), RUNTIME — the sanitizer's
 * shared runtime, e.g. `gcc -print-file-name=libasan.so` — is put first in
 * LD_PRELOAD: ASan and TSan must be the first library of the process, and a
 * preloaded library comes before the program's own DT_NEEDED runtime.
 *
 * meson starts the wrapper itself with the test's environment, so the
 * wrapper sees LD_PRELOAD=<the sanitized shim> too.  It is linked
 * statically (scripts/test.sh builds it): the dynamic loader, and with it
 * LD_PRELOAD, never touches a static program, so the wrapper runs
 * unchanged whatever the test preloads.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s RUNTIME PROGRAM [ARGS...]\n", argv[0]);
    return 2;
  }
  const char* runtime = argv[1];
  const char* preload = getenv("LD_PRELOAD");
  if (preload != NULL && strstr(preload, "libcachalloc.so") != NULL && strstr(preload, runtime) == NULL) {
    size_t n = strlen(runtime) + 1 + strlen(preload) + 1;
    char* value = malloc(n);
    if (value == NULL) return 2;
    snprintf(value, n, "%s:%s", runtime, preload);
    setenv("LD_PRELOAD", value, 1);
  }
  execvp(argv[2], argv + 2);
  fprintf(stderr, "%s: cannot run %s: %s\n", argv[0], argv[2], strerror(errno));
  return 127;
}
