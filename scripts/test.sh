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

# Four workers (pytest-xdist), each with databases of its own, even on two cores: most
# tests wait on slots and leases, not on the CPU (the suite took 29 min on two workers,
# 16 on four, on a 2-core machine). TEST_WORKERS=0 runs everything in this one process.
# The slowest tests are listed at the end: CI's time is kept under watch.
exec "$VENV/bin/python" -m pytest -n "${TEST_WORKERS:-4}" --durations=30 "$@"
