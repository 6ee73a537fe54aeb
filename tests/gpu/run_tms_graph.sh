#!/usr/bin/env bash
# run_tms_graph.sh — torch_memory_saver's own cuda_graph and rl_example
# examples (the bodies of its test_cuda_graph and test_rl_example, preload
# hook mode), unchanged, under LD_PRELOAD with PYTORCH_NO_CUDA_MEMORY_CACHING=1,
# with `torch_memory_saver` mapped onto cachalloc.memory_saver (issue 34
# item 6).  Each must pass, or fail loudly (a Python exception, an error
# from the capture): never an illegal memory access, never a wrong value.
#   tests/gpu/run_tms_graph.sh LIB TMS_DIR      (TMS_DIR: .tms, ignored by git:
#   test/examples/ and pkg/torch_memory_saver/{__init__,utils,testing_utils}.py)
# Prints one line per example: "tms NAME PASS|LOUD|CORRUPT ..."; exit 1 on CORRUPT.
set -uo pipefail
lib=$1 tms=$2
[ -d "$tms/test/examples" ] || { echo "tms SKIP: no copy of torch_memory_saver's tests in $tms"; exit 0; }
status=0
for name in cuda_graph rl_example; do
  log=$(mktemp)
  PYTHONPATH="$tms/pkg:$tms/test:$(pwd)/python${PYTHONPATH:+:$PYTHONPATH}" LD_PRELOAD=$lib \
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 300 \
    python3 -c "from examples import $name; $name.run(hook_mode='preload')" >"$log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then verdict=PASS
  elif grep -qiE "illegal memory access|AssertionError" "$log"; then verdict=CORRUPT; status=1
  else verdict=LOUD; fi
  echo "tms $name $verdict (exit $rc): $(grep -m1 -E 'CUDA error|Error:|illegal' "$log" | cut -c1-240)"
  grep -E 'CUDA error|Error|illegal|assert|cachalloc' "$log" | head -12 | sed 's/^/    /'
  rm -f "$log"
done
exit $status
