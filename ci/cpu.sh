#!/usr/bin/env bash
# The CPU CI job, what .ci/run runs on a fresh machine: Debian's Chromium for the dashboard's
# real-browser test, its PostgreSQL server for the history DB's PostgreSQL tests and its SLURM
# (slurm-wlm, with munge) for the cluster tests (under CI=true those tests fail instead of
# skipping when theirs is missing), then the
# README's test command exactly as written. tests/test_readme.py keeps the command below and
# the README's in step.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium fonts-dejavu-core)
# the tests start their own server from the package's binaries, never the system's service
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || missing+=(postgresql)
# the SLURM tests start their own munged, slurmctld and slurmd (tests/helpers/slurm_cluster.py),
# the two-node one each node in namespaces of its own joined by a bridge
# (tests/helpers/two_node_cluster.py: util-linux's unshare and nsenter, iproute2's ip)
command -v slurmctld >/dev/null 2>&1 || missing+=(slurm-wlm)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
{ command -v unshare && command -v nsenter; } >/dev/null 2>&1 || missing+=(util-linux)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    # fonts-dejavu-core: without a font the screenshots are boxes; recommends are not needed
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  else
    echo "ci/cpu.sh: ${missing[*]} missing and cannot be installed here (needs root and" \
         "apt-get): install Debian's packages (or set HARNESS_CHROMIUM for the browser)" >&2
  fi
fi
pip install torch==2.13.0 && pip install -e '.[test]' && python -m pytest -q
python -m pytest -q -m heavy
