#!/usr/bin/env bash
# setup-tms-suite.sh — lays out torch_memory_saver's own test suite in an
# ignored directory (default .tms) for tests/gpu/run_tms_suite.sh and
# scripts/gpu-check.sh step 5c (issue 35).  TMS's files never enter this
# repository; this script copies them from a TMS git repository (a clone,
# or the bare mirror the `fetch` tool leaves) and writes the one file that is
# ours: pkg/torch_memory_saver/__init__.py, the module-name mapping
# (torch_memory_saver -> cachalloc.memory_saver).
#
# Usage: setup-tms-suite.sh TMS_GIT_DIR [COMMIT] [DEST]
#   COMMIT defaults to HEAD, DEST to .tms.  Writes DEST/COMMIT.
set -euo pipefail
src=${1:?usage: setup-tms-suite.sh TMS_GIT_DIR [COMMIT] [DEST]}
commit=${2:-HEAD} dest=${3:-.tms}
commit=$(git -C "$src" rev-parse "$commit^{commit}")
mkdir -p "$dest/test" "$dest/pkg/torch_memory_saver"
# The API's tests; test_merge_cuda_wheels.py tests TMS's own wheel script.
git -C "$src" archive "$commit" test/examples test/test_examples.py test/test_utils.py \
  test/test_configure_subprocess.py | tar -x -C "$dest"
for f in utils.py testing_utils.py; do
  git -C "$src" show "$commit:torch_memory_saver/$f" > "$dest/pkg/torch_memory_saver/$f"
done
cat > "$dest/pkg/torch_memory_saver/__init__.py" <<'PY'
# The module-name mapping torch_memory_saver -> cachalloc.memory_saver
# (written by cachalloc's scripts/setup-tms-suite.sh).  With
# CACHALLOC_TMS_ROUTE=pluggable, PyTorch's allocator is cachalloc's first.
import os as _os
if _os.environ.get("CACHALLOC_TMS_ROUTE") == "pluggable":
    import cachalloc as _cachalloc
    _cachalloc.use_with_torch()
from cachalloc.memory_saver import *  # noqa: F401,F403
from cachalloc.memory_saver import TorchMemorySaver, configure_subprocess, torch_memory_saver  # noqa: F401
import cachalloc.tms_compat as _tms_compat
_tms_compat.alias_submodules(__name__)
PY
echo "$commit" > "$dest/COMMIT"
echo "torch_memory_saver $commit laid out in $dest"
