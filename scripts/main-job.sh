#!/usr/bin/env bash
# main-job.sh — the README's first command: installs what is missing, builds
# what the demo needs, and runs an example CUDA program under cachalloc, then
# says in a few sentences what cachalloc did (the full statistics are in a
# JSON dump it names).
#
# With a GPU: the runtime-API example (nvcc, static cudart) and the driver-API
# example run on the device.  Without one: says so, and runs the same
# driver-API example against the test suite's fake libcuda.so.1 (host memory
# standing in for device memory), so the shim is still seen at work.
#
# The build lives in build-demo/, configured without the tests, the
# benchmarks and debug information (-g costs a quarter of the compile time)
# and at -O1 (another quarter; the demo measures nothing that -O2 changes),
# and only the demo's targets are built (57 s on two idle cores from a
# fresh clone, 2026-11-25; later runs reuse it).  scripts/test.sh builds in
# build/ and its siblings.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
dir=build-demo

have_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1
}

# Configures build-demo/ once; on failure shows meson's own words.
configure() {
  [ -f "$dir/build.ninja" ] && return 0
  echo "== configuring $dir/ (meson setup -Dtests=false -Dbench=false -Ddebug=false -Doptimization=1)"
  if ! meson setup "$dir" -Dtests=false -Dbench=false -Ddebug=false -Doptimization=1 >"$dir.setup.log" 2>&1; then
    echo "== meson setup failed; its output ($dir.setup.log):" >&2
    cat "$dir.setup.log" >&2
    rm -rf "$dir"  # the next run configures again
    exit 1
  fi
}

# One progress line: rewritten in place on a terminal, every tenth of the way
# in a log.  Reads ninja's "[done/total] description" lines.
progress() {
  local tty=0
  [ -t 1 ] && tty=1
  awk -v tty="$tty" '
    match($0, /^\[[0-9]+\/[0-9]+\] /) {
      split(substr($0, 2, RLENGTH - 3), n, "/")
      line = sprintf("   [%d/%d] %s", n[1], n[2], substr($0, RLENGTH + 1))
      if (tty) { printf "\r\033[K%s", substr(line, 1, 100); fflush() }
      else if (int(10 * n[1] / n[2]) > shown || n[1] == n[2]) {
        shown = int(10 * n[1] / n[2]); print line; fflush()
      }
    }
    END { if (tty && NR) print "" }'
}

# Builds the given targets; on failure prints the failing command and the
# compiler's output (ninja's FAILED: block) and where the whole log is.
build() {
  local log="$dir/main-job-build.log" status
  echo "== building ${*} in $dir/"
  set +e
  NINJA_STATUS='[%f/%t] ' ninja -C "$dir" "$@" 2>&1 | tee "$log" | progress
  status=${PIPESTATUS[0]}
  set -e
  if [ "$status" -ne 0 ]; then
    echo "== build failed (ninja exit status $status); the failing command and its output:" >&2
    if grep -q '^FAILED: ' "$log"; then
      sed -n '/^FAILED: /,$p' "$log" >&2
    else
      tail -40 "$log" >&2
    fi
    echo "== the whole build log: $log" >&2
    exit 1
  fi
}

# run NAME PROGRAM: PROGRAM under the launcher, its dump in build-demo/, then
# the plain account of it.
run() {
  local name=$1 dump="$dir/main-job-$1.json"
  shift
  rm -f "$dump"
  echo "== $* under cachalloc (--conf stats:$dump)"
  "$dir/scripts/cachalloc" --conf "stats:$dump" -- "$@"
  echo "== What cachalloc did"
  python3 scripts/cachalloc-report brief "$dump" | sed 's/^/   /'
}

configure
targets=(shim/libcachalloc.so examples/driver_patterns)
if have_gpu; then
  gpu=$(nvidia-smi -L | head -1)
  # the nvcc example exists where nvcc was found at configure time
  if ninja -C "$dir" -t query examples/alloc_patterns_static >/dev/null 2>&1; then
    targets+=(examples/alloc_patterns_static)
  fi
  build "${targets[@]}"
  echo "== GPU: $gpu"
  if [ -x "$dir/examples/alloc_patterns_static" ]; then
    run alloc_patterns "$dir/examples/alloc_patterns_static"
  fi
  run driver_patterns "$dir/examples/driver_patterns"
  exit 0
fi

build "${targets[@]}" tests/fake/libcuda.so.1
cat <<'MSG'
== No GPU on this machine (nvidia-smi finds none).
   Running the same driver-API example (examples/driver_patterns.c) against
   the test suite's fake libcuda.so.1 (tests/fake/fake_*.c: host memory
   stands in for device memory), so you can see the shim intercept and cache
   its allocations.
MSG
export LD_LIBRARY_PATH="$PWD/$dir/tests/fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
run driver_patterns "$dir/examples/driver_patterns"
cat <<'MSG'
   (The fake driver answers in about a microsecond; on an H100 a real
   cudaMalloc+cudaFree pair of 1 MiB costs about 73 us, docs/BENCHMARKS.md
   section 4.)
MSG
