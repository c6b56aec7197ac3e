#!/usr/bin/env bash
# The demo: five "servers" run the same crontab line at the same instant, on one SQLite
# database. Exactly one runs hourly_report; the others skip and say who holds the lock.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_env.sh
ensure_venv demo

cd testproject
PY="../$VENV/bin/python"
"$PY" manage.py migrate -v 0
SERVERS="${SERVERS:-5}"
echo "== $SERVERS processes run 'manage.py run_exclusive hourly_report' at once"
for i in $(seq 1 "$SERVERS"); do
    ( "$PY" manage.py run_exclusive hourly_report 2>&1 | sed "s/^/[server $i] /" ) &
done
wait
echo "== the lock table afterwards"
"$PY" manage.py shell -v 0 -c "
from django_exclusive_jobs.models import JobLock
for lock in JobLock.objects.with_state():
    print(f'{lock.name}: state={lock.state} token={lock.token} last holder={lock.holder}')
"
