#!/usr/bin/env bash
# Run the whole test suite on SQLite, PostgreSQL and MariaDB.
# Installs what it needs (system packages, a virtualenv) and starts the databases if down.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow" -k sqlite`.
# Two lanes side by side (below); `TEST_WORKERS=0 bash scripts/test.sh` runs in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh

ensure_system_packages libmariadb-dev pkg-config chromium libfaketime spin pgbouncer
ensure_postgres || [ -z "${CI:-}" ]
ensure_mariadb || [ -z "${CI:-}" ]
ensure_venv dev

# Two lanes side by side. The tests that wait on slots and leases run on three workers
# (pytest-xdist, work stealing: a worker that ran out takes tests from another's queue),
# each with databases of its own: most of their time is waiting (2026-12-06: 56 min of
# tests, 14 min of CPU). The tests that only burn CPU (marker no_deadline: spin's
# models, hostile input, fuzzing, a million rows, the properties: 11 min of CPU) run
# beside them on two workers at nice 10, on what the first lane leaves
# (tests/cpu_report.py); their report follows the first lane's. Measured on two cores
# (2026-12-06): three workers and one, 17:20 and 16:19; four and two, 14:08 and 14:46
# with every test passing, the longest model check (then at nice 19) starved behind the
# other CPU-only worker: 620 s for 183 s of CPU (it now runs at the lane's nice 10). Four workers running everything at one priority made the
# machine so busy that 1 to 3 tests waiting on 2-s slots failed in each of three runs.
# Later the same day, with more tests, four workers failed 2 to 5 tests that wait on 2-s
# slots or 3-s leases in each of four fresh-clone CIs (their lane used 1,300-1,460 s of
# CPU in 17-19 min): back to three, for tests that judge what they mean on a busy machine.
# TEST_WORKERS and CPU_WORKERS set the lanes' workers; TEST_WORKERS=0 runs everything
# in one process. The slowest tests are listed at the end of each lane, and where the
# CPU went: CI's time is kept under watch.
export EXCLUSIVE_JOBS_TEST_CPU="${EXCLUSIVE_JOBS_TEST_CPU:-1}"
workers="${TEST_WORKERS:-3}"
if [ "$workers" = 0 ]; then
    exec "$VENV/bin/python" -m pytest --durations=30 "$@"
fi
cpu_log="$(mktemp)"
suffix="${EXCLUSIVE_JOBS_TEST_DB_SUFFIX:-}_cpu"  # databases of its own
EXCLUSIVE_JOBS_TEST_LANE=cpu EXCLUSIVE_JOBS_TEST_DB_SUFFIX="$suffix" \
    nice -n 10 "$VENV/bin/python" -m pytest -n "${CPU_WORKERS:-2}" --dist worksteal \
    --durations=15 "$@" >"$cpu_log" 2>&1 &
cpu_lane=$!
trap 'kill "$cpu_lane" 2>/dev/null || true; rm -f "$cpu_log"' EXIT
echo "== the CPU-only tests run beside, at nice 10; their report follows this one"
deadlines=0
EXCLUSIVE_JOBS_TEST_LANE=deadlines "$VENV/bin/python" -m pytest -n "$workers" \
    --dist worksteal --durations=30 "$@" || deadlines=$?
cpu=0
wait "$cpu_lane" || cpu=$?
echo "== the CPU-only tests (nice 10, two workers)"
cat "$cpu_log"
# 5: a lane had no test to run (the arguments chose only the other's)
if [ "$deadlines" = 5 ] && [ "$cpu" = 5 ]; then exit 5; fi
for status in "$deadlines" "$cpu"; do
    if [ "$status" != 0 ] && [ "$status" != 5 ]; then exit "$status"; fi
done
