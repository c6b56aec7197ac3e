"""State the lock keeps per database session, for the driver-level fast paths."""

from __future__ import annotations

import re
import weakref
from typing import Any, ClassVar, TypeVar

# A parameter in the SQL Django compiles (``%%`` is a literal percent sign).
PLACEHOLDER = re.compile(r"%%|%s")

State = TypeVar("State", bound="SessionState")


class SessionState:
    """Kept on Django's connection wrapper; a new one whenever Django opened a new connection."""

    #: The wrapper's attribute that holds it (one per kind of state).
    attribute: ClassVar[str]

    def __init__(self, raw: Any) -> None:
        self.raw = weakref.ref(raw)

    @classmethod
    def of(cls: type[State], connection: Any) -> State:
        state: State | None = getattr(connection, cls.attribute, None)
        if state is None or state.raw() is not connection.connection:
            state = cls(connection.connection)
            setattr(connection, cls.attribute, state)
        return state
