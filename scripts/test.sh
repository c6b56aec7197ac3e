#!/usr/bin/env bash
# Run the whole test suite on SQLite, PostgreSQL and MariaDB.
# Installs what it needs (system packages, a virtualenv) and starts the databases if down.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow" -k sqlite`.
# It runs on four workers; `TEST_WORKERS=0 bash scripts/test.sh` runs on one process.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh

ensure_system_packages libmariadb-dev pkg-config chromium libfaketime spin
ensure_postgres || [ -z "${CI:-}" ]
ensure_mariadb || [ -z "${CI:-}" ]
ensure_venv dev

# Four workers (pytest-xdist), each with databases of its own: most tests wait on slots
# and leases, not on the CPU (two workers left the two cores 60% idle: 29 min; four took
# 16). Work stealing: a worker that ran out takes tests from another's queue, so no long
# test waits behind a queue of short ones. TEST_WORKERS=0 runs everything in this process.
# The slowest tests are listed at the end: CI's time is kept under watch.
exec "$VENV/bin/python" -m pytest -n "${TEST_WORKERS:-4}" --dist worksteal --durations=30 "$@"
