"""Code that runs inside worker processes started by the tests (spawned, not forked)."""

from __future__ import annotations

import os
import traceback
from multiprocessing.connection import Connection
from typing import Any


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()


def serve_commands(conn: Connection) -> None:
    """Answer commands from the test process, one at a time, until told to stop."""
    setup_django()
    from django.db import connections

    from django_exclusive_jobs import try_acquire
    from django_exclusive_jobs.locks import Lock, identity

    held: dict[str, Lock] = {}
    while True:
        command = conn.recv()
        verb, args = command[0], command[1:]
        try:
            result: Any = None
            if verb == "stop":
                conn.send((True, None))
                return
            if verb == "owner":
                result = identity.owner()
            elif verb == "acquire":
                alias, name, kwargs = args
                lock = try_acquire(name, using=alias, **kwargs)
                if lock is not None:
                    held[name] = lock
                result = None if lock is None else lock.token
            elif verb == "release":
                (name,) = args
                names = [name] if name else list(held)
                result = all(held.pop(n).release() for n in names if n in held)
            elif verb == "forget":
                for lock in held.values():
                    lock.stop_keepalive()
                held.clear()
                connections.close_all()
            else:
                raise ValueError(f"unknown command {verb!r}")
            conn.send((True, result))
        except Exception:
            conn.send((False, traceback.format_exc()))
