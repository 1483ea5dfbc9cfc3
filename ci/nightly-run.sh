#!/usr/bin/env bash
# One GPU runner's night: run the tier at the world sizes this runner can hold and leave one run
# directory ($HARNESS_OUT/<run id>/: run.json, results.jsonl, launch logs, junit XML) for the
# CI to upload. The report job judges the night from the history DB, so correctness failures
# do not fail this job; usage (2) and infrastructure (4) errors do, since then there is nothing
# trustworthy to judge.
#
#   WORLD_SIZES       required, e.g. 1,4,8 (only what this runner's GPUs can hold)
#   HARNESS_TIER      default nightly
#   HARNESS_DEVICE    default auto (the GPU pipelines set cuda, so a runner that lost its GPU
#                     fails with exit 2 instead of recording CPU timings)
#   HARNESS_OUT       where run directories go, default harness-results/nightly
#   HARNESS_DB        this runner's scratch DB, default <parent of HARNESS_OUT>/scratch.db; the
#                     history that judges the night is the report job's, not this one
#   HARNESS_RUN_ARGS  extra `harness run` words, shell-quoted: selectors, --launcher srun,
#                     --launcher-args '...', --impl NAME
set -euo pipefail

die() { echo "nightly-run.sh: $1" >&2; exit "${2:-2}"; }

[[ -n "${WORLD_SIZES:-}" ]] ||
    die "WORLD_SIZES is not set: set it to the world sizes this runner's GPUs hold, e.g. WORLD_SIZES=1,4,8"

out="${HARNESS_OUT:-harness-results/nightly}"
export HARNESS_DB="${HARNESS_DB:-$(dirname "$out")/scratch.db}"
mkdir -p "$out"

# shlex rather than plain word splitting: globs in selectors ('allreduce[*bf16*]') stay
# unexpanded and quoted launcher arguments stay one word; no eval of the variable.
extra=()
if [[ -n "${HARNESS_RUN_ARGS:-}" ]]; then
    words=$(python3 -c 'import shlex, sys; print("\n".join(shlex.split(sys.argv[1])))' \
        "$HARNESS_RUN_ARGS" 2>/dev/null) ||
        die "HARNESS_RUN_ARGS has unbalanced quotes: $HARNESS_RUN_ARGS"
    [[ -z "$words" ]] || mapfile -t extra <<< "$words"
fi

# The run id is a fresh uuid made inside `harness run`; the new run.json tells us which it is.
shopt -s nullglob
declare -A before=()
for f in "$out"/*/run.json; do before[$f]=1; done

rc=0
harness run --tier "${HARNESS_TIER:-nightly}" --world-sizes "$WORLD_SIZES" \
    --device "${HARNESS_DEVICE:-auto}" --fail-on never --out-dir "$out" "${extra[@]}" || rc=$?

new=()
for f in "$out"/*/run.json; do [[ -n "${before[$f]:-}" ]] || new+=("$(dirname "$f")"); done
if (( ${#new[@]} )); then
    for d in "${new[@]}"; do echo "nightly-run.sh: run directory: $d"; done
else
    echo "nightly-run.sh: no run directory was made (harness exited $rc before starting)" >&2
fi

case "$rc" in
    0) ;;
    # 1 and 3 only come back if HARNESS_RUN_ARGS overrode --fail-on: the results are recorded
    # all the same, and judging them is the report job's.
    1 | 3) echo "nightly-run.sh: harness exited $rc (recorded; the report job judges it)" ;;
    *) die "harness run failed with exit code $rc (2: usage or configuration, 4: infrastructure); see the messages above" "$rc" ;;
esac
