#!/usr/bin/env bash
# main-job.sh — the README's first command: installs what is missing, builds,
# and runs an example CUDA program under cachalloc, showing the statistics
# cachalloc prints at exit.
#
# With a GPU: the runtime-API example (nvcc, static cudart) and the driver-API
# example run on the device.  Without one: says so, and runs the same
# driver-API example against the test suite's fake libcuda.so.1 (host memory
# standing in for device memory), so the shim is still seen at work.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
if [ ! -f build/build.ninja ]; then meson setup build >/dev/null; fi
ninja -C build >/dev/null
launcher=build/scripts/cachalloc
conf="stats:stderr"

have_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1
}

if have_gpu; then
  echo "== GPU: $(nvidia-smi -L | head -1)"
  if [ -x build/examples/alloc_patterns_static ]; then
    echo "== build/examples/alloc_patterns_static under cachalloc (--conf $conf)"
    "$launcher" --conf "$conf" -- build/examples/alloc_patterns_static
  fi
  echo "== build/examples/driver_patterns under cachalloc (--conf $conf)"
  exec "$launcher" --conf "$conf" -- build/examples/driver_patterns
fi

cat <<'MSG'
== No GPU on this machine (nvidia-smi finds none).
   Running the same driver-API example (examples/driver_patterns.c) against
   the test suite's fake libcuda.so.1 (tests/fake/fake_*.c: host memory
   stands in for device memory), so you can see the shim intercept and cache
   its allocations and print its statistics at exit.
MSG
echo "== build/examples/driver_patterns under cachalloc (--conf $conf), fake driver"
LD_LIBRARY_PATH="$PWD/build/tests/fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  exec "$launcher" --conf "$conf" -- build/examples/driver_patterns
