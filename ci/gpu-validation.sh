#!/usr/bin/env bash
# The GPU validation of every CUDA path (docs/gpu-validation.md), on a machine with a GPU:
#
#   ci/gpu-validation.sh OUT_DIR [STEP ...]
#
# Steps, in this order when none is named: check env calibrate tests smoke1 smoke48 graph
# kernels timers stress nightly1 summary (the quick ones first, so a time-boxed run gets most
# of them). `check` (harness env --check) comes first and stops the
# script on a blocker: nothing after it could mean anything on a machine that fails it. Each step logs to OUT_DIR/STEP.log and records its runs in
# OUT_DIR/history.db; a failing case does not stop the steps (--fail-on never), `summary`
# prints the pass/fail counts of every run, each failure, and the headline figures. Steps can
# be run one at a time, so a CI job with a per-command time limit can split them (times on an
# H200: docs/gpu-validation.md). STEP_TIMEOUT=SECONDS stops each step after that long, so a
# slow step leaves time for the rest; what a stopped run stored in OUT_DIR/runs is ingested
# into the DB by `summary`. Exit status: the number of steps whose command failed (0: all ran).
set -uo pipefail

out=${1:?usage: ci/gpu-validation.sh OUT_DIR [STEP ...]}
shift
mkdir -p "$out"
export HARNESS_DB="$out/history.db"
export HARNESS_CUDA_CACHE="$out/nvrtc-cache"
steps=("$@")
if [ ${#steps[@]} -eq 0 ]; then
  steps=(check env calibrate tests smoke1 smoke48 graph kernels timers stress nightly1 summary)
fi

run_step() {
  case "$1" in
    # the bring-up checklist: torch build, driver and cuda-python majors, compute modes,
    # NVRTC, /dev/shm, MPI; exit 2 on a blocker
    check) harness env --check ;;
    env) harness env ;;
    # the copy bandwidth and matmul peaks that "% of peak" divides by
    calibrate) harness calibrate --device cuda ;;
    # the CUDA-only tests: the built-in kernels, CUDA inputs, CUDA timing; each outcome as it
    # comes (a step stopped by STEP_TIMEOUT keeps what ran), none longer than 10 minutes
    tests) python -m pytest -v -rfEs --timeout 600 -p no:cacheprovider tests/test_cuda_gpu.py \
             tests/test_cuda_source.py tests/test_inputs.py tests/test_timing.py \
             -k "not int32_control" ;;  # the same run as the stress step
    smoke1) harness run --tier smoke --world-sizes 1 --device cuda --fail-on never ;;
    # 4 and 8 ranks on one GPU: gloo, with the warning
    smoke48) harness run --tier smoke --world-sizes 4,8 --device cuda --fail-on never ;;
    graph) harness run fp8_gemm strided_copy hopper_tasks --world-sizes 1 --device cuda \
             --timing-mode graph --fail-on never ;;
    kernels) harness run strided_copy fp8_gemm.quantize allreduce --tier nightly \
               --world-sizes 1,4 --device cuda --impl cuda --impl tile_cuda --impl torch \
               --fail-on never ;;
    # views past 2**31 elements: the int32 control must fail, not error (it ran over 140 s on
    # an H200 without finishing, so a step of its own, after the quick ones)
    stress) harness run strided_copy --tier stress --world-sizes 1 --device cuda \
              --impl cuda --impl cuda_int32_index --impl torch --no-bench --fail-on never ;;
    nightly1) harness run --tier nightly --world-sizes 1 --device cuda --fail-on never ;;
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

limited() {
  if [ -n "${STEP_TIMEOUT:-}" ] && [ "$1" != summary ]; then
    _GPU_VALIDATION_STEP=$1 timeout --kill-after=10 "$STEP_TIMEOUT" bash "$0" "$out"
  else
    run_step "$1"
  fi
}

failed=0
for step in "${steps[@]}"; do
  echo "== $step $(date -u +%FT%TZ)"
  start=$SECONDS
  limited "$step" 2>&1 | tee "$out/$step.log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    failed=$((failed + 1))
    if [ "$rc" -eq 124 ] && [ -n "${STEP_TIMEOUT:-}" ]; then
      printf '\n== %s STOPPED at STEP_TIMEOUT=%s s\n' "$step" "$STEP_TIMEOUT"
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
