#!/usr/bin/env bash
# Bursts, side by side on PostgreSQL (issue 27): W workers x M jobs all due at the same
# instant every S seconds (a time-compressed minute or hour), in the same run:
# procrastinate's periodic tasks (W `procrastinate worker` processes) and W
# exclusive_scheduler processes, their jobs in a process each and in the scheduler's
# own process (in_process=True); on request (--variants ...,apscheduler) also W
# APScheduler 4 schedulers sharing one SQL data store (below). Each run appends one line
# to a file at its first line.
#
#   bash benchmarks/side_by_side/burst.sh --workers 20 --jobs 1000 --every 30 --seconds 130
#       [--max-concurrent 100] [--pool N]
#       [--variants procrastinate,ours-process,ours-in-process[,apscheduler]]
#   (defaults: 2 workers x 50 jobs every 10 s, 40 s a variant, --max-concurrent 10,
#   the three variants without apscheduler)
#
# Each side's capacity is W x --max-concurrent: procrastinate's workers get it as
# --concurrency, our schedulers as --max-concurrent, APScheduler's as
# max_concurrent_jobs. --pool sets procrastinate's connection pool per worker (its
# default is 4, plus one connection to LISTEN), and APScheduler's SQLAlchemy pool (N, no
# overflow; unset: SQLAlchemy's 5 + 10 overflow, plus its event broker's connection).
# S must divide 60, or be minutes dividing 60: procrastinate's cron has a seconds field
# (six fields, the sixth is seconds), so every 30 s is `* * * * * */30`; our jobs' slots
# are multiples of S since the epoch, the same instants.
#
# The measured window is the one bench_scheduler.py's cluster measure uses: once every
# worker is up (procrastinate: registered in procrastinate_workers; ours: a live row in
# the scheduler table), the first slot and the last slot of --seconds are left out, the
# slots between are measured; counters are sampled half a period before the first
# measured slot and half a period before the last one, so the window holds exactly
# those slots' bursts (if a burst ends within its period). Per variant:
#
# - doubled: (job, slot) pairs with two or more lines in the runs file (any slot), and
#   with two or more succeeded rows in the variant's own tables;
# - missed: pairs of the window with no line (never run), and with no succeeded row;
# - start lateness: the job's first line (time.time()) minus its slot, p50 / p99 / max
#   over the window's pairs, and for the first and the last job by name; on the database
#   clock, the row's start (procrastinate's `started` event, our JobRun.started_at)
#   minus the slot; for procrastinate also when its deferrer inserted the job;
# - each burst's first and last start: per slot, the earliest and the latest first
#   line, minus the slot, then p50 / p99 / max across the window's slots;
# - runs per worker, min / max: procrastinate by the pid that ran the task (a thread of
#   the worker), ours by JobRun.pid (the scheduler that took the slot);
# - application CPU: utime + stime of every worker process and every process under it,
#   theirs and their ended children's (from /proc, as side_by_side.sh), per (job, slot)
#   of the window and per instant; the database server's CPU likewise, twice: every
#   postgres process (whole server, other databases' work and ended backends' whole
#   lives included: approximate, for a quiet machine), and only the backends connected
#   to the variant's database at the second sample (what they used since the first;
#   backends that ended in between are not counted, background processes neither);
# - transactions per instant: the delta of pg_stat_database's xact_commit +
#   xact_rollback for the variant's database over the window (pg_stat_statements is not
#   loaded). procrastinate sends one statement per transaction (pool connection, commit
#   on return), so for it this is its statements; Django runs several statements in one
#   transaction inside atomic blocks, so for ours it is fewer than its statements:
#   bench_scheduler.py counts those (the command is printed at the end). Backends
#   report their counts within about a second of a transaction (longer when idle).
#
# What procrastinate 3.10 does (procrastinate/periodic.py, sql/schema.sql), to read its
# figures by: every worker runs a deferrer that wakes 0.5 s (MARGIN) after the next cron
# instant plus however long its previous round took (the sleep is reckoned from the
# round's start but begins at its end), then defers every due (task, timestamp) one at
# a time, one round trip each: W x M calls per instant, whoever wins. The
# database keeps one: procrastinate_defer_periodic_job_v2 inserts into
# procrastinate_periodic_defers (unique task, periodic id, timestamp; ON CONFLICT DO
# NOTHING) and creates the job only if its row went in; it also deletes that task's
# rows of older timestamps, so a deferrer a full period behind could defer an older
# timestamp again (counted as doubled if it happens). A job then waits in the queue
# however late (no lateness limit once deferred); MAX_DELAY (10 min) only bounds the
# one slot a starting worker defers. Workers take jobs by LISTEN/NOTIFY and
# procrastinate_fetch_job_v2 (FOR UPDATE SKIP LOCKED); a sync task runs in asyncio's
# default thread pool (min(32, cores + 4) threads), so --concurrency above that number
# does not run more sync tasks at once. Jobs and events are kept (delete_jobs=never).
#
# What APScheduler 4 does (4.0.0a6, a pre-release: apscheduler/_schedulers/async_.py,
# datastores/sqlalchemy.py, eventbrokers/asyncpg.py; apscheduler_app.py sets it up): W
# AsyncScheduler processes (role both) on one SQLAlchemyDataStore (asyncpg) and one
# AsyncpgEventBroker (LISTEN/NOTIFY), M tasks t00, t01 ... (sync, in its thread pool
# executor: 40 threads, so at most 40 run at once whatever max_concurrent_jobs; at most
# one run of a task at a time) and a schedule each, a CronTrigger in UTC on the same
# instants. Every scheduler wakes at the next fire time (it reads it from the schedules
# table) and claims due schedules 100 at a time: one UPDATE ... WHERE id IN (SELECT ...
# FOR UPDATE SKIP LOCKED LIMIT 100) RETURNING, which leases the rows to it
# (acquired_by, acquired_until: 30 s, extended while it works), so each schedule is
# processed by one scheduler; for each claimed schedule it then inserts one job row, a
# transaction each, one after the other, and releases the batch with the next fire
# times (one executemany UPDATE). Every event (job added, acquired, released, schedule
# updated: four per run) is one `SELECT pg_notify` on the broker's single connection,
# heard by all W schedulers; a job added or released wakes every scheduler with free
# capacity to claim jobs (SELECT ... FOR UPDATE OF jobs, tasks SKIP LOCKED, oldest
# first, up to its free capacity, then UPDATEs of the jobs and of the tasks' running
# counters), then it reads each claimed job's task (a transaction each, one after the
# other) before starting it, and on its end deletes the job and decrements the counter
# (a transaction). No job result is kept (job_result_expiration_time 0), so no row is
# left of a run: the figures from a variant's tables (doubled and missed by rows,
# database-clock lateness, deferred) are "-" for it, and runs per worker come from the
# runs file (the pid of the worker whose thread ran the job). Lateness runs late rather
# than skips: misfire_grace_time None (no start deadline, as procrastinate's queued
# jobs), coalesce latest (a schedule processed after its next instant has also passed
# makes one job, for the latest: the earlier instant counts as missed). Its workers are
# counted up by a row each in bench_apscheduler_workers. Each worker also counts the
# statements SQLAlchemy executes, the events it sends and the notifications it hears;
# their deltas over the window, per instant, are printed under the table. Transactions
# per instant count, besides its BEGIN ... COMMIT blocks (about 5 a run), each
# pg_notify (autocommit, 4 a run) and each time a LISTENing backend reads the
# notification queue (PostgreSQL does that in a transaction of its own: up to 4 x W a
# run, fewer when notifications arrive together). At 2 x 20 (statement log, one
# instant): per run one INSERT of the job, one row of the schedules' executemany
# UPDATE, one of the tasks' +1, one SELECT of the task, UPDATE -1 and DELETE at its
# end, about 1.4 job-claiming SELECTs (many find nothing: every event wakes every
# scheduler), 4 pg_notify; 20 schedules are claimed by one scheduler (up to 100 go to
# whichever claims first), 10 connections in all. SQLAlchemy's pool opens its 5 on
# first need; beyond them (overflow, when all 5 are busy: a large burst) it opens up to
# 10 more and closes each on its return, so a backend is started for it each burst.
#
# procrastinate goes in a virtualenv of its own (/tmp/side-by-side-venv, from PyPI), as
# side_by_side.sh; APScheduler in another (/tmp/apscheduler-venv, from PyPI, made on its
# first use). Databases: bench_procrastinate and bench_scheduler, and bench_apscheduler
# when it runs (made if missing).
# Every process the script starts is stopped when it ends, Ctrl-C included.
set -euo pipefail
cd "$(dirname "$0")/../.."

