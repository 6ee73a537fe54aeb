/* probe_untouched.c — a non-CUDA program that checks, at its end, that the
 * preloaded shim left it alone: libcachalloc is mapped (so the preload was
 * active), libcuda is not, and the process still has exactly one thread.
 * Prints nothing; exit 0 when untouched, 1 otherwise (reason on stderr). */
#include <dirent.h>
#include <stdio.h>
#include <string.h>

static int maps_contain(const char* needle) {
  FILE* f = fopen("/proc/self/maps", "r");
  char line[4096];
  int found = 0;
  if (f == NULL) return -1;
  while (fgets(line, sizeof line, f) != NULL)
    if (strstr(line, needle) != NULL) found = 1;
  fclose(f);
  return found;
}

static int thread_count(void) {
  DIR* d = opendir("/proc/self/task");
  struct dirent* e;
  int n = 0;
  if (d == NULL) return -1;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

int main(void) {
  if (maps_contain("libcachalloc") != 1) {
    fprintf(stderr, "probe: libcachalloc is not preloaded\n");
    return 1;
  }
  if (maps_contain("libcuda") != 0) {
    fprintf(stderr, "probe: libcuda was loaded into a non-CUDA process\n");
    return 1;
  }
  if (thread_count() != 1) {
    fprintf(stderr, "probe: %d threads, expected 1\n", thread_count());
    return 1;
  }
  return 0;
}
