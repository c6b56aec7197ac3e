"""The lock engine: acquire, renew and release one ``JobLock`` row on database time.

Every decision is one SQL statement whose WHERE clause compares against the database's
clock, and whose row count says who won:

* take over: ``UPDATE ... SET token = token + 1 ... WHERE name = %s AND lease over``
* create:    ``get_or_create`` inside ``atomic``; the unique name lets one insert win
* renew:     ``UPDATE ... WHERE name = %s AND token = mine AND not released AND lease open``
* release:   ``UPDATE ... SET released_at = now, expires_at = max(now, acquired + min_hold)``
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import os
import random
import socket
import threading
import time
import unicodedata
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import (
    DatabaseError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    connections,
    router,
    transaction,
)
from django.db.models import BigIntegerField, BooleanField, Case, F, Func, Q, When
from django.db.models.functions import Greatest

from . import signals
from .conf import app_settings
from .dbtime import DatabaseNow, now_plus
from .durations import DurationLike, parse_duration
from .exceptions import (
    JobLockError,
    LockConfigurationError,
    LockDatabaseError,
    LockHeld,
    LockLost,
)
from .statements import NAME, THREAD, TOKEN, compile_select, compile_update, run_compiled

if TYPE_CHECKING:
    from .models import JobLock, JobLockQuerySet

logger = logging.getLogger("django_exclusive_jobs")

MAX_NAME_LENGTH = 255
MIN_TTL = dt.timedelta(milliseconds=100)
T = TypeVar("T")


# --- who we are -----------------------------------------------------------------------


class _Identity:
    """Host, pid and a random instance id, renewed in a forked child."""

    def __init__(self) -> None:
        self.refresh()

    def refresh(self) -> None:
        self.host = socket.gethostname()[:255]
        self.pid = os.getpid()
        self.instance = uuid.uuid4().hex

    def owner(self) -> str:
        return f"{self.host}:{self.pid}:{self.instance[:8]}"


identity = _Identity()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=identity.refresh)


# --- input checks (before any SQL) ----------------------------------------------------


def validate_name(name: object) -> str:
    if not isinstance(name, str):
        raise LockConfigurationError(f"Lock name must be a string, not {type(name).__name__}.")
    problem = _name_problem(name)
    if problem:
        raise LockConfigurationError(problem)
    return name


@functools.lru_cache(maxsize=1024)
def _name_problem(name: str) -> str | None:
    """What is wrong with a name, if anything (remembered: a server uses a few names)."""
    if not name:
        return "Lock name must not be empty."
    if len(name) > MAX_NAME_LENGTH:
        return f"Lock name is {len(name)} characters long; the limit is {MAX_NAME_LENGTH}."
    if any(unicodedata.category(char) in ("Cc", "Cs") for char in name):
        return f"Lock name {name!r} contains a control character."
    if name != name.strip():
        return f"Lock name {name!r} must not start or end with white space."
    return None


def _duration(value: DurationLike | None, default: Any, what: str) -> dt.timedelta:
    value = default if value is None else value
    try:
        try:
            return _parsed(value, what)
        except TypeError:  # unhashable: parse it without the cache (and fail clearly)
            return parse_duration(value, what=what)
    except ValueError as exc:
        raise LockConfigurationError(str(exc)) from None


@functools.lru_cache(maxsize=256, typed=True)
def _parsed(value: DurationLike, what: str) -> dt.timedelta:
    return parse_duration(value, what=what)


def validate_timing(
    ttl: DurationLike | None,
    min_hold: DurationLike | None,
    *,
    use_settings: bool = True,
    current: dict[str, Any] | None = None,
) -> tuple[dt.timedelta, dt.timedelta]:
    """Check ``ttl`` and ``min_hold``; with ``use_settings`` fill gaps from EXCLUSIVE_JOBS.

    Without it only the values given are checked (used at import time, before the
    system checks have looked at the settings). ``current`` is the settings already read.
    """
    defaults: tuple[Any, Any] = (None, None)
    if use_settings:
        settings_now = app_settings.current() if current is None else current
        defaults = (settings_now["TTL"], settings_now["MIN_HOLD"])
    try:
        return _timing(ttl, min_hold, use_settings, *defaults)
    except TypeError:  # an unhashable value: check it without the cache (and fail clearly)
        return _timing.__wrapped__(ttl, min_hold, use_settings, *defaults)


@functools.lru_cache(maxsize=256, typed=True)
def _timing(
    ttl: DurationLike | None,
    min_hold: DurationLike | None,
    use_settings: bool,
    default_ttl: Any,
    default_hold: Any,
) -> tuple[dt.timedelta, dt.timedelta]:
    """The checked (ttl, min_hold), the defaults filling gaps when settings are used."""
    if not use_settings and ttl is None:
        ttl_delta = dt.timedelta.max
    else:
        ttl_delta = _duration(ttl, default_ttl, "ttl")
    if ttl_delta <= dt.timedelta(0):
        raise LockConfigurationError(f"ttl must be positive, got {ttl_delta.total_seconds():g}s.")
    if ttl_delta < MIN_TTL:
        raise LockConfigurationError(
            f"ttl must be at least {MIN_TTL.total_seconds():g}s, got "
            f"{ttl_delta.total_seconds():g}s: the lease would end before the job starts."
        )
    if not use_settings and min_hold is None:
        return ttl_delta, dt.timedelta(0)
    hold = _duration(min_hold, default_hold, "min_hold")
    if hold < dt.timedelta(0):
        raise LockConfigurationError(
            f"min_hold must not be negative, got {hold.total_seconds():g}s."
        )
    if hold > ttl_delta:
        raise LockConfigurationError(
            f"min_hold ({hold.total_seconds():g}s) must not be longer than ttl "
            f"({ttl_delta.total_seconds():g}s): the lease could end before the hold."
        )
    return ttl_delta, hold


def _lock_model() -> type[JobLock]:
    """The JobLock model (imported on first use: the app registry must be ready)."""
    global _JobLock
    if _JobLock is None:
        from .models import JobLock

        _JobLock = JobLock
    return _JobLock


_JobLock: type[JobLock] | None = None


def resolve_alias(using: str | None, current: dict[str, Any] | None = None) -> str:
    """The database alias for the lock table: argument, setting, then routers.

    ``current`` is the settings already read (``app_settings.current()``).
    """
    alias = using
    if alias is None:
        database = app_settings.DATABASE if current is None else current["DATABASE"]
        alias = database or router.db_for_write(_lock_model())
    if not isinstance(alias, str) or alias not in connections.settings:
        known = ", ".join(sorted(connections.settings))
        raise LockConfigurationError(
            f"Unknown database alias {alias!r} for the lock table; known aliases: {known}."
        )
    return alias


def check_outside_transaction(alias: str, connection: Any = None) -> None:
    """Refuse to lock inside a transaction; ``connection`` is ``connections[alias]``."""
    if connection is None:
        connection = connections[alias]
    try:
        autocommit = connection.get_autocommit()
    except DatabaseError as exc:
        connection.close_if_unusable_or_obsolete()
        raise LockDatabaseError(f"Cannot reach database {alias!r}: {_one_line(exc)}") from exc
    if connection.in_atomic_block or not autocommit:
        raise LockConfigurationError(
            f"The lock's database {alias!r} is inside a transaction (atomic block, "
            "ATOMIC_REQUESTS or a TestCase), so other servers could not see the lock until "
            "it commits. Take the lock outside the transaction, or point "
            "EXCLUSIVE_JOBS['DATABASE'] at a second alias for the same database."
        )


# --- running statements ---------------------------------------------------------------

_MYSQL_RETRYABLE = {1205, 1213}  # lock wait timeout, deadlock
# Can't connect, server gone away, lost connection during query, out of sync.
_MYSQL_DROPPED = {2002, 2003, 2006, 2013, 2055}
RECONNECT_DELAYS = (0.2, 0.5, 1.0)


def _is_busy(exc: BaseException) -> bool:
    """A contention error the statement can simply be retried after."""
    if "database is locked" in str(exc) or "database table is locked" in str(exc):
        return True
    return _error_code(exc) in _MYSQL_RETRYABLE


def _error_code(exc: BaseException) -> Any:
    """The driver's error number (MySQL's come first in the exception's args), if any."""
    args: tuple[Any, ...] = getattr(exc.__cause__ or exc, "args", ())
    return args[0] if args else None


