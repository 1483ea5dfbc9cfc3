#!/usr/bin/env bash
# The nightly history kept on a data branch of this repository, as asv keeps its results: the
# branch holds runs/<run id>/ (each night's run.json and results.jsonl) and history.db. Run
# from a checkout of the repository whose remote may be pushed to (in GitHub Actions, the
# report job's checkout with `contents: write`).
#
#   ci/history-branch.sh checkout DIR   DIR becomes a worktree of the branch's newest commit
#                                       (an empty one, on a new orphan branch, the first time)
#   ci/history-branch.sh save DIR       commit DIR's runs/ and history.db and push them to the
#                                       branch (nothing to commit: nothing pushed)
#
#   HARNESS_DATA_BRANCH  default harness-data
#   HARNESS_DATA_REMOTE  default origin
#
# The report job rebuilds a missing history.db from runs/ (ci/nightly-report.sh with
# HARNESS_HISTORY_RUNS=DIR/runs), so deleting the DB from the branch (to shrink it) loses only
# the triage marks, which live in the DB alone.
set -euo pipefail

die() { echo "history-branch.sh: $1" >&2; exit "${2:-2}"; }

(( $# == 2 )) || die "usage: ci/history-branch.sh checkout|save DIR"
cmd="$1"
dir="$2"
branch="${HARNESS_DATA_BRANCH:-harness-data}"
remote="${HARNESS_DATA_REMOTE:-origin}"

case "$cmd" in
checkout)
    [[ ! -e "$dir" ]] || die "$dir exists: give a path that does not"
    if git ls-remote --exit-code --heads "$remote" "$branch" > /dev/null; then
        # only the newest commit: the history is in its files, not in the branch's log
        git fetch --quiet --depth=1 "$remote" "refs/heads/$branch"
        git worktree add --quiet --detach "$dir" FETCH_HEAD
        echo "history-branch.sh: $dir holds $remote/$branch"
    else
        git worktree add --quiet --detach "$dir"
        git -C "$dir" switch --quiet --orphan "$branch-$$"
        echo "history-branch.sh: $remote has no branch $branch yet: $dir starts it empty"
    fi
    ;;
save)
    [[ -d "$dir" ]] || die "$dir does not exist: run 'ci/history-branch.sh checkout $dir' first"
    paths=()
    for p in runs history.db; do [[ -e "$dir/$p" ]] && paths+=("$p"); done
    (( ${#paths[@]} )) || die "$dir holds neither runs/ nor history.db: nothing to keep"
    git -C "$dir" add -A -- "${paths[@]}"
    if git -C "$dir" diff --cached --quiet; then
        echo "history-branch.sh: nothing new to keep"
        exit 0
    fi
    n=$(find "$dir/runs" -name run.json -type f 2> /dev/null | wc -l)
    git -C "$dir" -c user.name="kernel-harness nightly" -c user.email="nightly@kernel-harness" \
        commit --quiet -m "nightly history: $n run(s)"
    git -C "$dir" push --quiet "$remote" "HEAD:refs/heads/$branch"
    echo "history-branch.sh: pushed $n run(s) to $remote/$branch"
    ;;
*)
    die "unknown command $cmd: checkout or save"
    ;;
esac
