#!/bin/sh
# launcher.sh — the `cachalloc` launcher sets LD_PRELOAD and CACHALLOC_CONF
# as documented, --torch-async sets PyTorch's variables as documented (or
# refuses), and the program it runs is served by the shim.
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

# --torch-async (docs/PYTORCH.md, the cudaMallocAsync route): the
# environment the program receives and the one line on stderr, in every
# arrangement of PyTorch's two config variables, and the refusals.
tshow='printf "%s|%s|%s|%s" "${PYTORCH_CUDA_ALLOC_CONF-unset}" "${PYTORCH_ALLOC_CONF-unset}" "${PYTORCH_NO_CUDA_MEMORY_CACHING-unset}" "${LD_PRELOAD%%:*}"'
err=$(mktemp)
ran=$(mktemp -u)
trap 'rm -f "$err" "$ran"' EXIT
tail_note=" (PyTorch then allocates with cudaMallocAsync/cudaFreeAsync, which cachalloc serves)
cachalloc: --torch-async: expandable_segments:true for cachalloc, as CUDA's own pool maps pages into one range (--conf expandable_segments:false: classic segments)
cachalloc: --torch-async: release_before_peak:true for cachalloc, as CUDA's own pool keeps no other stream's free memory while it maps more (--conf release_before_peak:false: off)"
# async_case NAME EXPECTED_STDOUT EXPECTED_STDERR [VAR=VALUE...]: the
# launcher with --torch-async, from an environment holding only the given
# PyTorch variables.
async_case() {
  name=$1 want_out=$2 want_err=$3
  shift 3
  got=$(env -u LD_PRELOAD -u CACHALLOC_CONF -u PYTORCH_CUDA_ALLOC_CONF -u PYTORCH_ALLOC_CONF \
        -u PYTORCH_NO_CUDA_MEMORY_CACHING "$@" "$launcher" --torch-async -- sh -c "$tshow" 2>"$err") \
    || fail "torch-async $name: exit $?"
  [ "$got" = "$want_out" ] || fail "torch-async $name: the program saw '$got', expected '$want_out'"
  [ "$(cat "$err")" = "$want_err" ] || fail "torch-async $name: stderr was '$(cat "$err")', expected '$want_err'"
}
async_case "nothing set" "backend:cudaMallocAsync|unset|unset|$lib" \
  "cachalloc: --torch-async: set PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync$tail_note"
async_case "keys kept, caching switch unset" "backend:cudaMallocAsync,pinned_num_register_threads:8|unset|unset|$lib" \
  "cachalloc: --torch-async: set PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync,pinned_num_register_threads:8; unset PYTORCH_NO_CUDA_MEMORY_CACHING (was '1')$tail_note" \
  PYTORCH_CUDA_ALLOC_CONF=pinned_num_register_threads:8 PYTORCH_NO_CUDA_MEMORY_CACHING=1
async_case "already the backend" "backend:cudaMallocAsync|unset|unset|$lib" \
  "cachalloc: --torch-async: PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (unchanged: it already names backend:cudaMallocAsync)$tail_note" \
  PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
# Only the newer name set: the backend goes there, the old name stays unset
# (setting it would hide the user's keys from PyTorch versions that read it first).
async_case "PYTORCH_ALLOC_CONF alone" "unset|backend:cudaMallocAsync,pinned_num_register_threads:8|unset|$lib" \
  "cachalloc: --torch-async: set PYTORCH_ALLOC_CONF=backend:cudaMallocAsync,pinned_num_register_threads:8$tail_note" \
  PYTORCH_ALLOC_CONF=pinned_num_register_threads:8
async_case "both names, one empty" "backend:cudaMallocAsync|backend:cudaMallocAsync,pinned_num_register_threads:8|unset|$lib" \
  "cachalloc: --torch-async: set PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync; set PYTORCH_ALLOC_CONF=backend:cudaMallocAsync,pinned_num_register_threads:8$tail_note" \
  PYTORCH_CUDA_ALLOC_CONF= PYTORCH_ALLOC_CONF=pinned_num_register_threads:8