WORKERS=2 JOBS=50 EVERY=10 WINDOW=40 CONCURRENCY=10 POOL=""
VARIANTS=procrastinate,ours-process,ours-in-process
while [ $# -gt 0 ]; do
    case $1 in
        --workers) WORKERS=$2 ;;
        --jobs) JOBS=$2 ;;
        --every) EVERY=${2%s} ;;
        --seconds) WINDOW=${2%s} ;;
        --max-concurrent) CONCURRENCY=$2 ;;
        --pool) POOL=$2 ;;
        --variants) VARIANTS=$2 ;;
        *) echo "usage: $0 [--workers W] [--jobs M] [--every S] [--seconds T]" \
               "[--max-concurrent C] [--pool N] [--variants a,b,c,apscheduler]" >&2; exit 2 ;;
    esac
    shift 2
done
for n in "$WORKERS" "$JOBS" "$EVERY" "$WINDOW" "$CONCURRENCY" ${POOL:+"$POOL"}; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "not a whole number: $n" >&2; exit 2; }
done
# procrastinate's cron for "every S seconds", on the same instants as ours.
if [ "$EVERY" -lt 60 ] && [ $((60 % EVERY)) = 0 ]; then
    CRON="* * * * * */$EVERY"
elif [ $((EVERY % 60)) = 0 ] && [ $((3600 % EVERY)) = 0 ]; then
    CRON="*/$((EVERY / 60)) * * * * 0"
