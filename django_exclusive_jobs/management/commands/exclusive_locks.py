"""``manage.py exclusive_locks``: list locks and release stale ones, without a browser."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_exclusive_jobs.dbtime import database_now
from django_exclusive_jobs.exceptions import JobLockError
from django_exclusive_jobs.locks import check_outside_transaction, resolve_alias, run_statement
from django_exclusive_jobs.models import JobLock, LockState

EPILOG = """\
exit codes: 0 done; 1 refused (a live lock without --force) or no such lock;
2 usage error; 3 the database cannot be reached.
"""


class Command(BaseCommand):
    help = "List job locks and their state; release stale locks (live ones need --force)."

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        kwargs.setdefault("epilog", EPILOG)
        return super().create_parser(prog_name, subcommand, **kwargs)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--stale", action="store_true", help="only locks whose lease ran out")
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        parser.add_argument("--release", metavar="NAME", help="release the lock NAME")
        parser.add_argument("--release-stale", action="store_true", help="release every stale lock")
        parser.add_argument(
            "--force", action="store_true", help="with --release: release a live lock too"
        )
        parser.add_argument("--database", help="database alias of the lock table")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            alias = resolve_alias(options["database"])
            check_outside_transaction(alias)
            if options["release"] is not None:
                self._release(alias, options["release"], force=options["force"])
            elif options["release_stale"]:
                count = run_statement(
                    alias, lambda: JobLock.objects.using(alias).stale().force_release()
                )
                self.stdout.write(f"released {count} stale lock(s)")
            else:
                self._list(alias, stale=options["stale"], as_json=options["json"])
        except JobLockError as exc:
            code = 2 if exc.__class__.__name__ == "LockConfigurationError" else 3
            raise CommandError(str(exc), returncode=code) from exc

    def _release(self, alias: str, name: str, *, force: bool) -> None:
        locks = JobLock.objects.using(alias)
        lock = run_statement(alias, lambda: locks.with_state().filter(name=name).first())
        if lock is None:
            raise CommandError(f"No lock named {name!r}.", returncode=1)
        state = lock.state  # type: ignore[attr-defined]
        if state == LockState.HELD and not force:
            raise CommandError(
                f"Lock {name!r} is live (held by {lock.owner} until "
                f"{lock.expires_at:%Y-%m-%d %H:%M:%S} UTC); its job may still be running. "
                "Add --force to release it anyway.",
                returncode=1,
            )
        changed = run_statement(alias, lambda: locks.filter(pk=lock.pk).force_release())
        self.stdout.write(
            f"released {name} (was {state}, token {lock.token})"
            if changed
            else f"{name} was already free"
        )

    def _list(self, alias: str, *, stale: bool, as_json: bool) -> None:
        locks = JobLock.objects.using(alias)
        queryset = (locks.stale() if stale else locks.all()).with_state().order_by("name")
        rows = run_statement(alias, lambda: list(queryset))
        suspect = set(
            run_statement(alias, lambda: list(locks.suspect().values_list("name", flat=True)))
        )
        now = database_now(alias)
        records = [
            {
                "name": lock.name,
                "state": lock.state,  # type: ignore[attr-defined]
                "suspect": lock.name in suspect,
                "owner": lock.owner,
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
            state = record["state"] + ("!" if record["suspect"] else "")
            self.stdout.write(
                f"{record['name']:<{width}}  {state:<9} {record['token']:>6}  {lease:<15} "
                f"{record['owner'] or '-'}"
            )


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None