# Native-allocator keys PyTorch ignores on this route: kept, and a note names them.
async_case "native keys noted" "backend:cudaMallocAsync,expandable_segments:True,max_split_size_mb:128|unset|unset|$lib" \
  "cachalloc: --torch-async: set PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync,expandable_segments:True,max_split_size_mb:128 (PyTorch then allocates with cudaMallocAsync/cudaFreeAsync, which cachalloc serves)
cachalloc: note: PyTorch ignores expandable_segments max_split_size_mb under backend:cudaMallocAsync; cachalloc has keys of the same names: give them with --conf (cachalloc --help)
cachalloc: --torch-async: expandable_segments:true for cachalloc, as CUDA's own pool maps pages into one range (--conf expandable_segments:false: classic segments)
cachalloc: --torch-async: release_before_peak:true for cachalloc, as CUDA's own pool keeps no other stream's free memory while it maps more (--conf release_before_peak:false: off)" \
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,max_split_size_mb:128
# Another backend named: refused, the program never runs.
for conflict in "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, backend:native" "PYTORCH_ALLOC_CONF=backend:native"; do
  env -u PYTORCH_CUDA_ALLOC_CONF -u PYTORCH_ALLOC_CONF "$conflict" "$launcher" --torch-async -- sh -c ": >'$ran'" 2>"$err"
  rc=$?
  [ $rc -eq 2 ] || fail "torch-async with '$conflict': exit $rc, expected 2"
  [ ! -e "$ran" ] || fail "torch-async with '$conflict': the program ran"
  grep -q "^cachalloc: --torch-async: ${conflict%%=*}=.* names backend:native; the cudaMallocAsync route needs backend:cudaMallocAsync" "$err" \
    || fail "torch-async with '$conflict': stderr was '$(cat "$err")'"
done
# With --conf too; and without --torch-async nothing of PyTorch's is touched.
out=$(env -u LD_PRELOAD -u PYTORCH_CUDA_ALLOC_CONF CACHALLOC_CONF=stats:stderr "$launcher" --torch-async --conf free_sync:fence -- \
      sh -c 'printf "%s|%s" "$PYTORCH_CUDA_ALLOC_CONF" "$CACHALLOC_CONF"' 2>/dev/null)
[ "$out" = "backend:cudaMallocAsync|stats:stderr,free_sync:fence,expandable_segments:true,release_before_peak:true" ] || fail "torch-async with --conf gave '$out'"
# The user's own choice of segments is kept, from either place, and nothing is said of it.
for given in "CACHALLOC_CONF=expandable_segments:false" "CACHALLOC_CONF=stats:stderr,expandable_segments:true,release_before_peak:true"; do
  out=$(env -u LD_PRELOAD -u PYTORCH_CUDA_ALLOC_CONF "$given" "$launcher" --torch-async -- sh -c 'printf "%s" "$CACHALLOC_CONF"' 2>"$err")
  [ "$out" = "${given#CACHALLOC_CONF=}" ] || fail "torch-async with $given gave CACHALLOC_CONF '$out'"
  ! grep -q "expandable_segments:true\|release_before_peak:true" "$err" || fail "torch-async with $given said '$(cat "$err")'"
done
out=$(env -u LD_PRELOAD -u PYTORCH_CUDA_ALLOC_CONF -u CACHALLOC_CONF "$launcher" --torch-async --conf expandable_segments:false -- \
      sh -c 'printf "%s" "$CACHALLOC_CONF"' 2>/dev/null)
