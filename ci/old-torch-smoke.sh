#!/usr/bin/env bash
# The harness on the oldest torch and triton it supports, the ones GPU images ship (a GPU
# cluster's image is often a release behind PyPI): a scratch venv with torch 2.11 and triton
# 3.6, the harness installed into it as a user would (pip install -e .), then the smoke tier
# at world size 1 on the CPU, and DTensor and the collectives at 4 ranks. Not part of .ci/run
# (it downloads torch's CUDA build and its NVIDIA libraries, some GB); run it before a change
# that touches torch or triton APIs lands.
#
#   ci/old-torch-smoke.sh [VENV_DIR]        # default: a new temporary directory
#
# TORCH=2.11.0 TRITON=3.6.0 by default. Exit status: the first failing run's (0: every case
# passed), 3 when the environment could not be built.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 3
torch_version=${TORCH:-2.11.0}
triton_version=${TRITON:-3.6.0}
venv=${1:-$(mktemp -d)/venv}
python3 -m venv "$venv" || exit 3
py="$venv/bin/python"
# PyPI's Linux torch wheel is its CUDA build; on a machine without a GPU it runs on the CPU.
# PIP_CONSTRAINT is cleared: a site-wide constraint may cap torch at another release
PIP_CONSTRAINT="" "$py" -m pip install -q "torch==$torch_version" "triton==$triton_version" \
  || exit 3
PIP_CONSTRAINT="" "$py" -m pip install -q -e . || exit 3
"$py" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
db=$(mktemp -d)/history.db
"$venv/bin/harness" run --tier smoke --world-sizes 1 --device cpu --no-bench --db "$db"
rc=$?
# and DTensor and the collectives at 4 ranks: torch 2.11's DTensor differs there (its
# full_tensor() of an uneven Shard(1) came back a padded view)
"$venv/bin/harness" run dtensor collectives --tier smoke --world-sizes 4 --device cpu \
  --no-bench --db "$db"
four=$?
exit $(( rc != 0 ? rc : four ))
