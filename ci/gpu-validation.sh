#!/usr/bin/env bash
# The GPU validation of every CUDA path (docs/gpu-validation.md), on a machine with a GPU:
#
#   ci/gpu-validation.sh [--plan quick|full] [--dry-run] OUT_DIR [STEP ...]
#
# `--plan quick` runs what is still unproven first, each step under its time budget, the whole
# inside 8 minutes (ci/gpu_plan.py holds the order and the budgets); `--plan full` (the default
# when no STEP is named) runs every step, in the same order. `--dry-run` prints the plan with
# its budgets and runs nothing. `check` (harness env --check) always comes first and stops the
# script on a blocker: nothing after it could mean anything on a machine that fails it. Each
# step logs to OUT_DIR/STEP.log and records its runs in OUT_DIR/history.db; a failing case
# does not stop the steps (--fail-on never); `summary` closes every plan: it ingests what a
# stopped run stored in OUT_DIR/runs and writes the pass/fail counts of every run, each
# failure and the headline figures to OUT_DIR/summary.log. Steps can be run one at a time, so
# a CI job with a per-command time limit can split them. STEP_TIMEOUT=SECONDS stops each step
# of a full plan or a named list after that long. Exit status: the number of steps whose
# command failed or was stopped (0: all ran); 2 for bad usage.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
usage="usage: ci/gpu-validation.sh [--plan quick|full] [--dry-run] OUT_DIR [STEP ...]"
kind="" dry=0
while [ $# -gt 0 ]; do
  case "$1" in
    --plan) kind=${2:-}; shift 2 || { echo "$usage" >&2; exit 2; } ;;
    --plan=*) kind=${1#--plan=}; shift ;;
    --dry-run) dry=1; shift ;;
    --) shift; break ;;
    -*) echo "ci/gpu-validation.sh: unknown option $1; $usage" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [ -n "$kind" ] && [ "$kind" != quick ] && [ "$kind" != full ]; then
  echo "ci/gpu-validation.sh: --plan takes quick or full, not '$kind'" >&2
  exit 2
fi
if [ "$dry" = 1 ]; then
  exec python3 "$here/gpu_plan.py" "${kind:-full}" --table
