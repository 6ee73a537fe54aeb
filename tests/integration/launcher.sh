#!/bin/sh
# launcher.sh — the `cachalloc` launcher sets LD_PRELOAD and CACHALLOC_CONF
# as documented and the program it runs is served by the shim.
# Usage: launcher.sh LAUNCHER LIBCACHALLOC ROUTE_LINKED FAKE_LIBCUDA_DIR
set -u
launcher=$1 lib=$2 route=$3 fake_dir=$4
fail() { echo "launcher: $*" >&2; exit 1; }
show='printf "%s|%s" "$LD_PRELOAD" "${CACHALLOC_CONF-unset}"'

out=$(env -u LD_PRELOAD -u CACHALLOC_CONF "$launcher" -- sh -c "$show") || fail "plain run failed"
[ "$out" = "$lib|unset" ] || fail "plain run gave '$out'"

out=$(LD_PRELOAD=libm.so.6 CACHALLOC_CONF=stats:stderr "$launcher" --conf free_sync:fence --conf=log_level:info sh -c "$show") \
  || fail "run with --conf failed"
[ "$out" = "$lib:libm.so.6|stats:stderr,free_sync:fence,log_level:info" ] || fail "merged run gave '$out'"

"$launcher" >/dev/null 2>&1; [ $? -eq 2 ] || fail "no program: expected exit 2"
"$launcher" --bogus true >/dev/null 2>&1; [ $? -eq 2 ] || fail "unknown option: expected exit 2"
env -u LD_PRELOAD "$launcher" -- sh -c 'exit 7'; [ $? -eq 7 ] || fail "exit status not passed on"

# The program is served: the route test checks that the cache answered.
env -u LD_PRELOAD LD_LIBRARY_PATH="$fake_dir" CACHALLOC_CONF= "$launcher" "$route" served || fail "served under the launcher"
env -u LD_PRELOAD LD_LIBRARY_PATH="$fake_dir" CACHALLOC_CONF= "$launcher" --conf free_sync:stream -- "$route" policy_stream \
  || fail "--conf did not reach the shim"
exit 0
