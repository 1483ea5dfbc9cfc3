#!/usr/bin/env bash
# The CPU CI job, what .ci/run runs on a fresh machine: Debian's Chromium for the dashboard's
# real-browser test (under CI=true that test fails instead of skipping when there is no
# browser), then the README's test command exactly as written. tests/test_readme.py keeps
# the command below and the README's in step.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    # fonts-dejavu-core: without a font the screenshots are boxes; recommends are not needed
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      chromium fonts-dejavu-core
  else
    echo "ci/cpu.sh: chromium is missing and cannot be installed here (needs root and" \
         "apt-get): install Debian's chromium or set HARNESS_CHROMIUM" >&2
  fi
fi
pip install torch==2.13.0 && pip install -e '.[test]' && python -m pytest -q