def _connection_dropped(alias: str, exc: BaseException) -> bool:
    """Whether ``exc`` means the connection is gone (not a deadlock, timeout, bad SQL)."""
    if isinstance(exc, InterfaceError):
        return True
    connection = connections[alias]
    raw = connection.connection
    if raw is None:  # it could not even connect
        return True
    if connection.vendor == "postgresql":
        return bool(getattr(raw, "closed", False) or getattr(raw, "broken", False))
    if connection.vendor == "mysql":
        return not getattr(raw, "open", True) or _error_code(exc) in _MYSQL_DROPPED
    return False  # SQLite is a file: there is no connection to lose


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _table_missing(alias: str) -> bool:
    from .models import JobLock

    try:
        with connections[alias].cursor() as cursor:
            tables = connections[alias].introspection.table_names(cursor)
    except DatabaseError:
        return False
    return JobLock._meta.db_table not in tables


def run_statement(alias: str, operation: Callable[[], T]) -> T:
    """Run ``operation`` against ``alias``, retrying contention errors within a bound.

    SQLite answers "database is locked" when another process writes; MySQL may pick a
    deadlock victim among racing inserts. Neither means "held", so retry with backoff.
    A missing table or an unreachable server becomes one clear ``JobLockError``.
    """
    deadline: float | None = None  # set at the first busy answer: most calls never see one
    delay = 0.005
    reconnects = list(RECONNECT_DELAYS)
    while True:
        try:
            return operation()
        except (OperationalError, InterfaceError) as exc:
            if _is_busy(exc):
                if deadline is None:
                    bound = parse_duration(app_settings.SQLITE_BUSY_TIMEOUT).total_seconds()
                    deadline = time.monotonic() + bound
                if time.monotonic() + delay < deadline:
                    time.sleep(delay * random.uniform(0.5, 1.5))
                    delay = min(delay * 2, 0.25)
                    continue
            connection = connections[alias]
            dropped = _connection_dropped(alias, exc)
            if dropped:
                with suppress(DatabaseError):
                    connection.close()
            else:
                connection.close_if_unusable_or_obsolete()
            if dropped and reconnects and not connection.in_atomic_block:
                # A dropped connection (server restart, network blip): try again on a
                # fresh one a few times before calling the database unreachable.
                pause = reconnects.pop(0)
                logger.info(
                    "connection to database %r dropped, reconnecting in %gs: %s",
                    alias,
                    pause,
                    _one_line(exc),
                )
                time.sleep(pause)
                continue
            if _table_missing(alias):
                raise LockConfigurationError(
                    f"The lock table does not exist on database {alias!r}: "
                    "run 'manage.py migrate django_exclusive_jobs'."
                ) from exc
            raise LockDatabaseError(
                f"Database {alias!r} did not answer the lock statement: {_one_line(exc)}"
            ) from exc
        except IntegrityError:
            raise  # an answer, not a failure: the caller decides what it means
        except DatabaseError as exc:
            if _table_missing(alias):
                raise LockConfigurationError(
                    f"The lock table does not exist on database {alias!r}: "
                    "run 'manage.py migrate django_exclusive_jobs'."
                ) from exc
            raise


