#!/bin/sh
# exports.sh — libcachalloc.so depends on nothing beyond libc, libm, libdl,
# libpthread and the loader, and exports exactly the hooked symbols.
# Usage: exports.sh LIBCACHALLOC SYMBOL...
set -u
lib=$1
shift
command -v readelf >/dev/null && command -v nm >/dev/null || exit 77
status=0
for needed in $(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
  case $needed in
    libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|ld-linux*.so.*) ;;
    *) echo "exports: unexpected NEEDED $needed" >&2; status=1 ;;
  esac
done
expected=$(printf '%s\n' "$@" | sort)
actual=$(nm -D --defined-only "$lib" | awk '{print $3}' | sed 's/@.*//' | sort)
if [ "$expected" != "$actual" ]; then
  echo "exports: exported symbols differ from the hook list:" >&2
  printf '%s\n' "$expected" >/tmp/exports-expected.$$
  printf '%s\n' "$actual" | diff /tmp/exports-expected.$$ - >&2
  rm -f /tmp/exports-expected.$$
  status=1
fi
exit $status
