"""``manage.py exclusive_locks [list | force-release NAME | force-release --stale]``."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from django_exclusive_jobs.lock.clock import database_now
from django_exclusive_jobs.lock.retry import run_statement
from django_exclusive_jobs.lock.validation import check_outside_transaction, resolve_alias
from django_exclusive_jobs.management.base import JobCommand, name_option, operator
from django_exclusive_jobs.management.output import given, one_line
from django_exclusive_jobs.models import JobLock, LockState
from django_exclusive_jobs.run.registry import warn_afters

EPILOG = """\
list (the default) shows every lock; force-release frees a lock whoever holds it.
exit codes: 0 done; 1 refused (a held lock without --live) or no such lock;
2 usage or configuration error (a NAME no lock can have, an unknown database alias,
migrations not applied);
3 the database cannot be reached.
"""


class Command(JobCommand):
    epilog = EPILOG
    help = "List job locks and their state; force-release stale ones (held ones need --live)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", nargs="?", choices=["list", "force-release"], default="list")
        parser.add_argument(
            "name",
            nargs="?",
            type=name_option("Lock name"),
            help="with force-release: the lock to free",
        )
        parser.add_argument(
            "--stale",
            action="store_true",
            help="list: only stale locks; force-release: every stale lock",
        )
        parser.add_argument(
            "--live", action="store_true", help="force-release: free a held lock too"
        )
        parser.add_argument("--json", action="store_true", help="list: machine-readable output")
        parser.add_argument("--database", help="database alias of the lock table")

    def handle(self, *args: Any, **options: Any) -> None:
        action, name, stale = options["action"], options["name"], options["stale"]
        if action == "list" and name is not None:
            raise CommandError(f"list takes no NAME (got {name!r}).", returncode=2)
        if action == "force-release" and (name is None) == (not stale):
            raise CommandError("force-release takes a NAME or --stale (one of them).", returncode=2)
        alias = resolve_alias(options["database"])
        check_outside_transaction(alias)
        if action == "list":
            self._list(alias, stale=stale, as_json=options["json"])
        elif stale:
            locks = JobLock.objects.using(alias).stale()
            count = run_statement(alias, lambda: locks.force_release(by=operator()))
            self.stdout.write(f"force-released {count} stale lock(s)")
        else:
            self._force_release(alias, name, live=options["live"])

    def _force_release(self, alias: str, name: str, *, live: bool) -> None:
        locks = JobLock.objects.using(alias)
        lock = run_statement(alias, lambda: locks.state_of(name))
        if lock is None:
            raise CommandError(f"No lock named {name!r}.", returncode=1)
        state = lock.state  # type: ignore[attr-defined]
        if state == LockState.HELD and not live:
            raise CommandError(
                f"Lock {name!r} is held by {lock.holder} until "
                f"{lock.expires_at:%Y-%m-%d %H:%M:%S} UTC; its job may still be running. "
                "Add --live to force-release it anyway.",
                returncode=1,
            )
        # The state was read a moment ago: without --live the UPDATE itself refuses a lock
        # that has been taken since.
        target = locks.row(lock.pk)
        freed = target if live else target.not_held()
        changed = run_statement(alias, lambda: freed.force_release(by=operator()))
        if changed:
            self.stdout.write(one_line(f"force-released {name} (was {state}, token {lock.token})"))
        elif not live and run_statement(alias, target.held().exists):
            raise CommandError(
                f"Lock {name!r} was taken meanwhile; add --live to force-release it anyway.",
                returncode=1,
            )
        else:
            self.stdout.write(one_line(f"{name} was already free"))

    def _list(self, alias: str, *, stale: bool, as_json: bool) -> None:
        locks = JobLock.objects.using(alias)
        queryset = locks.listed(stale=stale)
        rows = run_statement(alias, lambda: list(queryset))
        limits = warn_afters()
        long_ones = locks.running_long(warn_after=limits).values_list("name", flat=True)
        running_long = set(run_statement(alias, lambda: list(long_ones)))
        now = database_now(alias)
        records = [
            {
                "name": lock.name,
                "state": lock.state,  # type: ignore[attr-defined]
                "running_long": lock.name in running_long,
                "holder": lock.holder,
                "host": lock.host,
                "pid": lock.pid,
                "token": lock.token,
                "acquired_at": _iso(lock.acquired_at),
                "expires_at": _iso(lock.expires_at),
                "released_at": _iso(lock.released_at),
                "seconds_left": round((lock.expires_at - now).total_seconds(), 3)
                if lock.expires_at
                else None,
            }
            for lock in rows
        ]
        if as_json:
            self.stdout.write(json.dumps(records, indent=2))
            return
        if not records:
            self.stdout.write("no stale locks" if stale else "no locks")
            return
        width = max(len(record["name"]) for record in records)
        self.stdout.write(f"{'NAME':<{width}}  {'STATE':<9} {'TOKEN':>6}  LEASE           HOLDER")
        for record in records:
            left = record["seconds_left"]
            lease = (
                "-"
                if left is None
                else (f"ends in {left:.0f}s" if left > 0 else f"ended {-left:.0f}s ago")
            )
            state = record["state"] + ("!" if record["running_long"] else "")
            self.stdout.write(
                one_line(
                    f"{record['name']:<{width}}  {state:<9} {record['token']:>6}  {lease:<15} "
                    f"{given(record['holder'] or '-')}"
                )
            )


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None
