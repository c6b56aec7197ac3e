#!/usr/bin/env bash
# Idle, side by side: one procrastinate worker (PostgreSQL) with 20 periodic tasks due
# hourly, and one exclusive_scheduler with 20 jobs due hourly on each database named
# (PostgreSQL by default), one after the other, nothing due in the window.
#
#   bash benchmarks/side_by_side/idle.sh [SECONDS] [BACKENDS]   (60 s; "postgresql")
#   e.g. bash benchmarks/side_by_side/idle.sh 60 postgresql,mysql,sqlite
#
# Per variant, over SECONDS after 10 s of settling, a minute's worth of:
# - statements the PostgreSQL server received from the variant's database: its log, with
#   log_statement = 'all' set on that database alone while it runs (the prefix names the
#   database), LISTEN and every statement of a transaction included;
# - statements our scheduler sent through Django's cursor (scheduler_bench's counting
#   app), on every database: the figure bench_scheduler.py --measure idle gives;
# - CPU of the process and every process under it (/proc, as side_by_side.sh).
# A window that would cross the top of an hour (when the jobs are due) waits for it to pass.
set -euo pipefail
cd "$(dirname "$0")/../.."
WINDOW=${1:-60}
BACKENDS=${2:-postgresql}
ROOT=$PWD
OUT=$(mktemp -d /tmp/side-by-side-idle-XXXX)
source benchmarks/side_by_side/_common.sh
PGLOG=$(ls -t /var/log/postgresql/postgresql-*-main.log | head -n1)

log_statements() {  # DB FROM TO: statement lines of DB in the server's log's bytes FROM..TO
    tail -c +"$(($2 + 1))" "$PGLOG" | head -c "$(($3 - $2))" | grep -a "@$1 " \
        | grep -acE "LOG:  (statement|execute [^:]*):" || true
}

clear_of_the_hour() {  # wait until the window and its settling cannot cross a top of hour
    local left=$((3600 - $(date +%s) % 3600))
    if [ "$left" -lt $((WINDOW + 20)) ]; then sleep $((left + 2)); fi
}

measure() {  # LABEL DB COUNTS_DIR COMMAND...: one line of figures
    local label=$1 db=$2 counts=$3; shift 3
    clear_of_the_hour
    [ -n "$db" ] && "${PSQL[@]}" -d postgres -c "alter database $db set log_statement = 'all'"
    "$@" > "$OUT/log-$(date +%s%N)" 2>&1 &
    local pid=$!
    sleep 10
    local a0 b0 t0 a1 b1 t1 server=- sent=-
    a0=$(tree_ticks $pid); b0=$(stat -c %s "$PGLOG"); t0=$(date +%s)
    sleep "$WINDOW"
    a1=$(tree_ticks $pid); b1=$(stat -c %s "$PGLOG"); t1=$(date +%s)
    kill -TERM $pid; wait $pid || true
    if [ -n "$db" ]; then
        "${PSQL[@]}" -d postgres -c "alter database $db reset log_statement"
        server=$(log_statements "$db" "$b0" "$b1" | head -n1)
        server=$(awk -v n="$server" -v w="$WINDOW" 'BEGIN { printf "%.1f", n * 60 / w }')
    fi
    if [ -n "$counts" ]; then  # seconds t0 .. t1 - 1 of the scheduler's own count
        sent=$(python3 -c "
import json, pathlib, sys
t0, t1, window = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
n = 0
for path in pathlib.Path(sys.argv[4]).glob('statements-*.json'):
    for second, kinds in json.loads(path.read_text()).get('timeline', {}).items():
        if t0 <= int(second) < t1:
            n += sum(kinds.values())
print(f'{n * 60 / window:.1f}')" "$t0" "$t1" "$WINDOW" "$counts")
    fi
    awk -v l="$label" -v s="$server" -v c="$sent" -v a=$((a1 - a0)) -v t="$TCK" -v w="$WINDOW" \
        'BEGIN { printf "| %s | %s | %s | %.0f |\n", l, s, c, a * 1000 / t * 60 / w }'
}

prepare 20 1h > /dev/null
version=$("$PVENV/bin/python" -c 'import importlib.metadata as m; print(m.version("procrastinate"))')
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); procrastinate $version; ${WINDOW} s per variant after 10 s of settling"
echo
echo "| variant (20 jobs due hourly) | statements the server received a minute | statements sent through Django's cursor a minute | CPU ms a minute |"
echo "|---|---|---|---|"
"${PSQL[@]}" -d bench_procrastinate -c "truncate procrastinate_jobs, procrastinate_periodic_defers, procrastinate_events, procrastinate_workers restart identity cascade"
measure "procrastinate $version, 1 worker (PostgreSQL)" bench_procrastinate "" \
    env SIDE_RUNS_FILE="$OUT/procrastinate.txt" SIDE_CRON="0 * * * * 0" \
    PYTHONPATH="$ROOT/benchmarks/side_by_side" PROCRASTINATE_APP=procrastinate_app.app \
    "$PVENV/bin/procrastinate" --log-level=warning worker --concurrency=10
for BACKEND in ${BACKENDS//,/ }; do
    export BACKEND
    prepare 20 1h > /dev/null
    counts=$(mktemp -d "$OUT/counts-$BACKEND-XXXX")
    db=""
    [ "$BACKEND" = postgresql ] && db=bench_scheduler
    measure "exclusive_scheduler ($BACKEND)" "$db" "$counts" \
        env "${BENCH_ENV[@]}" BENCH_STATEMENTS="$counts" BENCH_RUNS_FILE="$OUT/ours.txt" \
        .venv/bin/python -m django exclusive_scheduler --database default -v 0
done
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg); logs in $OUT"