# --- the lock -------------------------------------------------------------------------

_HELD = "held"
_RELEASED = "released"
_LOST = "lost"

#: A time the take did not return (MariaDB, MySQL): read from the row when first used.
UNREAD: Any = type("Unread", (), {"__repr__": lambda self: "UNREAD"})()

_registry = threading.local()  # (alias, name) -> outermost Lock held by this thread


def _held_here() -> dict[tuple[str, str], Lock]:
    held: dict[tuple[str, str], Lock] | None = getattr(_registry, "held", None)
    if held is None:
        held = _registry.held = {}
    return held


class Lock:
    """One acquisition of a named lock. Made by :func:`try_acquire`; not shared between threads.

    ``token`` is the fencing token: it grows by one at every acquisition of the name, so
    a write guarded by ``WHERE token >= mine`` refuses a holder that was taken over.
    """

    #: The lock's name (one lock per name and database).
    name: str
    #: The database alias the lock row lives on.
    using: str
    #: How long each lease lasts; keep-alive renews it every ttl/3.
    ttl: dt.timedelta
    #: On release the lease stays until ``acquired_at + min_hold``.
    min_hold: dt.timedelta
    #: The fencing token: one higher at every acquisition of the name, never reused.
    token: int
    #: This holder: ``host:pid:instance`` (the instance id is random per process).
    owner: str

    def __init__(
        self,
        *,
        name: str,
        using: str,
        ttl: dt.timedelta,
        min_hold: dt.timedelta,
        token: int,
        acquired_at: dt.datetime | None,
        expires_at: dt.datetime | None,
        started: float,
        parent: Lock | None = None,
    ) -> None:
        self.name = name
        self.using = using
        self.ttl = ttl
        self.min_hold = min_hold
        self.token = token
        self.owner = identity.owner()
        self._acquired_at = acquired_at
        self._expires_at = expires_at
        self.lost_reason: str | None = None
        self._parent = parent
        self._state = _HELD
        # The lease was written as db_now + ttl with db_now later than `started`, so
        # `started + ttl` on our monotonic clock is never later than the real expiry.
        self._deadline = started + ttl.total_seconds()
        self._mutex = threading.Lock()
        self._keepalive: Any = None

    def __repr__(self) -> str:
        return f"<Lock {self.name!r} token={self.token} {self._state}>"

    # times -----------------------------------------------------------------------

    @property
    def acquired_at(self) -> dt.datetime | None:
        """When this acquisition was made, on the database's clock.

        On MariaDB and MySQL the take does not return it: it is read from the lock's row
        the first time it is used (None if the row no longer has this token).
        """
        if self._acquired_at is UNREAD:
            self._read_times()
        return self._acquired_at

    @property
    def expires_at(self) -> dt.datetime | None:
        """When the lease ends unless renewed, on the database's clock (read as above)."""
        if self._expires_at is UNREAD:
            self._read_times()
        return self._expires_at

    @expires_at.setter
    def expires_at(self, value: dt.datetime | None) -> None:
        self._expires_at = value

    def _read_times(self) -> None:
        model = _lock_model()

        found = run_statement(
            self.using,
            lambda: (
                model.objects.using(self.using)
                .filter(name=self.name, token=self.token)
                .values_list("acquired_at", "expires_at")
                .first()
            ),
        )
        acquired_at, expires_at = found or (None, None)
        with self._mutex:  # a renewal that landed meanwhile keeps its newer expiry
            if self._acquired_at is UNREAD:
                self._acquired_at = acquired_at
            if self._expires_at is UNREAD:
                self._expires_at = expires_at

    # state -----------------------------------------------------------------------

    @property
    def reentrant(self) -> bool:
        """True when this is a nested acquisition inside one this thread already had."""
        return self._parent is not None

    @property
    def held(self) -> bool:
        """Whether this holder may still act, judged without a query.

        False once released or lost, and once the lease may have run out on the
        database's clock (measured from before the acquiring statement was sent).
        """
        if self._parent is not None:
            return self._state == _HELD and self._parent.held
        return self._state == _HELD and time.monotonic() < self._deadline

    @property
    def lost(self) -> bool:
        """True once the lock was found lost (see ``lost_reason``)."""
        if self._parent is not None:
            return self._parent.lost
        return self._state == _LOST

    @property
    def seconds_left(self) -> float:
        """Conservative seconds until the lease runs out (0 when not held)."""
        if self._parent is not None:
            return self._parent.seconds_left if self._state == _HELD else 0.0
        if self._state != _HELD:
            return 0.0
        return max(0.0, self._deadline - time.monotonic())

    def _mark_lost(self, reason: str, *, unless_renewed_by: float | None = None) -> bool:
        """Mark the lock lost (once) and send ``lock_lost``; True if this call did it.

        With ``unless_renewed_by``, only if the local deadline is still at or before that
        monotonic time: a renewal that got through in the meantime wins.
        """
        with self._mutex:
            if self._state != _HELD:
                return False
            if unless_renewed_by is not None and self._deadline > unless_renewed_by:
                return False
            self._state = _LOST
            self.lost_reason = reason
        logger.warning(
            "lock lost: %s token=%s owner=%s: %s", self.name, self.token, self.owner, reason
        )
        signals.lock_lost.send(sender=Lock, lock=self, reason=reason)
        return True

    # operations ------------------------------------------------------------------

    def ensure_held(self) -> None:
        """Raise :class:`LockLost` unless the database still shows this lease (one query)."""
        if self._parent is not None:
            if self._state != _HELD:
                raise LockLost(self.name, self.token, "released")
            self._parent.ensure_held()
            return
        if self._state == _LOST:
            raise LockLost(self.name, self.token, self.lost_reason or "lost")
        if self._state == _RELEASED:
            raise LockLost(self.name, self.token, "released")
        still = run_statement(self.using, lambda: self._mine().filter(_lease_open()).exists())
        if not still:
            self._mark_lost("the database no longer shows this lease")
            raise LockLost(self.name, self.token, self.lost_reason or "lost")

    def renew(self) -> None:
        """Extend the lease to database now + ttl, or raise :class:`LockLost`."""
        if self._parent is not None:
            if self._state != _HELD:
                raise LockLost(self.name, self.token, "released")
            self._parent.renew()
            return
        if self._state != _HELD:
            raise LockLost(self.name, self.token, self.lost_reason or self._state)
        started = time.monotonic()
        compiled = compile_update(
            self.using,
            ("renew", self.ttl),
            lambda: (
                _mine(self.using, NAME, TOKEN).filter(_lease_open()),
                {"expires_at": now_plus(self.ttl)},
            ),
            ["expires_at"],
        )

        def do_renew() -> dt.datetime | None:
            if compiled is None:  # pragma: no cover - only if the ORM's SQL changes shape
                queryset = self._mine().filter(_lease_open())
                if not queryset.update(expires_at=now_plus(self.ttl)):
                    return None
            else:
                count, rows = run_compiled(self.using, compiled, name=self.name, token=self.token)
                if rows:
                    return rows[0][0]  # type: ignore[no-any-return]
                if not count:
                    return None
            return self._mine().values_list("expires_at", flat=True).first()

        expires_at = run_statement(self.using, do_renew)
        if expires_at is None:
            self._mark_lost("the lease ran out or the lock was cleared or taken over")
            raise LockLost(self.name, self.token, self.lost_reason or "lost")
        with self._mutex:
            renewed_in_time = self._state == _HELD
            if renewed_in_time:
                self._expires_at = expires_at
                self._deadline = started + self.ttl.total_seconds()
        if not renewed_in_time:
            # The watchdog gave up while this renewal was on its way and the job was
            # told to stop. The lease it extended keeps other servers out until the job
            # has stopped and release() hands it back.
            raise LockLost(self.name, self.token, self.lost_reason or "lost")

    def release(self) -> bool:
        """Give the lock back; keep it closed until ``acquired_at + min_hold``.

        Returns False (and logs) when this holder no longer has the lock; it never frees
        another holder's lock.
        """
        self.stop_keepalive()
        if self._parent is not None:
            was_held = self._state == _HELD
            self._state = _RELEASED
            return was_held
        registry = _held_here()
        if registry.get((self.using, self.name)) is self:
            del registry[(self.using, self.name)]
        if self._state != _HELD:
            logger.warning(
                "release of %s token=%s: this holder no longer has it (%s)",
                self.name,
                self.token,
                self.lost_reason or self._state,
            )
            if self._state == _LOST:
                # The job has stopped now. If the database still shows this token's
                # lease (a renewal landed late, or nobody took over), free it; the
                # token in the WHERE clause never frees another holder's lock.
                self._give_back()
            return False

        compiled = compile_update(
            self.using,
            ("release", self.min_hold),
            lambda: (_mine(self.using, NAME, TOKEN), _release_values(self.min_hold)),
            [],
        )

        tries = 0

        def do_release() -> int:
            nonlocal tries
            tries += 1
            if compiled is None:  # pragma: no cover - only if the ORM's SQL changes shape
                return self._mine().update(**_release_values(self.min_hold))
            return run_compiled(self.using, compiled, name=self.name, token=self.token)[0]

        changed = run_statement(self.using, do_release)
        if not changed and tries > 1 and self._released_row_exists():
            changed = 1  # the first try committed before the connection dropped
        with self._mutex:
            if changed:
                self._state = _RELEASED
        if not changed:
            self._mark_lost("the lock was cleared or taken over before release")
            logger.warning("release of %s token=%s found it no longer held", self.name, self.token)
            return False
        logger.debug("released %s token=%s", self.name, self.token)
        return True

    def _released_row_exists(self) -> bool:
        from .models import JobLock

        return run_statement(
            self.using,
            lambda: (
                JobLock.objects.using(self.using)
                .filter(name=self.name, token=self.token, released_at__isnull=False)
                .exists()
            ),
        )

    def _give_back(self) -> None:
        """Free this token's row after the lock was marked lost; errors only logged."""
        try:
            changed = run_statement(
                self.using, lambda: self._mine().update(**_release_values(self.min_hold))
            )
        except JobLockError as exc:
            logger.warning("could not give back %s token=%s: %s", self.name, self.token, exc)
            return
        if changed:
            logger.info("gave back %s token=%s after it was marked lost", self.name, self.token)

    # keep-alive ------------------------------------------------------------------

    def start_keepalive(self) -> None:
        """Renew every ttl/3 from a background thread until released or lost."""
        if self._parent is not None or self._keepalive is not None:
            return
        from .keepalive import KeepAlive

        self._keepalive = KeepAlive(self)
        self._keepalive.start()

    def stop_keepalive(self) -> None:
        """Stop renewing the lease (release() does this itself)."""
        keepalive, self._keepalive = self._keepalive, None
        if keepalive is not None:
            keepalive.stop()

    def _lease_slipped(self) -> bool:
        """True once the conservative local deadline has passed."""
        return time.monotonic() >= self._deadline

    def _mine(self) -> JobLockQuerySet:
        return _mine(self.using, self.name, self.token)


