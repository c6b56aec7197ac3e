"""Taking a lock: one decision per try, a wait loop, and the public entry points.

A decision is the ``take`` statement (``sql.py``). A declared job's row is made ahead of
its first take by :func:`prepare_locks` (after ``migrate``, at the scheduler's start), so
racing servers only ever meet in the ``take``. A name that still has no row (one created
on the fly) gets one from ``get_or_create`` inside ``transaction.atomic``, where the
unique name lets one insert win.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import Max

from ..conf import app_settings
from ..logs import extra
from .clock import DatabaseNow, now_plus
from .durations import DurationLike
from .errors import JobLockError, LockHeld, LockLost
from .lock import Lock, held_here, process
from .retry import run_statement
from .sql import Row, Statements
from .validation import (
    check_outside_transaction,
    resolve_alias,
    validate_name,
    validate_timing,
    validate_wait,
)

logger = logging.getLogger("django_exclusive_jobs")


@dataclass(frozen=True)
class Held:
    """A lock we did not get, and who holds it (what :class:`LockHeld` reports)."""

    name: str
    holder: str
    expires_at: dt.datetime | None
    token: int | None = None  # the holder's


def try_acquire(
    name: str,
    *,
    ttl: DurationLike | None = None,
    min_hold: DurationLike | None = None,
    wait: DurationLike | None = None,
    using: str | None = None,
) -> Lock | None:
    """Take the lock ``name`` if nobody holds it; return the :class:`Lock`, or None.

    Never waits unless ``wait`` (seconds or a duration string) is given; then polls with
    backoff until acquired or the time is up. The caller must ``release()`` the lock;
    no keep-alive runs unless ``lock.start_keepalive()`` is called.
    """
    result = acquire(name, ttl=ttl, min_hold=min_hold, wait=wait, using=using)
    return result if isinstance(result, Lock) else None


def acquire_or_raise(
    name: str,
    *,
    ttl: DurationLike | None = None,
    min_hold: DurationLike | None = None,
    wait: DurationLike | None = None,
    using: str | None = None,
    reentrant: bool = True,
    stop_waiting: Callable[[], bool] | None = None,
) -> Lock:
    """Like :func:`try_acquire` but raise :class:`LockHeld` (with the holder) on a skip."""
    result = acquire(
        name,
        ttl=ttl,
        min_hold=min_hold,
        wait=wait,
        using=using,
        reentrant=reentrant,
        stop_waiting=stop_waiting,
    )
    if isinstance(result, Held):
        raise LockHeld(
            result.name,
            holder=result.holder,
            expires_at=result.expires_at,
            token=result.token,
        )
    return result


@contextmanager
def exclusive_lock(
    name: str,
    *,
    ttl: DurationLike | None = None,
    min_hold: DurationLike | None = None,
    wait: DurationLike | None = None,
    using: str | None = None,
    keepalive: bool | None = None,
) -> Iterator[Lock]:
    """Hold ``name`` for the ``with`` block, renewing it in the background.

    Raises :class:`LockHeld` when another holder has it. Works as a decorator too; each
    call takes its own lock.
    """
    lock = acquire_or_raise(name, ttl=ttl, min_hold=min_hold, wait=wait, using=using)
    if app_settings.KEEPALIVE if keepalive is None else keepalive:
        lock.start_keepalive()
    try:
        yield lock
    finally:
        try:
            lock.release()
        except JobLockError:
            logger.exception(
                "could not release %s token=%s",
                lock.name,
                lock.token,
                extra=extra("database", lock=lock.name, token=lock.token, status="release_failed"),
            )


def force_release(name: str, *, using: str | None = None) -> bool:
    """Free ``name`` now, whoever holds it (an operator's action, as in the admin).

    The holder's next renew or ``ensure_held()`` raises ``LockLost``.
    """
    from ..models import JobLock  # models: not before apps are ready

    checked = validate_name(name)
    alias = resolve_alias(using)
    check_outside_transaction(alias)
    locks = JobLock.objects.using(alias).filter(name=checked)
    return bool(run_statement(alias, locks.force_release))


def acquire(
    name: object,
    *,
    ttl: DurationLike | None = None,
    min_hold: DurationLike | None = None,
    wait: DurationLike | None = None,
    using: str | None = None,
    reentrant: bool = True,
    stop_waiting: Callable[[], bool] | None = None,
) -> Lock | Held:
    """Decide, and with ``wait`` decide again with backoff until won or the time is up.

    ``reentrant``: a thread that holds ``name`` already gets a nested Lock (a job's run
    passes False: a second run of a job in one thread, or one more async call sharing
    Django's sync thread, must skip like any other). ``stop_waiting`` ends the wait early
    when it returns True (a signal arrived).
    """
    checked = validate_name(name)
    ttl_delta, hold = validate_timing(ttl, min_hold)
    wait_seconds = validate_wait(wait)
    alias = resolve_alias(using)
    check_outside_transaction(alias)
    nested = _reenter(alias, checked) if reentrant else None
    if nested is not None:
        return nested
    deadline = time.monotonic() + wait_seconds
    delay = 0.05
    while True:
        result = decide(checked, alias, ttl_delta, hold)
        if isinstance(result, Lock):
            held_here()[(alias, checked)] = result
            logger.debug("acquired %s token=%s holder=%s", checked, result.token, result.holder)
            return result
        remaining = deadline - time.monotonic()
        if remaining <= 0 or (stop_waiting is not None and stop_waiting()):
            return result
        time.sleep(min(remaining, delay * random.uniform(0.8, 1.2), 0.5))
        delay = min(delay * 1.6, 2.0)


def decide(name: str, alias: str, ttl: dt.timedelta, min_hold: dt.timedelta) -> Lock | Held:
    """One decision: the Lock if we won, else who holds it."""
    started = time.monotonic()
    statements = Statements(connections[alias])
    me = process.me()
    tries = 0

    def take() -> tuple[bool, Row | None]:
        nonlocal tries
        tries += 1
        return statements.take(name, ttl.total_seconds(), me)

    taken, row = run_statement(alias, take)
    if row is None:
        return _create(name, alias, ttl, min_hold, started)
    # A retried take whose first try had committed finds the lock held by itself.
    if taken or (tries > 1 and row.taken_by(me)):
        return _won(name, alias, ttl, min_hold, row, started)
    return Held(name, row.holder, row.expires_at, row.token)


def _create(
    name: str, alias: str, ttl: dt.timedelta, min_hold: dt.timedelta, started: float
) -> Lock | Held:
    """The name's first take: ``get_or_create`` its row; the unique name lets one win."""
    from ..models import JobLock  # models: not before apps are ready

    me = process.me()
    rows = JobLock.objects.using(alias)
    now = DatabaseNow()
    defaults: dict[str, Any] = {
        "host": me.host,
        "pid": me.pid,
        "instance": me.instance,
        "thread": me.thread,
        "acquired_at": now,
        "expires_at": now_plus(ttl),
    }

    def create() -> tuple[JobLock, bool]:
        defaults["token"] = _first_token(alias, name)
        try:
            with transaction.atomic(using=alias):
                return rows.get_or_create(name=name, defaults=defaults)
        except IntegrityError:
            # Inserted and deleted again between get and create: someone else decided.
            return rows.get_or_create(name=name, defaults=defaults)

    row, created = run_statement(alias, create)
    # The row did not exist when we looked: one with our process and thread is the one
    # our create made before a dropped connection made it retry.
    ours = (row.instance, row.thread, row.released_at) == (me.instance, me.thread, None)
    if not created and not ours:
        return Held(name, row.holder, row.expires_at, row.token)
    run_statement(alias, lambda: row.refresh_from_db(fields=["acquired_at", "expires_at"]))
    return _won(name, alias, ttl, min_hold, row, started)


def _won(
    name: str,
    alias: str,
    ttl: dt.timedelta,
    min_hold: dt.timedelta,
    row: Any,
    started: float,
    parent: Lock | None = None,
) -> Lock:
    """The Lock for the acquisition ``row`` shows (a Row, a JobLock or the outer Lock)."""
    return Lock(
        name=name,
        using=alias,
        ttl=ttl,
        min_hold=min_hold,
        token=row.token,
        acquired_at=row.acquired_at,
        expires_at=row.expires_at,
        started=started,
        parent=parent,
    )


def prepare_locks(
    names: Iterable[str], *, using: str | None = None, tokens_of: str | None = None
) -> int:
    """Make sure each of ``names`` has its lock row; return how many were missing.

    A missing row is inserted free (never held, so the first ``take`` wins it) with the
    highest token of the name's run history (0 if none): the take adds one, so the first
    token is the one a row created on the fly starts with (``_first_token``).
    ``tokens_of``: the run history whose tokens count instead (a job's, for the locks of
    its slots).
    One conflict-ignoring insert (``ON CONFLICT DO NOTHING``, ``INSERT IGNORE``): servers
    preparing at once never make the database report a duplicate key. Nothing is sent
    but one ``SELECT`` when every row exists.
    """
    from ..models import JobLock  # models: not before apps are ready

    wanted = sorted({validate_name(name) for name in names})
    alias = resolve_alias(using)
    rows = JobLock.objects.using(alias)

    def insert_missing() -> int:
        existing = set(rows.filter(name__in=wanted).values_list("name", flat=True))
        missing = [name for name in wanted if name not in existing]
        if missing:
            tops = _top_tokens(alias, [tokens_of] if tokens_of else missing)
            free = [JobLock(name=name, token=tops.get(tokens_of or name, 0)) for name in missing]
            rows.bulk_create(free, ignore_conflicts=True)
        return len(missing)

    return run_statement(alias, insert_missing) if wanted else 0


def _first_token(alias: str, name: str) -> int:
    """The token for a new row: above any this name had, even if its row was deleted.

    Run history remembers the tokens of past runs, so a lock row deleted by hand does
    not bring back a token a fenced write has already seen.
    """
    return _top_tokens(alias, [name]).get(name, 0) + 1


def _top_tokens(alias: str, names: list[str]) -> dict[str, int]:
    """The highest token in run history of each of ``names`` that has one (one query)."""
    from ..models import JobRun  # models: not before apps are ready

    runs = JobRun.objects.using(alias).filter(name__in=names, token__isnull=False)
    return dict(runs.values_list("name").annotate(top=Max("token")).order_by())


def _reenter(alias: str, name: str) -> Lock | None:
    """A nested Lock if this thread already holds ``name`` (its lease is renewed first)."""
    outer = held_here().get((alias, name))
    if outer is None or not outer.held:
        return None
    try:
        outer.renew()
    except LockLost:
        return None
    return _won(name, alias, outer.ttl, outer.min_hold, outer, time.monotonic(), parent=outer)
