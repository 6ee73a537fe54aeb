#!/bin/sh
# untouched_programs.sh — libcachalloc.so preloaded into programs that never
# use CUDA (a shell, Python, the C compiler and the processes it runs) has
# no effect: the same stdout, stderr and exit status as without it, no file
# written (even with every report asked for, or a bad configuration), and no
# libcuda loaded in any process of the tree (the dynamic loader's own log,
# LD_DEBUG=files, says which libraries each process opened).
# Usage: untouched_programs.sh LIBCACHALLOC
set -u
lib=$1
work=$(mktemp -d) || exit 1
trap 'rm -rf "$work"' EXIT
fail() { echo "untouched_programs: $*" >&2; exit 1; }
mkdir "$work/cwd" "$work/reports" "$work/ld"
cd "$work/cwd" || exit 1
cat > hello.c <<'EOF'
#include <stdio.h>
int main(void) { puts("hello"); return 0; }
EOF

# run NAME CONF CMD...: runs CMD with the shim (and CONF), then without,
# in the same directory; compares what they printed and their exit status.
run() {
  name=$1 conf=$2
  shift 2
  "$@" > "$work/bare.out" 2> "$work/bare.err"
  bare_rc=$?
  [ -f a.o ] && mv a.o "$work/bare.o"
  LD_PRELOAD=$lib CACHALLOC_CONF=$conf "$@" > "$work/shim.out" 2> "$work/shim.err"
  shim_rc=$?
  [ "$bare_rc" -eq "$shim_rc" ] || fail "$name (conf '$conf'): exit status $shim_rc under the shim, $bare_rc without"
  cmp -s "$work/bare.out" "$work/shim.out" || fail "$name (conf '$conf'): stdout differs: $(diff "$work/bare.out" "$work/shim.out" | head -5)"
  cmp -s "$work/bare.err" "$work/shim.err" || fail "$name (conf '$conf'): stderr differs: $(diff "$work/bare.err" "$work/shim.err" | head -5)"
  if [ -f a.o ]; then
    cmp -s a.o "$work/bare.o" || fail "$name: the compiler's output differs under the shim"
    rm -f a.o "$work/bare.o"
  fi
  [ -z "$(ls -A "$work/reports")" ] || fail "$name (conf '$conf'): files written: $(ls -A "$work/reports")"
  [ "$(ls -A)" = "hello.c" ] || fail "$name (conf '$conf'): files written in the working directory: $(ls -A)"
}

# libs NAME CMD...: with the shim, every process the command starts opened
# libcachalloc (the preload was active) and none opened libcuda.
libs() {
  name=$1
  shift
  rm -f "$work/ld"/*
  LD_PRELOAD=$lib CACHALLOC_CONF="stats:$work/reports/s.json" LD_DEBUG=files LD_DEBUG_OUTPUT="$work/ld/log" \
    "$@" > /dev/null 2>&1
  set -- "$work/ld"/log.*
  [ -e "$1" ] || fail "$name: the loader wrote no log (LD_DEBUG unsupported?)"
  for f in "$@"; do
    grep -q 'libcachalloc' "$f" || fail "$name: a process without the preload ($f)"
    grep -q 'libcuda' "$f" && fail "$name: libcuda was loaded: $(grep libcuda "$f" | head -2)"
  done
  rm -f a.o
  [ -z "$(ls -A "$work/reports")" ] || fail "$name: files written: $(ls -A "$work/reports")"
}

all_reports="stats:$work/reports/s-%p.json,snapshot:$work/reports/snap.json,snapshot_signal:USR2,trace:$work/reports/t.json,log_file:$work/reports/log.txt,log_level:trace"
for conf in "" "stats:stderr" "$all_reports" "not_a_key:1" "max_split_size_mb:1"; do
  run "sh -c" "$conf" /bin/sh -c 'echo out; echo err >&2; exit 3'
  run "sh -c pipeline" "$conf" /bin/sh -c 'printf "b\na\n" | sort | head -1'
  if command -v python3 > /dev/null 2>&1; then
    run "python3 -c" "$conf" python3 -c 'import sys, ctypes, os; print(sys.version_info[0], os.getcwd() != ""); sys.exit(5)'
  fi
  if command -v cc > /dev/null 2>&1; then
    run "cc --version" "$conf" cc --version
    run "cc -c" "$conf" cc -O2 -c hello.c -o a.o
  fi
done

libs "sh -c" /bin/sh -c 'echo x | cat'
if command -v python3 > /dev/null 2>&1; then
  libs "python3 -c" python3 -c 'import json, ctypes; print(json.dumps([1]))'
fi
if command -v cc > /dev/null 2>&1; then
  libs "cc --version" cc --version
  libs "cc hello.c" cc hello.c -o "$work/hello"
  libs "the compiled program" "$work/hello"
fi
exit 0