def _mine(alias: str, name: str, token: int) -> JobLockQuerySet:
    """The row of this acquisition, if it still stands."""
    from .models import JobLock

    return JobLock.objects.using(alias).filter(name=name, token=token, released_at__isnull=True)


def _release_values(min_hold: dt.timedelta) -> dict[str, Any]:
    """Mark released; the lease stays until ``acquired_at + min_hold`` at the latest."""
    now = DatabaseNow()
    hold = Greatest(now, F("acquired_at") + min_hold) if min_hold else now
    return {"released_at": now, "expires_at": hold}


def _lease_open() -> Q:
    return Q(expires_at__gt=DatabaseNow())


def _lease_over() -> Q:
    return Q(expires_at__isnull=True) | Q(expires_at__lte=DatabaseNow())


# --- acquisition ----------------------------------------------------------------------


def _holder_values(ttl: dt.timedelta) -> dict[str, Any]:
    now = DatabaseNow()
    return {
        "host": identity.host,
        "pid": identity.pid,
        "instance": identity.instance,
        "thread": threading.get_native_id(),
        "acquired_at": now,
        "expires_at": now_plus(ttl),
        "released_at": None,
    }


@dataclass(frozen=True)
class Holder:
    """Who holds a lock we did not get (what :class:`LockHeld` reports)."""

    name: str
    owner: str
    expires_at: dt.datetime | None
    #: False when the take only learnt that the lock is held (who holds it is read
    #: only when somebody asks).
    known: bool = True

    @classmethod
    def of(cls, name: str, host: str, pid: int | None, instance: str, expires_at: Any) -> Holder:
        # The same form as JobLock.owner.
        return cls(name, f"{host}:{pid}:{instance[:8]}" if instance else "", expires_at)


