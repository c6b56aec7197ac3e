"""The lock engine: a named lock on one database row, with leases on the database's clock.

Reading order: ``clock`` (database time), ``sql`` (every statement and what it decides),
``retry`` (how a statement is run), ``lock`` (a held lock: renew, check, release),
``acquire`` (taking one), ``keepalive`` (renewing it in the background). ``errors``,
``durations`` and ``validation`` are the small pieces they share.
"""