fi
out=${1:?$usage}
shift
mkdir -p "$out"
export HARNESS_DB="$out/history.db"
export HARNESS_CUDA_CACHE="$out/nvrtc-cache"
steps=() budgets=()
if [ $# -gt 0 ]; then
  if [ -n "$kind" ]; then
    echo "ci/gpu-validation.sh: name steps or a --plan, not both" >&2
    exit 2
  fi
  steps=("$@")
else
  plan_lines=$(python3 "$here/gpu_plan.py" "${kind:-full}") || exit 2
  while read -r step budget; do
    steps+=("$step")
    # a full plan's steps take STEP_TIMEOUT (if set), a quick plan's their own budgets
    budgets+=("${budget:-}")
  done <<<"$plan_lines"
fi

run_step() {
  case "$1" in
    # the bring-up checklist: torch build, driver and cuda-python majors, compute modes,
    # NVRTC, /dev/shm, MPI; exit 2 on a blocker
    check) harness env --check ;;
    env) harness env ;;
    # the copy bandwidth and matmul peaks that "% of peak" divides by
    calibrate) harness calibrate --device cuda ;;
    # the CUDA-only tests, one at a time on the one GPU (-n 0): the built-in kernels, CUDA
    # inputs, CUDA timing; each outcome as it comes (a step stopped by its time limit keeps
    # what ran), none longer than 10 minutes
    tests) python -m pytest -v -rfEs --timeout 600 -n 0 -p no:cacheprovider \
             tests/test_cuda_gpu.py tests/test_cuda_source.py tests/test_inputs.py \
             tests/test_timing.py -k "not int32_control" ;;  # the same run as the stress step
    # the tests no GPU run has reached: inputs made on CUDA, CUDA event and graph timing
    tests-cuda) python -m pytest -v -rfEs --timeout 60 -n 0 -p no:cacheprovider \
                  tests/test_inputs.py tests/test_timing.py -k cuda ;;
    smoke1) harness run --tier smoke --world-sizes 1 --device cuda --fail-on never ;;
    # a kernel that faults costs its own case; compute-sanitizer names it
    faults) python -m pytest -v -rfEs --timeout 120 -n 0 -p no:cacheprovider \
              tests/test_cuda_gpu.py -k "faults or sanitize" ;;
    # strided_copy.cu against torch's copy, bitwise, GB/s as a ratio
    speed) python benchmarks/strided_copy_speed.py --json "$out/strided_copy_speed.json" ;;
    # the fixes of the last GPU run that no GPU has run since (docs/gpu-validation.md)
    rerun1) harness run fp8_gemm dtensor --world-sizes 1 --device cuda --fail-on never ;;
    rerun4) harness run collectives dtensor --world-sizes 4 --device cuda --fail-on never ;;
    # 4 and 8 ranks on one GPU: gloo, with the warning
    smoke48) harness run --tier smoke --world-sizes 4,8 --device cuda --fail-on never ;;
    graph) harness run fp8_gemm strided_copy hopper_tasks --world-sizes 1 --device cuda \
             --timing-mode graph --fail-on never ;;
    kernels) harness run strided_copy fp8_gemm.quantize allreduce --tier nightly \
               --world-sizes 1,4 --device cuda --impl cuda --impl tile_cuda --impl torch \
               --fail-on never ;;
    # views past 2**31 elements: the int32 control must fail, not error (it ran over 140 s on
    # an H200 without finishing, so a step of its own, after the quick ones). A case past
    # --timeout is a timeout whose reason names where it was (inputs and reference, or the
    # call), inside the quick plan's 150 s for the step
    stress) harness run strided_copy --tier stress --world-sizes 1 --device cuda \
              --impl cuda --impl cuda_int32_index --impl torch --no-bench --fail-on never \
              --timeout 100 ;;
    nightly1) harness run --tier nightly --world-sizes 1 --device cuda --fail-on never ;;
    # every negative control and the Triton kernels at 1 rank: a control that passes every
    # case on a GPU (named by the run's warning) is a bug the GPU hides from a check
    controls1) mapfile -t impls < <(python3 -c 'from harness.core.discovery import registry
for c in sorted({c for s in registry().select([], "smoke") for c in s.negative_controls}):
    print("--impl", c, sep="\n")')
               harness run --world-sizes 1 --device cuda --no-bench --fail-on never \
                 --impl triton --impl tile_triton "${impls[@]}" ;;
    timers) python benchmarks/timer_agreement.py ;;
    # runs a time limit stopped are in OUT_DIR/runs only; ingesting again updates, never
    # duplicates
    summary) if compgen -G "$out/runs/*" >/dev/null; then
               harness ingest "$out"/runs/* >"$out/ingest.log" 2>&1 || true
             fi
             python benchmarks/gpu_validation_summary.py "$HARNESS_DB" ;;
    *) echo "unknown step $1" >&2; return 2 ;;
  esac
}

# one step in a process of its own, so that a time limit ends it and every rank under it
if [ -n "${_GPU_VALIDATION_STEP:-}" ]; then
  run_step "$_GPU_VALIDATION_STEP"
  exit
fi

limited() {  # STEP LIMIT_S (empty: none)
  if [ -n "$2" ] && [ "$1" != summary ]; then
    # SIGTERM (the harness then stops its MPI job) early enough that a SIGKILL 5 s later
    # still ends the step inside its limit
    local term=$(( $2 > 10 ? $2 - 5 : $2 ))
    _GPU_VALIDATION_STEP=$1 timeout --kill-after=5 "$term" bash "$0" "$out"
  else
    run_step "$1"
  fi
}

failed=0
for i in "${!steps[@]}"; do
  step=${steps[$i]}
  limit=${budgets[$i]:-${STEP_TIMEOUT:-}}
  echo "== $step $(date -u +%FT%TZ)${limit:+ (limit $limit s)}"
  start=$SECONDS
  limited "$step" "$limit" 2>&1 | tee "$out/$step.log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    failed=$((failed + 1))
    if { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; } && [ -n "$limit" ]; then
      printf '\n== %s STOPPED at its limit of %s s\n' "$step" "$limit"
    else
      echo "== $step FAILED after $((SECONDS - start)) s"
    fi
    if [ "$step" = check ]; then
      echo "== stopping: fix the blockers above (see $out/check.log), then run again"
      exit "$failed"
    fi
  else
    echo "== $step done in $((SECONDS - start)) s"
  fi
done
exit "$failed"