# What a take reads back where its UPDATE cannot return rows.
_AFTER_TAKE = (
    "token",
    "acquired_at",
    "expires_at",
    "host",
    "pid",
    "instance",
    "thread",
    "released_at",
)


def _attempt(
    name: str, alias: str, ttl: dt.timedelta, min_hold: dt.timedelta, connection: Any
) -> Lock | Holder:
    """One decision: a Lock if we won, else who holds it (``connection``: the alias's)."""
    model = _lock_model()

    started = time.monotonic()

    def rows() -> JobLockQuerySet:  # built only off the compiled fast path
        return model.objects.using(alias)

    thread = threading.get_native_id()

    def ours(token: int, acquired_at: Any, expires_at: Any) -> Lock:
        """The Lock for an acquisition this call made."""
        return Lock(
            name=name,
            using=alias,
            ttl=ttl,
            min_hold=min_hold,
            token=token,
            acquired_at=acquired_at,
            expires_at=expires_at,
            started=started,
        )

    def take_values(thread_value: Any) -> dict[str, Any]:
        values = _holder_values(ttl)
        values["thread"] = thread_value
        values["token"] = F("token") + 1
        return values

    # SQLite: the row as it stands after the take, read by a second statement.
    def after_take() -> Any:
        return rows().filter(name=NAME).values_list(*_AFTER_TAKE)

    if connection.vendor == "mysql":
        compiled = compile_update(
            alias,
            ("take-mysql", ttl, identity.instance),
            lambda: (
                rows().filter(name=NAME).filter(_TokenToLastInsertId()).filter(_lease_over()),
                take_values(THREAD),
            ),
            [],
            insert_id=True,
            connection=connection,
        )
    else:
        compiled = compile_update(
            alias,
            ("take", ttl, identity.instance),
            lambda: (rows().filter(_lease_over(), name=NAME), take_values(THREAD)),
            ["token", "acquired_at", "expires_at"],
            or_holder=True,
            connection=connection,
        )

    tries = 0

    def own_lock() -> Lock | None:
        """After a retried statement: our acquisition, if the first try committed."""
        found = run_statement(
            alias,
            lambda: (
                rows()
                .filter(_lease_open(), name=name, instance=identity.instance, thread=thread)
                .filter(released_at__isnull=True)
                .values_list("token", "acquired_at", "expires_at")
                .first()
            ),
        )
        if found is None:
            return None
        logger.info("%s: the retried statement had taken the lock already", name)
        return ours(*found)

    def decide() -> Lock | Holder | None:
        """Ours, or the holder, after one conditional UPDATE; None when the name has no row."""
        nonlocal tries
        tries += 1
        if compiled is None:  # pragma: no cover - only if the ORM's SQL changes shape
            count = rows().filter(_lease_over(), name=name).update(**take_values(thread))
            row = after_take().first()
        else:
            count, returned = run_compiled(alias, compiled, connection, name=name, thread=thread)
            if compiled.insert_id:
                # MariaDB/MySQL: the new token if this UPDATE took the row, the
                # holder's if it is held, 0 if there is no row (see _TokenToLastInsertId).
                token = returned[0][0]
                if count:
                    return ours(token, UNREAD, UNREAD)
                if token:
                    return Holder(name, "", None, known=False)
                return None
            if compiled.or_holder:
                # PostgreSQL: our new row, or a row saying the lock is held, or nothing.
                if not returned:
                    return None
                won, token, acquired_at, expires_at = returned[0]
                if won:
                    return ours(token, acquired_at, expires_at)
                return Holder(name, "", None, known=False)
            if returned:  # SQLite 3.35+: our new row; none when held or missing
                return ours(*returned[0])
            # SQLite: read the row (held, missing, or before 3.35 whether we took it).
            read = compile_select(alias, ("after-take",), after_take, connection)
            if read is None:  # pragma: no cover - only if the ORM's SQL changes shape
                row = after_take().first()
            else:
                returned = run_compiled(alias, read, connection, name=name)[1]
                row = returned[0] if returned else None
        if row is None:
            return None
        token, acquired_at, expires_at, host, pid, instance, row_thread, released_at = row
        if count and (instance, row_thread, released_at) == (identity.instance, thread, None):
            return ours(token, acquired_at, expires_at)
        return Holder.of(name, host, pid, instance, expires_at)

    decision = run_statement(alias, decide)
    if isinstance(decision, Holder) and tries > 1 and (adopted := own_lock()) is not None:
        return adopted
    if decision is not None:
        return decision

    tries = 0

    def create() -> tuple[JobLock, bool]:
        nonlocal tries
        tries += 1
        defaults = _holder_values(ttl)
        defaults["token"] = _first_token(alias, name)
        try:
            with transaction.atomic(using=alias):
                return rows().get_or_create(name=name, defaults=defaults)
        except IntegrityError:
            # The row was inserted and deleted again between get and create: it was
            # someone else's decision, so report it as held by whoever has it now.
            return rows().get_or_create(name=name, defaults=defaults)

    row, created = run_statement(alias, create)
    if not created and tries > 1 and (adopted := own_lock()) is not None:
        return adopted
    if not created:
        return Holder(name, row.owner, row.expires_at)
    run_statement(alias, lambda: row.refresh_from_db(fields=["acquired_at", "expires_at"]))
    return ours(row.token, row.acquired_at, row.expires_at)


