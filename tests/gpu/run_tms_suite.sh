#!/usr/bin/env bash
# run_tms_suite.sh — torch_memory_saver's own test suite, unchanged, with
# `torch_memory_saver` mapped onto `cachalloc.memory_saver` (issue 35).
# TMS's files never enter this repository: they sit in an ignored
# directory, TMS_DIR (default .tms), laid out as
#   TMS_DIR/test/{test_examples.py,test_utils.py,test_configure_subprocess.py,examples/}
#   TMS_DIR/pkg/torch_memory_saver/{__init__.py,utils.py,testing_utils.py}
# where pkg/torch_memory_saver/__init__.py is the mapping alone
# (`from cachalloc.memory_saver import *`, its two names, and
# `cachalloc.tms_compat.alias_submodules(__name__)`, which makes
# torch_memory_saver.entrypoint and .hooks.mode_preload cachalloc's: TMS's
# test_utils.py and test_configure_subprocess.py import and patch them) and
# utils.py, testing_utils.py are TMS's own.  With CACHALLOC_TMS_ROUTE=pluggable the
# mapping is expected to call cachalloc.use_with_torch() first.
#
# Usage: run_tms_suite.sh LIBCACHALLOC MODULE_DIR OUT_DIR [ROUTES]
#   ROUTES (default "preload nocache"): preload = LD_PRELOAD with PyTorch's
#   cache on (TMS's own route), nocache = the same with
#   PYTORCH_NO_CUDA_MEMORY_CACHING=1, pluggable = use_with_torch().
# Prints one line per route, "tms ROUTE: N passed, N failed, N skipped" and
# the failed tests' names, split into those docs/PAUSE.md ("Routes") lists as
# differences of design for that route (`expected`) and any other
# (`unexpected`); exit 0 when every route ran and failed only as expected,
# 1 otherwise, 77 when there is no copy of the suite (or no pytest).
set -u
lib=$1 module_dir=$2 out=$3 routes=${4:-preload nocache pluggable}
# docs/PAUSE.md, "Routes": the failures that are differences of design.
declare -A expected=(
  [preload]=""
  [nocache]="test_examples.py::test_cuda_graph[preload] test_examples.py::test_cuda_graph[torch] test_examples.py::test_rl_example[preload] test_examples.py::test_rl_example[torch] test_examples.py::test_training_engine"
  [pluggable]="test_examples.py::test_cuda_graph[preload] test_examples.py::test_training_engine"
)
tms=${TMS_DIR:-.tms}
if [[ ! -f $tms/test/test_examples.py || ! -f $tms/pkg/torch_memory_saver/__init__.py ]]; then
  echo "tms: SKIP: no copy of torch_memory_saver's suite in $tms (see tests/gpu/run_tms_suite.sh)"
  exit 77
fi
python3 -c 'import pytest' 2>/dev/null || { echo "tms: SKIP: pytest is not installed"; exit 77; }
mkdir -p "$out"
status=0
for route in $routes; do
  env_args=(PYTHONPATH="$(realpath "$tms/pkg"):$(realpath "$module_dir")" CACHALLOC_LIBRARY="$lib")
  case $route in
    preload) env_args+=(LD_PRELOAD="$lib") ;;
    nocache) env_args+=(LD_PRELOAD="$lib" PYTORCH_NO_CUDA_MEMORY_CACHING=1) ;;
    pluggable) env_args+=(CACHALLOC_TMS_ROUTE=pluggable) ;;
    *) echo "tms: unknown route $route"; status=1; continue ;;
  esac
  log=$out/tms-$route.log
  (cd "$tms/test" && env "${env_args[@]}" timeout --kill-after=10 "${TMS_ROUTE_TIMEOUT:-420}" \
     python3 -m pytest -q -rfEs -p no:cacheprovider . >"$log" 2>&1)
  rc=$?
  summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed)|[0-9]+ (passed|failed|skipped)' "$log" | tail -1 | sed 's/=//g;s/^ *//')
  unexpected="" known=""
  for t in $(grep -E '^FAILED ' "$log" | sed 's/^FAILED //;s/ - .*//'); do
    if [[ " ${expected[$route]:-} " == *" $t "* ]]; then known+="$t "; else unexpected+="$t "; fi
  done
  echo "tms $route: ${summary:-no summary (exit $rc)}${known:+; expected: $known}${unexpected:+; unexpected: $unexpected}"
  [[ -n $summary && -z $unexpected ]] || status=1
done
exit $status
