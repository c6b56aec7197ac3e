"""A job's arguments: the keyword arguments its runs call the function with.

Declared with ``@exclusive_job(kwargs=...)`` or per schedule (``schedules=``), stored on
each run's history row, so they must be JSON; checked against the function's signature
when the decorator runs, so a typo is a start-up error (system check E014), not a
failure at 3 a.m.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from .. import values
from ..lock.errors import LockConfigurationError
from ..naming import describe_arguments

# What each run gives a function that takes it: the slot it serves, its lock's fencing
# token (for writes that must refuse a holder that was taken over), and the run itself.
GIVEN = ("slot", "token", "run")


def check_kwargs(
    func: Callable[..., Any], kwargs: object, *, what: str = "kwargs"
) -> dict[str, Any]:
    """``kwargs`` if they are JSON and fit ``func`` (with ``slot`` and ``token`` when it
    takes them: each run gives them)."""
    if isinstance(kwargs, str):  # JSON text is a command's or a form's: parse_kwargs
        raise LockConfigurationError(f"{what} must be a dict of argument names to values.")
    kwargs = values.json_arguments(kwargs, what=what)
    signature = inspect.signature(func)
    given = [name for name in GIVEN if name in signature.parameters]
    for name in given:
        if name in kwargs:
            raise LockConfigurationError(
                f"{what} must not give '{name}': each run is given its {name}."
            )
    shown = values.printable(repr(kwargs), limit=200)
    fits = f"{what} {shown} do not fit {func.__qualname__}{_bare(signature)}"
    unknown = [key for key in kwargs if not _takes(signature, key)]
    if unknown:  # said first: a misspelt name also makes a required one missing
        raise LockConfigurationError(f"{fits}: unknown argument {', '.join(map(repr, unknown))}.")
    try:
        signature.bind(**kwargs, **dict.fromkeys(given))
    except TypeError as exc:
        raise LockConfigurationError(f"{fits}: {exc}.") from None
    return kwargs


def parse_kwargs(text: str) -> object:
    """The arguments a run is asked for with, as typed (a JSON object; blank: none),
    checked by :func:`values.json_arguments` (its size, depth, NUL). What they must be
    for the job is :meth:`Job.check_arguments`'s to say."""
    return values.json_arguments(text)


def _takes(signature: inspect.Signature, key: str) -> bool:
    """Whether the function takes a keyword argument ``key``."""
    parameter = signature.parameters.get(key)
    if parameter is not None and parameter.kind not in (
        parameter.POSITIONAL_ONLY,
        parameter.VAR_POSITIONAL,
    ):
        return True
    return any(each.kind == each.VAR_KEYWORD for each in signature.parameters.values())


def _bare(signature: inspect.Signature) -> inspect.Signature:
    """The signature without annotations: ``(period, slot=None)``."""
    empty = inspect.Parameter.empty
    parameters = [
        parameter.replace(annotation=empty) for parameter in signature.parameters.values()
    ]
    return signature.replace(parameters=parameters, return_annotation=empty)


# The arguments in one short line, as JSON ("" for none): defined below the tables
# (``naming.py``), which show a run request's arguments too.
describe = describe_arguments