class _TokenToLastInsertId(Func):
    """MariaDB/MySQL: a WHERE term, always true, that hands a token back to the client.

    ``LAST_INSERT_ID(expr)`` sets the value the server returns with the row count: here
    the next token if the lease is over (the UPDATE takes the row), else the holder's
    token. It runs only if the row exists, so the reply alone tells the three cases
    apart: row count 1 (taken, with that token), 0 with a token (held), 0 with 0 (no
    row). It must come before the lease test, which would cut a held row short.
    """

    template = "(LAST_INSERT_ID(%(expressions)s) IS NOT NULL)"
    output_field = BooleanField()
    conditional = True

    def __init__(self) -> None:
        over = _lease_over()
        next_token = Case(
            When(over, then=F("token") + 1), default=F("token"), output_field=BigIntegerField()
        )
        super().__init__(next_token)


def _first_token(alias: str, name: str) -> int:
    """The token for a new row: above any this name had, even if its row was deleted.

    Run history remembers the tokens of past runs, so a lock row deleted by hand does
    not bring back a token a fenced write has already seen.
    """
    from django.db.models import Max

    from .models import JobRun

    highest = JobRun.objects.using(alias).filter(name=name).aggregate(top=Max("token"))["top"]
    return (highest or 0) + 1


def _acquire(
    name: object,
    *,
    ttl: DurationLike | None = None,
    min_hold: DurationLike | None = None,
    wait: DurationLike | None = None,
    using: str | None = None,
    describe: bool = True,
) -> Lock | Holder:
    checked_name = validate_name(name)
    current = app_settings.current()
    ttl_delta, hold = validate_timing(ttl, min_hold, current=current)
    wait_seconds = 0.0
    if wait is not None:
        wait_seconds = _duration(wait, None, "wait").total_seconds()
        if wait_seconds < 0:
            raise LockConfigurationError(f"wait must not be negative, got {wait_seconds:g}s.")
    alias = resolve_alias(using, current)
    connection = connections[alias]
    check_outside_transaction(alias, connection)

    outer = _held_here().get((alias, checked_name))
    if outer is not None and outer.held:
        try:
            outer.renew()
        except LockLost:
            outer = None
    if outer is not None and outer.held:
        return Lock(
            name=checked_name,
            using=alias,
            ttl=outer.ttl,
            min_hold=outer.min_hold,
            token=outer.token,
            acquired_at=outer._acquired_at,
            expires_at=outer._expires_at,
            started=time.monotonic(),
            parent=outer,
        )

    deadline = time.monotonic() + wait_seconds
    delay = 0.05
    while True:
        result = _attempt(checked_name, alias, ttl_delta, hold, connection)
        if isinstance(result, Lock):
            _held_here()[(alias, checked_name)] = result
            logger.debug("acquired %s token=%s owner=%s", result.name, result.token, result.owner)
            return result
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if describe and not result.known:
                return _describe_holder(alias, checked_name)
            return result
        time.sleep(min(remaining, delay * random.uniform(0.8, 1.2)))
        delay = min(delay * 1.6, 2.0)