else
    echo "--every must divide 60 s, or be whole minutes dividing 60" >&2; exit 2
fi

ROOT=$PWD
HERE=$ROOT/benchmarks/side_by_side
OUT=$(mktemp -d /tmp/burst-XXXX)
source "$HERE/_common.sh"  # PSQL, PVENV, TCK, prepare, clear_ours, ticks, tree, tree_ticks, pg_ticks
FIGURES=("$ROOT/.venv/bin/python" "$HERE/burst_figures.py")
AVENV=/tmp/apscheduler-venv
APS=("$AVENV/bin/python" "$HERE/apscheduler_app.py")
APS_DSN=postgresql+asyncpg://postgres@127.0.0.1:5432/bench_apscheduler

prepare_apscheduler() {  # APScheduler 4 installed (its own virtualenv) and its database made
    if ! "$AVENV/bin/python" -c "import apscheduler, asyncpg, greenlet, sniffio" 2> /dev/null; then
        python3.11 -m venv "$AVENV"
        # sniffio: 4.0.0a6's SQL data store imports it without requiring it.
        "$AVENV/bin/pip" install -q --pre 'apscheduler>=4.0.0a1,<5' 'sqlalchemy[asyncio]' asyncpg sniffio
    fi
    if [ "$("${PSQL[@]}" -d postgres -tAc "select 1 from pg_database where datname='bench_apscheduler'")" != 1 ]; then
        "${PSQL[@]}" -d postgres -c "create database bench_apscheduler"
    fi
}

# --- processes: every one this script starts is in PIDS until stopped -------------------

