# What side_by_side.sh and burst.sh share, sourced by both from the repository's root:
# the PostgreSQL client, procrastinate's virtualenv (/tmp/side-by-side-venv, from PyPI),
# the two databases, and CPU counters read from /proc.
PSQL=(psql -h 127.0.0.1 -U postgres -X -q -v ON_ERROR_STOP=1)
PVENV=/tmp/side-by-side-venv
TCK=$(getconf CLK_TCK)
export SIDE_DSN=postgresql://postgres@127.0.0.1:5432/bench_procrastinate

prepare() {  # JOBS EVERY: procrastinate installed, both databases made, BENCH_ENV set, migrated
    if [ ! -x "$PVENV/bin/procrastinate" ]; then
        python3 -m venv "$PVENV"
        "$PVENV/bin/pip" install -q procrastinate 'psycopg[binary]'
    fi
    local db
    for db in bench_procrastinate bench_scheduler; do
        if [ "$("${PSQL[@]}" -d postgres -tAc "select 1 from pg_database where datname='$db'")" != 1 ]; then
            "${PSQL[@]}" -d postgres -c "create database $db"
        fi
    done
    if [ "$("${PSQL[@]}" -d bench_procrastinate -tAc "select to_regclass('procrastinate_jobs') is not null")" != t ]; then
        PYTHONPATH="$PWD/benchmarks/side_by_side" PROCRASTINATE_APP=procrastinate_app.app \
            "$PVENV/bin/procrastinate" schema --apply > /dev/null
    fi
    BENCH_ENV=(BENCH_BACKEND="${BACKEND:-postgresql}" DJANGO_SETTINGS_MODULE=scheduler_bench.settings
        PYTHONPATH="$PWD/benchmarks:$PWD" BENCH_JOBS="$1" BENCH_EVERY="$2")
    clear_ours  # made and migrated if need be (MariaDB's, SQLite's too), then emptied
}

clear_ours() {  # our tables emptied between variants
    env "${BENCH_ENV[@]}" .venv/bin/python -c "
import sys; sys.path.insert(0, 'benchmarks')
from bench_scheduler import prepare_database, clear_tables
prepare_database('${BACKEND:-postgresql}'); clear_tables()" > /dev/null
}

ticks() {  # utime + stime of one process, and of its children it has waited for (0 once gone)
    local stat
    stat=$(cat "/proc/$1/stat" 2> /dev/null) || { echo 0; return; }
    set -- ${stat##*) }
    echo $(( ${12} + ${13} + ${14} + ${15} ))
}
tree() {  # the process and every process under it
    local child
    echo "$1"
    for child in $(cat /proc/"$1"/task/*/children 2> /dev/null); do tree "$child"; done
}
ticks_of() { local t=0 p; for p in "$@"; do t=$(( t + $(ticks "$p") )); done; echo $t; }
tree_ticks() {  # ticks of the processes given and of every process under them
    local p all=()
    for p in "$@"; do all+=($(tree "$p")); done
    ticks_of "${all[@]}"
}
pg_ticks() { ticks_of $(pgrep -u postgres); }
ours_db_ticks() {  # the database server our variants use (SQLite: none, it is in the process)
    case "${BACKEND:-postgresql}" in
        postgresql) pg_ticks ;;
        mysql) ticks_of $(pgrep -x mariadbd || pgrep -x mysqld) ;;
        *) echo 0 ;;
    esac
}