def _describe_holder(alias: str, name: str) -> Holder:
    """Who holds ``name`` now (for a take that only learnt that somebody does)."""
    model = _lock_model()

    found = run_statement(
        alias,
        lambda: (
            model.objects.using(alias)
            .filter(name=name)
            .values_list("host", "pid", "instance", "expires_at")
            .first()
        ),
    )
    return Holder(name, "", None) if found is None else Holder.of(name, *found)


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
    result = _acquire(name, ttl=ttl, min_hold=min_hold, wait=wait, using=using, describe=False)
    return result if isinstance(result, Lock) else None


def acquire_or_raise(
    name: str,
    *,
    ttl: DurationLike | None = None,
    min_hold: DurationLike | None = None,
    wait: DurationLike | None = None,
    using: str | None = None,
) -> Lock:
    """Like :func:`try_acquire` but raise :class:`LockHeld` (with the holder) on a skip."""
    result = _acquire(name, ttl=ttl, min_hold=min_hold, wait=wait, using=using)
    if isinstance(result, Lock):
        return result
    raise LockHeld(result.name, owner=result.owner, expires_at=result.expires_at)


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
            logger.exception("could not release %s token=%s", lock.name, lock.token)


def release_lock(name: str, *, using: str | None = None) -> bool:
    """Free ``name`` now, whoever holds it (the admin's and CLI's "clear").

    The holder's next renew or ``ensure_held()`` raises ``LockLost``.
    """
    from .models import JobLock

    alias = resolve_alias(using)
    check_outside_transaction(alias)
    checked = validate_name(name)
    changed = run_statement(
        alias, lambda: JobLock.objects.using(alias).filter(name=checked).force_release()
    )
    return bool(changed)
