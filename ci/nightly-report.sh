#!/usr/bin/env bash
# The report job of the nightly pipeline: ingest the night's run directories into the history
# DB carried between nights, render the static site, and judge the night's runs against that
# history. The site is rendered even when the night fails, so the failure can be read there.
#
#   ci/nightly-report.sh [RUN_DIR ...]   run directories (holding run.json + results.jsonl);
#                                        none: every directory under $HARNESS_ARTIFACTS that
#                                        holds a run.json
#   HARNESS_DB         required: the history DB carried between nights: a file, or a
#                      postgresql:// URL
#   HARNESS_HISTORY_RUNS  optional: a folder that keeps every night's run directories (the
#                      data branch's runs/, ci/history-branch.sh): each ingested run's
#                      run.json and results.jsonl are copied there, and a DB file that is
#                      missing is first rebuilt from them
#   HARNESS_ARTIFACTS  where the runners' artifacts were downloaded (when no RUN_DIR is given)
#   SITE_DIR           where the site goes, default harness-results/site
#   HARNESS_FAIL_ON    failure | regression | never, default regression
#
# Exit code: `harness report`'s (0 pass, 1 correctness failure, 3 untriaged new regression); 2 when
# a run directory could not be read or ingested (the others are still reported); 4 when there
# is no run at all to report (the GPU jobs uploaded nothing).
set -euo pipefail

die() { echo "nightly-report.sh: $1" >&2; exit "${2:-2}"; }

[[ -n "${HARNESS_DB:-}" ]] ||
    die "HARNESS_DB is not set: point it at the history DB carried between nights, e.g. HARNESS_DB=history/history.db"
site="${SITE_DIR:-harness-results/site}"

dirs=("$@")
if (( ${#dirs[@]} == 0 )); then
    [[ -n "${HARNESS_ARTIFACTS:-}" ]] ||
        die "no run directories given: pass them as arguments or set HARNESS_ARTIFACTS to the folder the runners' artifacts were downloaded to"
    # any depth: download-artifact nests each artifact in a folder of its name unless merged.
    # A missing folder counts as an empty one: nothing was downloaded.
    if [[ -d "$HARNESS_ARTIFACTS" ]]; then
        while IFS= read -r -d '' f; do dirs+=("$(dirname "$f")"); done \
            < <(find "$HARNESS_ARTIFACTS" -name run.json -type f -print0 | sort -z)
    fi
    (( ${#dirs[@]} )) ||
        die "no run.json under $HARNESS_ARTIFACTS: did the GPU jobs upload their run directories? (see their logs)" 4
fi

is_url() { [[ "$1" == postgresql://* || "$1" == postgres://* ]]; }
is_url "$HARNESS_DB" || mkdir -p "$(dirname "$HARNESS_DB")"

kept_runs="${HARNESS_HISTORY_RUNS:-}"
if [[ -n "$kept_runs" ]] && ! is_url "$HARNESS_DB" && [[ ! -f "$HARNESS_DB" ]]; then
    kept=()
    if [[ -d "$kept_runs" ]]; then
        while IFS= read -r -d '' f; do kept+=("$(dirname "$f")"); done \
            < <(find "$kept_runs" -name run.json -type f -print0 | sort -z)
    fi
    if (( ${#kept[@]} )); then
        echo "nightly-report.sh: $HARNESS_DB is missing: rebuilding it from the ${#kept[@]} run directories in $kept_runs"
        harness ingest --db "$HARNESS_DB" "${kept[@]}" ||
            die "could not rebuild $HARNESS_DB from $kept_runs; see above"
    fi
fi

# what ingest needs of a run directory, kept where later nights find it
keep() {
    local dest="$kept_runs/$2"
    mkdir -p "$dest"
    [[ "$(cd "$1" && pwd -P)" != "$(cd "$dest" && pwd -P)" ]] || return 0  # already kept
    cp "$1/run.json" "$dest/"
    if [[ -f "$1/results.jsonl" ]]; then cp "$1/results.jsonl" "$dest/"; fi
}
# One ingest per directory, so that one runner's unreadable upload neither hides the other
# runners' results nor passes unnoticed: it makes the exit code 2 at the end.
ids=()
bad=0
for d in "${dirs[@]}"; do
    if ! id=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["run_id"])' \
            "$d/run.json" 2>/dev/null); then
        echo "nightly-report.sh: $d/run.json is missing or has no run_id: skipped" >&2
        bad=1
        continue
    fi
    if harness ingest --db "$HARNESS_DB" "$d"; then
        ids+=("$id")
        if [[ -n "$kept_runs" ]]; then keep "$d" "$id"; fi
    else
        echo "nightly-report.sh: could not ingest $d: skipped" >&2
        bad=1
    fi
done
(( ${#ids[@]} )) || die "none of the ${#dirs[@]} run directories could be ingested; see above"

run_args=()
for id in "${ids[@]}"; do run_args+=(--run "$id"); done
rc=0
harness report --db "$HARNESS_DB" --out "$site" --fail-on "${HARNESS_FAIL_ON:-regression}" \
    "${run_args[@]}" || rc=$?
echo "nightly-report.sh: site in $site; ${#ids[@]} run(s) judged; harness report exited $rc"

# correctness (1) and regressions (3) outrank a skipped upload (2), which outranks a pass
if (( rc == 0 && bad )); then
    rc=2
fi
exit "$rc"
