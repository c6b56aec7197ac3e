#!/usr/bin/env bash
# CPU per run, side by side on PostgreSQL: procrastinate's periodic tasks (one worker,
# --concurrency 10) and one exclusive_scheduler, its jobs in a process each and in its
# own process (in_process=True); 20 jobs due every second, each run one line to a file.
#
#   bash benchmarks/side_by_side/side_by_side.sh [SECONDS] [ROUNDS]   (40 s, 2 rounds)
#
# Per variant: the application's CPU (utime + stime of the process and every process
# under it, theirs and their ended children's, from /proc) and the database server's (every postgres process; backends that
# exit during the window are not counted, so it is approximate), divided by the runs
# its file gained in the window, after 8 s of warm-up; and (job, slot) pairs run twice.
# procrastinate goes in a virtualenv of its own (/tmp/side-by-side-venv, from PyPI).
# BACKEND=mysql or BACKEND=sqlite runs our variants on MariaDB or SQLite (procrastinate
# has PostgreSQL only): the database column is then MariaDB's server (SQLite: none).
set -euo pipefail
cd "$(dirname "$0")/../.."
export BACKEND=${BACKEND:-postgresql}
WINDOW=${1:-40}
ROUNDS=${2:-2}
ROOT=$PWD
OUT=$(mktemp -d /tmp/side-by-side-XXXX)
source benchmarks/side_by_side/_common.sh
prepare 20 1s

measure() {  # DB_TICKS LABEL RUNS_FILE COMMAND...: one line of figures
    local db_ticks=$1 label=$2 runs=$3; shift 3
    : > "$runs"
    "$@" > "$OUT/$label.log" 2>&1 &
    local pid=$!
    sleep 8
    local a0 p0 r0 a1 p1 r1
    a0=$(tree_ticks $pid); p0=$($db_ticks); r0=$(wc -l < "$runs")
    sleep "$WINDOW"
    a1=$(tree_ticks $pid); p1=$($db_ticks); r1=$(wc -l < "$runs")
    kill -TERM $pid; wait $pid || true
    local doubled
    doubled=$(sed -n "$((r0 + 1)),${r1}p" "$runs" | awk '{print $1, $2}' | sort | uniq -d | wc -l)
    awk -v l="$label" -v n=$((r1 - r0)) -v a=$((a1 - a0)) -v p=$((p1 - p0)) -v t="$TCK" \
        -v d="$doubled" -v w="$WINDOW" 'BEGIN {
        printf "| %s | %d | %.1f | %.2f | %.2f | %d |\n", l, n, n / w, a * 1000 / t / n, p * 1000 / t / n, d }'
}


version=$("$PVENV/bin/python" -c 'import importlib.metadata as m; print(m.version("procrastinate"))')
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); procrastinate $version; ${WINDOW} s per variant after 8 s of warm-up"
echo
echo "| variant | runs | runs/s | application CPU ms/run | database server CPU ms/run | doubled |"
echo "|---|---|---|---|---|---|"
for _ in $(seq "$ROUNDS"); do
    "${PSQL[@]}" -d bench_procrastinate -c "truncate procrastinate_jobs, procrastinate_periodic_defers, procrastinate_events, procrastinate_workers restart identity cascade"
    measure pg_ticks "procrastinate $version, 1 worker" "$OUT/procrastinate.txt" \
        env SIDE_RUNS_FILE="$OUT/procrastinate.txt" PYTHONPATH="$ROOT/benchmarks/side_by_side" \
        PROCRASTINATE_APP=procrastinate_app.app \
        "$PVENV/bin/procrastinate" --log-level=warning worker --concurrency=10
    for in_process in 1 0; do
        clear_ours
        label="exclusive_scheduler on $BACKEND, $([ $in_process = 1 ] && echo in_process=True || echo a process per run)"
        measure ours_db_ticks "$label" "$OUT/ours-$in_process.txt" \
            env "${BENCH_ENV[@]}" BENCH_IN_PROCESS=$in_process BENCH_RUNS_FILE="$OUT/ours-$in_process.txt" \
            .venv/bin/python -m django exclusive_scheduler --database default -v 0
    done
done
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg); logs in $OUT"