[ "$out" = "expandable_segments:false" ] || fail "torch-async with --conf expandable_segments:false gave '$out'"
# Issue 37: keys are found as the library reads them (items split on ',',
# white space ignored), so a key after ', ' or in another case of spacing
# is the user's and is never overridden.
for given in "CACHALLOC_CONF=stats:/tmp/a.json, expandable_segments:false" \
             "CACHALLOC_CONF=stats:stderr,	expandable_segments : False" \
             "CACHALLOC_CONF=stats:stderr, release_before_peak:false"; do
  out=$(env -u LD_PRELOAD -u PYTORCH_CUDA_ALLOC_CONF "$given" "$launcher" --torch-async -- sh -c 'printf "%s" "$CACHALLOC_CONF"' 2>"$err")
  case $given in
    *release_before_peak*) want="${given#CACHALLOC_CONF=},expandable_segments:true" ;;
    *) want=${given#CACHALLOC_CONF=} ;;
  esac
  [ "$out" = "$want" ] || fail "torch-async with '$given' gave CACHALLOC_CONF '$out'"
  ! grep -q "release_before_peak:true" "$err" || fail "torch-async with '$given' said '$(cat "$err")'"
done
out=$(env -u LD_PRELOAD -u PYTORCH_CUDA_ALLOC_CONF -u CACHALLOC_CONF "$launcher" --torch-async --conf 'stats:stderr, expandable_segments:false' -- \
      sh -c 'printf "%s" "$CACHALLOC_CONF"' 2>/dev/null)
[ "$out" = "stats:stderr, expandable_segments:false" ] || fail "torch-async with --conf 'stats:stderr, expandable_segments:false' gave '$out'"

# A program that is not there: the launcher's own message and 127 (126 for
# one that is not executable), not the shell's.
# --check-conf: the library's own reading, runs nothing; 1 for an error,
# 0 when only PyTorch-only keys were set aside
out=$(env -u LD_PRELOAD CACHALLOC_CONF='stats:/tmp/x.json, expandable_segment:true' "$launcher" --check-conf 2>&1); rc=$?
[ $rc -eq 1 ] || fail "check-conf with a typo: exit $rc, expected 1"
echo "$out" | grep -q "unknown key 'expandable_segment' (did you mean 'expandable_segments'?)" ||
  fail "check-conf: the typo not named: $out"
echo "$out" | grep -q "in effect: .*stats:/tmp/x.json" || fail "check-conf: the good key not in effect: $out"
out=$(env -u LD_PRELOAD -u CACHALLOC_CONF "$launcher" --conf backend:native,expandable_segments:true --check-conf 2>&1); rc=$?
[ $rc -eq 0 ] || fail "check-conf with a PyTorch-only key: exit $rc, expected 0 ($out)"
echo "$out" | grep -q "backend: ignored (PyTorch-only)" && echo "$out" | grep -q "expandable_segments:true" ||
  fail "check-conf: $out"
out=$(env -u LD_PRELOAD "$launcher" -- ./surely-missing-program 2>&1); rc=$?
[ $rc -eq 127 ] || fail "missing program: exit $rc, expected 127"
[ "$out" = "cachalloc: ./surely-missing-program: command not found" ] || fail "missing program said '$out'"
out=$(env -u LD_PRELOAD "$launcher" surely-missing-program-in-path 2>&1); rc=$?
[ $rc -eq 127 ] && [ "$out" = "cachalloc: surely-missing-program-in-path: command not found" ] ||
  fail "missing program in PATH: exit $rc, said '$out'"
out=$(env -u LD_PRELOAD "$launcher" -- "$err" 2>&1); rc=$?  # a plain file, mode 600
[ $rc -eq 126 ] && [ "$out" = "cachalloc: $err: permission denied (not an executable file)" ] ||
  fail "non-executable program: exit $rc, said '$out'"

out=$(env -u LD_PRELOAD -u PYTORCH_ALLOC_CONF PYTORCH_CUDA_ALLOC_CONF=backend:native PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
      "$launcher" -- sh -c "$tshow" 2>"$err") || fail "plain run with PyTorch variables failed"
[ "$out" = "backend:native|unset|1|$lib" ] || fail "plain run changed PyTorch's variables: '$out'"
[ ! -s "$err" ] || fail "plain run printed '$(cat "$err")'"

# The program is served: the route test checks that the cache answered.
env -u LD_PRELOAD LD_LIBRARY_PATH="$fake_dir" CACHALLOC_CONF= "$launcher" "$route" served || fail "served under the launcher"
env -u LD_PRELOAD LD_LIBRARY_PATH="$fake_dir" CACHALLOC_CONF= "$launcher" --conf free_sync:stream -- "$route" policy_stream \
  || fail "--conf did not reach the shim"
exit 0
