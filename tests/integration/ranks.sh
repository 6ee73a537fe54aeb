#!/bin/sh
# ranks.sh — one statistics dump per rank (`%r` in the stats path) for every
# launcher's rank variable, set by hand as torchrun, Open MPI, PMIx, MPICH,
# MVAPICH2, Flux, jsrun and srun set them; launched through the `cachalloc`
# launcher, the ranks of one job run at the same time.
# With PLUGGABLE and LIBCACHALLOC, the same for ranks that use the pluggable
# ABI with the library dlopen'ed (no LD_PRELOAD): their dumps too.
# Usage: ranks.sh LAUNCHER ROUTE_LINKED FAKE_LIBCUDA_DIR [PLUGGABLE LIBCACHALLOC]
set -u
launcher=$1 prog=$2 fake_dir=$3 pluggable=${4:-} lib=${5:-}
fail() { echo "ranks: $*" >&2; exit 1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cachalloc-ranks.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
vars="RANK OMPI_COMM_WORLD_RANK PMIX_RANK PMI_RANK MV2_COMM_WORLD_RANK FLUX_TASK_RANK JSM_NAMESPACE_RANK SLURM_PROCID LOCAL_RANK"
unset_all=
for v in $vars; do unset_all="$unset_all -u $v"; done

# run DIR TAG [VAR=VALUE...]: one "rank" under the launcher, its dump in
# DIR, its output in DIR/out-TAG (shown when it fails).
run() {
  dir=$1 tag=$2
  shift 2
  # shellcheck disable=SC2086
  env $unset_all -u LD_PRELOAD LD_LIBRARY_PATH="$fake_dir" CACHALLOC_CONF= "$@" \
    "$launcher" --conf "stats:$dir/stats-%r.json" -- "$prog" served >"$dir/out-$tag" 2>&1 ||
    { cat "$dir/out-$tag" >&2; echo "ranks: $tag ($*) failed" >&2; }
}

# check DIR N...: exactly the dumps stats-N.json, complete, from distinct
# processes, each saying its rank N ("rank":N; $dump_rank instead if set:
# null where no rank variable is).
check() {
  dir=$1
  shift
  want=$#
  got=$(ls "$dir" | grep -c '^stats-.*\.json$')
  [ "$got" -eq "$want" ] || fail "$dir: $got dumps, expected $want: $(ls "$dir")"
  pids=
  for r in "$@"; do
    f="$dir/stats-$r.json"
    [ -s "$f" ] || fail "$f missing"
    grep -q '"version":1,' "$f" || fail "$f is not a stats dump"
    grep -q '"allocation.all.allocated":[1-9]' "$f" || fail "$f shows no allocation served"
    grep -q "\"rank\":${dump_rank:-$r}," "$f" || fail "$f does not say rank ${dump_rank:-$r}"
    pid=$(sed -n 's/.*"pid":\([0-9]*\),.*/\1/p' "$f")
    case " $pids " in *" $pid "*) fail "$f: same process as another dump" ;; esac
    pids="$pids $pid"
  done
}

for v in $vars; do
  d="$tmp/$v"
  mkdir -p "$d"
  run "$d" a "$v=0" &
  run "$d" b "$v=1" &
  wait
  check "$d" 0 1
done

# Nested launchers: torchrun inside srun (every worker of the node has the
# same SLURM_PROCID; RANK tells them apart).
d="$tmp/nested"
mkdir -p "$d"
run "$d" a SLURM_PROCID=0 RANK=2 LOCAL_RANK=0 &
run "$d" b SLURM_PROCID=0 RANK=3 LOCAL_RANK=1 &
wait
check "$d" 2 3

# No rank variable: a single process is rank 0 in the file name, and its
# dump says it has no rank ("rank":null).
d="$tmp/none"
mkdir -p "$d"
run "$d" a
dump_rank=null
check "$d" 0
dump_rank=

# The launcher wraps a launcher (`cachalloc -- torchrun ...`): the ranks it
# starts inherit LD_PRELOAD and CACHALLOC_CONF; the launcher process itself
# (a shell here, Python for torchrun) never uses CUDA and writes nothing.
d="$tmp/wrapped"
mkdir -p "$d"
# shellcheck disable=SC2086
env $unset_all -u LD_PRELOAD LD_LIBRARY_PATH="$fake_dir" CACHALLOC_CONF= \
  "$launcher" --conf "stats:$d/stats-%r.json" -- \
  sh -c 'RANK=0 "$1" served >/dev/null & RANK=1 "$1" served >/dev/null & wait' sh "$prog" || fail "wrapped run failed"
check "$d" 0 1

# The launcher warns (stderr) about a report path every rank would share,
# and only then.
# shellcheck disable=SC2086
w=$(env $unset_all -u CACHALLOC_CONF RANK=1 "$launcher" --conf "stats:$tmp/shared.json" -- true 2>&1 >/dev/null)
case $w in *"neither %r nor %p"*) ;; *) fail "no warning for a path all ranks share: '$w'" ;; esac
# shellcheck disable=SC2086
w=$(env $unset_all -u CACHALLOC_CONF "$launcher" --conf "stats:$tmp/shared.json" -- torchrun 2>&1 >/dev/null)
case $w in *"neither %r nor %p"*) ;; *) fail "no warning for a launcher run: '$w'" ;; esac
# shellcheck disable=SC2086
w=$(env $unset_all -u CACHALLOC_CONF RANK=1 "$launcher" --conf "stats:$tmp/s-%r.json,trace:$tmp/t-%p.json" -- true 2>&1 >/dev/null)
[ -z "$w" ] || fail "warning for per-rank paths: '$w'"
# shellcheck disable=SC2086
w=$(env $unset_all -u CACHALLOC_CONF "$launcher" --conf "stats:$tmp/shared.json" -- true 2>&1 >/dev/null)
[ -z "$w" ] || fail "warning outside a job: '$w'"

# Ranks using the pluggable ABI, nothing preloaded (PyTorch's
# CUDAPluggableAllocator in each rank of a torchrun job).
if [ -n "$pluggable" ]; then
  d="$tmp/pluggable"
  mkdir -p "$d"
  for r in 0 1; do
    # shellcheck disable=SC2086
    env $unset_all -u LD_PRELOAD LD_LIBRARY_PATH="$fake_dir" RANK=$r CACHALLOC_CONF="stats:$d/stats-%r.json" \
      "$pluggable" same_stream "$lib" >"$d/out-$r" 2>&1 || { cat "$d/out-$r" >&2; fail "pluggable rank $r failed"; } &
  done
  wait
  check "$d" 0 1
fi
echo "ranks: PASS"
exit 0
