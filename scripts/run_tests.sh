#!/usr/bin/env bash
# Set up the pinned environment (idempotent) and run the test suite. Extra arguments go to pytest: test files
# or `-k` expressions narrow the run to them (without any, pyproject.toml's testpaths: all of tests/).
#
# The tests run in parallel, one pytest worker per core (at most 4), each test file on one worker (so a file's
# shared fixtures are made once); each worker and the fairseq processes it starts use one thread, so the workers
# share the cores instead of each spinning on all of them. `-n 0` runs everything in one process.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_env.sh"
cd "$root"
cores="$(nproc)"
workers=$(( cores < 4 ? cores : 4 ))
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec "$root/.venv/bin/python" -m pytest -ra -n "$workers" --dist loadfile "$@"