PIDS=()
SLEEPER=""
stop_all() {  # SIGTERM to each worker, up to 60 s to end, then SIGKILL to what is left
    local all=() p i
    [ -n "$SLEEPER" ] && kill "$SLEEPER" 2> /dev/null || true
    [ ${#PIDS[@]} -gt 0 ] || return 0
    for p in "${PIDS[@]}"; do all+=($(tree "$p")); done
    kill -TERM "${PIDS[@]}" 2> /dev/null || true
    for i in $(seq 600); do
        alive=0
        for p in "${PIDS[@]}"; do kill -0 "$p" 2> /dev/null && alive=1; done
        [ $alive = 0 ] && break
        sleep 0.1
    done
    for p in "${PIDS[@]}"; do all+=($(tree "$p")); done
    for p in "${all[@]}"; do kill -KILL "$p" 2> /dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2> /dev/null || true; done
    PIDS=()
}
trap stop_all EXIT
trap 'exit 130' INT TERM

sleep_until() {  # an epoch time; in the background, so that Ctrl-C stops it at once
    local d
    d=$(awk -v t="$1" -v now="$(date +%s.%N)" 'BEGIN { d = t - now; print (d > 0 ? d : 0) }')
    sleep "$d" & SLEEPER=$!
    wait "$SLEEPER" || true
    SLEEPER=""
}
check_alive() {
    local i
    for i in "${!PIDS[@]}"; do
        if ! kill -0 "${PIDS[$i]}" 2> /dev/null; then
            echo "worker $i exited:" >&2; tail -20 "$OUT/$LABEL-$i.log" >&2; exit 1
        fi
    done
}

# --- counters (ticks, tree, tree_ticks and pg_ticks: _common.sh) -------------------------

app_ticks() { tree_ticks "${PIDS[@]}"; }
backends() {  # "pid utime+stime" of each server process connected to the database
    local p stat
    for p in $("${PSQL[@]}" -d postgres -tAc "select pid from pg_stat_activity where datname = '$1' and pid <> pg_backend_pid()"); do
        stat=$(cat "/proc/$p/stat" 2> /dev/null) || continue
        set -- ${stat##*) }
        echo "$p $(( ${12} + ${13} ))"
    done
}
backend_delta() {  # the CPU ticks the backends open at the second sample used since the first
    awk 'NR == FNR { before[$1] = $2; next } { t += $2 - before[$1] } END { print t + 0 }' "$1" "$2"
}
xacts() { "${PSQL[@]}" -d "$1" -tAc "select xact_commit + xact_rollback from pg_stat_database where datname = '$1'"; }
load() { cut -d' ' -f1-3 /proc/loadavg; }

# --- one variant ------------------------------------------------------------------------

# run_variant LABEL DATABASE READY_SQL ROWS_SQL NAME_FORMAT WORKER_FROM -- COMMAND...
# Starts WORKERS copies of COMMAND (each with $RUNS in its environment, set by the
# caller), waits until READY_SQL counts them all, measures the window, stops them,
# and writes $OUT/LABEL.json. ROWS_SQL may be empty (the variant keeps no rows of its
# runs). Sets FIRST and LAST: the first slot left out and the slot after the window.
run_variant() {
    LABEL=$1; local db=$2 ready_sql=$3 rows_sql=$4 name_format=$5 worker_from=$6; shift 7
    local i load_before start now first last slots slot a0 p0 x0 t0 a1 p1 x1 t1
    load_before=$(load)
    for i in $(seq 0 $((WORKERS - 1))); do
        "$@" > "$OUT/$LABEL-$i.log" 2>&1 &
        PIDS+=($!)
    done
    start=$(date +%s)
    until [ "$("${PSQL[@]}" -d "$db" -tAc "$ready_sql")" -ge "$WORKERS" ]; do
        check_alive
        [ $(( $(date +%s) - start )) -lt 300 ] || { echo "$LABEL: not all up in 300 s" >&2; exit 1; }
        sleep 0.5
    done
    now=$(date +%s)
    first=$(( (now / EVERY + 1) * EVERY ))          # left out: some workers just started
    last=$(( (now + WINDOW) / EVERY * EVERY ))      # left out: the run stops after it
    FIRST=$first LAST=$last
    slots=""
    for (( slot = first + EVERY; slot < last; slot += EVERY )); do slots+=${slots:+,}$slot; done
    [ -n "$slots" ] || { echo "--seconds is too short for a measured slot" >&2; exit 1; }
    echo "$LABEL: $WORKERS up $(( now - start )) s after the start; slots measured: $slots" >&2

    sleep_until "$(awk -v s="$first" -v p="$EVERY" 'BEGIN { print s + p / 2 }')"
    t0=$(date +%s.%N); a0=$(app_ticks); p0=$(pg_ticks); x0=$(xacts "$db")
    backends "$db" > "$OUT/$LABEL-backends-0.txt"
    sleep_until "$(awk -v s="$last" -v p="$EVERY" 'BEGIN { print s - p / 2 }')"
    t1=$(date +%s.%N); a1=$(app_ticks); p1=$(pg_ticks); x1=$(xacts "$db")
    backends "$db" > "$OUT/$LABEL-backends-1.txt"
    # The last measured slot's stragglers: up to half a period (5 s at most) after it.
    sleep_until "$(awk -v s="$last" -v p="$EVERY" 'BEGIN { print s + (p / 2 < 5 ? p / 2 : 5) }')"
    check_alive
    local pids; pids=$(IFS=,; echo "${PIDS[*]}")
    stop_all

    local rows=()
    if [ -n "$rows_sql" ]; then
        "${PSQL[@]}" -d "$db" -tA -F'|' -c "$rows_sql" > "$OUT/$LABEL-rows.txt"
        rows=(--rows "$OUT/$LABEL-rows.txt")
    fi
    "${FIGURES[@]}" measure --label "$LABEL" --runs "$RUNS" "${rows[@]}" \
        --slots "$slots" --jobs "$JOBS" --name-format "$name_format" --every "$EVERY" \
        --max-concurrent "$CONCURRENCY" --worker-pids "$pids" --worker-from "$worker_from" \
        --span "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" \
        --app-ticks $((a1 - a0)) --db-ticks $((p1 - p0)) --xacts $((x1 - x0)) --tck "$TCK" \
        --backend-ticks "$(backend_delta "$OUT/$LABEL-backends-"{0,1}.txt)" \
        --load "$load_before / $(load)" --json "$OUT/$LABEL.json"
}

# APScheduler's counters between the window's samples (its workers' `counts SLOT ...`
# lines, half a period after FIRST and after the window's last slot), per instant.
aps_counts() {
    awk -v a="$FIRST" -v b="$((LAST - EVERY))" -v n="$(( (LAST - FIRST) / EVERY - 1 ))" '
        $1 == "counts" && ($2 == a || $2 == b) {
            for (i = 3; i <= NF; i++) { split($i, kv, "="); v[FILENAME, $2, kv[1]] = kv[2]; keys[kv[1]] = 1 }
            seen[FILENAME, $2] = 1; files[FILENAME] = 1
        }
        END {
            for (f in files) {
                total++
                if (!seen[f, a] || !seen[f, b]) continue
                sampled++
                for (k in keys) d[k] += v[f, b, k] - v[f, a, k]
            }
            printf "statements %.0f (executemany parameter sets %.0f), events sent (pg_notify) %.0f," \
                " notifications heard %.0f per instant; %d of %d workers sampled\n",
                d["statements"] / n, d["executemany_sets"] / n, d["notifies"] / n,
                d["received"] / n, sampled, total
        }' "$OUT"/apscheduler-[0-9]*.log
}

# --- set-up (_common.sh) --------------------------------------------------------------

prepare "$JOBS" "${EVERY}s"

version=$("$PVENV/bin/python" -c 'import importlib.metadata as m; print(m.version("procrastinate"))')
aps_version=""
if [[ ,$VARIANTS, == *,apscheduler,* ]]; then
    prepare_apscheduler
    aps_version=$("$AVENV/bin/python" -c 'import importlib.metadata as m
print(", ".join(p + " " + m.version(p) for p in ("apscheduler", "sqlalchemy", "asyncpg")))')
fi
max_connections=$("${PSQL[@]}" -d postgres -tAc "show max_connections")
if [ $(( WORKERS * (${POOL:-4} + 1) )) -gt $(( max_connections - 10 )) ]; then
    echo "warning: $WORKERS procrastinate workers hold $(( WORKERS * (${POOL:-4} + 1) )) connections" \
        "(pool ${POOL:-4} + LISTEN each); max_connections is $max_connections (see --pool)" >&2
fi
aps_connections=$(( WORKERS * (${POOL:-15} + 1) ))
if [ -n "$aps_version" ] && [ $aps_connections -gt $(( max_connections - 10 )) ]; then
    echo "warning: $WORKERS APScheduler workers may hold up to $aps_connections connections" \
        "(pool ${POOL:-5 + 10 overflow} + event broker each); max_connections is $max_connections (see --pool)" >&2
fi
code=$(git rev-parse --short HEAD)
git status --porcelain -- django_exclusive_jobs | grep -q . && code+=" with uncommitted changes to the app"
echo "machine: $(nproc) cores, load $(load); procrastinate $version (cron '$CRON');" \
    "${aps_version:+$aps_version; }code $code"
echo "$WORKERS workers x $JOBS jobs every $EVERY s, $WINDOW s a variant;" \
    "concurrency $CONCURRENCY a worker; logs in $OUT"
echo

# --- the variants -----------------------------------------------------------------------

done_json=()
for variant in ${VARIANTS//,/ }; do
    RUNS=$OUT/$variant-runs.txt
    : > "$RUNS"
    case $variant in
        procrastinate)
            "${PSQL[@]}" -d bench_procrastinate -c "truncate procrastinate_jobs, procrastinate_periodic_defers, procrastinate_events, procrastinate_workers restart identity cascade"
            run_variant "procrastinate" bench_procrastinate \
                "select count(*) from procrastinate_workers" \
                "select j.task_name, j.args->>'timestamp', extract(epoch from s.at), '',
                        extract(epoch from d.at)
                   from procrastinate_jobs j
                   join procrastinate_events s on s.job_id = j.id and s.type = 'started'
                   left join procrastinate_events d on d.job_id = j.id and d.type = 'deferred'
                  where j.status = 'succeeded'" \
                't{:02d}' runs -- \
                env SIDE_RUNS_FILE="$RUNS" SIDE_JOBS="$JOBS" SIDE_CRON="$CRON" SIDE_POOL_SIZE="$POOL" \
                PYTHONPATH="$HERE" PROCRASTINATE_APP=procrastinate_app.app \
                "$PVENV/bin/procrastinate" --log-level=warning worker --concurrency="$CONCURRENCY"
            ;;
        ours-process | ours-in-process)
            clear_ours
            in_process=$([ $variant = ours-in-process ] && echo 1 || echo 0)
            run_variant "$variant" bench_scheduler \
                "select count(*) from django_exclusive_jobs_scheduler where stopped_at is null" \
                "select name, extract(epoch from slot), extract(epoch from started_at), pid, ''
                   from django_exclusive_jobs_jobrun
                  where status = 'succeeded' and slot is not null" \
                'bench_{:03d}' rows -- \
                env "${BENCH_ENV[@]}" BENCH_IN_PROCESS="$in_process" BENCH_RUNS_FILE="$RUNS" \
                .venv/bin/python -m django exclusive_scheduler --database default \
                --max-concurrent "$CONCURRENCY" -v 0
            ;;
        apscheduler)
            "${APS[@]}" setup --jobs "$JOBS" --every "$EVERY"
            run_variant "apscheduler" bench_apscheduler \
                "select count(*) from bench_apscheduler_workers" "" 't{:02d}' runs -- \
                "${APS[@]}" worker --every "$EVERY" --max-concurrent "$CONCURRENCY" \
                ${POOL:+--pool "$POOL"} --runs "$RUNS"
            aps_line=$(aps_counts)
            ;;
        *) echo "unknown variant: $variant (procrastinate, ours-process, ours-in-process," \
               "apscheduler)" >&2; exit 2 ;;
    esac
    done_json+=("$OUT/$variant.json")
done

echo
"${FIGURES[@]}" table "${done_json[@]}"
echo
if [ -n "${aps_line:-}" ]; then
    echo "APScheduler, counted by its workers over the window: $aps_line"
    echo
fi
echo "Ours, with its statements counted by the schedulers (Django's cursor), the same size:"
echo "  .venv/bin/python benchmarks/bench_scheduler.py --backend postgresql --measure cluster" \
    "--schedulers $WORKERS --jobs $JOBS --every ${EVERY}s --seconds $WINDOW --max-concurrent $CONCURRENCY [--in-process]"
echo "load after: $(load); logs, runs files and rows in $OUT"
