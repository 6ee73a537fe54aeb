#!/bin/sh
# untouched.sh — a process that never calls CUDA is untouched by the shim:
# no output, no file written, no libcuda loaded, no thread, same exit status.
# Usage: untouched.sh LIBCACHALLOC PROBE
set -u
lib=$1
probe=$2
work=$(mktemp -d) || exit 1
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
fail() { echo "untouched: $*" >&2; exit 1; }

# Even with reports asked for, or with a bad configuration, nothing happens
# until CUDA is used.
for conf in "" "stats:stderr" "not_a_key:1"; do
  LD_PRELOAD=$lib CACHALLOC_CONF=$conf /bin/true >out 2>err || fail "/bin/true failed (conf '$conf')"
  [ -s out ] && fail "/bin/true printed on stdout (conf '$conf')"
  [ -s err ] && fail "/bin/true printed on stderr (conf '$conf'): $(cat err)"
  LD_PRELOAD=$lib CACHALLOC_CONF=$conf /bin/false >out 2>err && fail "/bin/false succeeded"
  LD_PRELOAD=$lib CACHALLOC_CONF=$conf sh -c "$probe && echo ok" >out 2>err || fail "probe failed: $(cat err)"
  [ "$(cat out)" = "ok" ] || fail "sh -c printed '$(cat out)'"
  [ -s err ] && fail "sh -c printed on stderr (conf '$conf'): $(cat err)"
  rm -f out err
  [ -z "$(ls -A)" ] || fail "files written: $(ls -A)"
done
exit 0
