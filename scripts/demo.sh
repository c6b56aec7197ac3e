#!/usr/bin/env bash
# The demo: five "servers" run the same crontab line at the same instant, on one SQLite
# database. Exactly one runs hourly_report; the others skip and say why.
# Each run starts from a new database, so the demo can be run again within the hour.
# The last line sums up the race; .ci/run checks it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh
ensure_venv demo

PY="$(cd "$VENV" && pwd)/bin/python"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
export DATABASE_URL="sqlite:///$WORK/demo.sqlite3"
cd testproject
"$PY" manage.py migrate -v 0
SERVERS="${SERVERS:-5}"
echo "== $SERVERS processes run 'manage.py run_exclusive hourly_report' at once"
for i in $(seq 1 "$SERVERS"); do
    ( "$PY" manage.py run_exclusive hourly_report 2>&1 | sed "s/^/[server $i] /" ) &
done > "$WORK/race.log"
wait
cat "$WORK/race.log"
echo "== the lock and the run history afterwards"
"$PY" manage.py exclusive_locks
"$PY" manage.py shell -v 0 -c "
from django_exclusive_jobs.models import JobRun
for run in JobRun.objects.all():
    print(f'run of {run.name}: slot {run.slot:%Y-%m-%d %H:%M} {run.status} by {run.holder}')
"
ran=$(grep -c "\] acquired hourly_report" "$WORK/race.log" || true)
skipped=$(grep -c "\] skipped hourly_report" "$WORK/race.log" || true)
echo "== $ran of $SERVERS servers ran hourly_report; $skipped skipped"
