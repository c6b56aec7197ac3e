"""Follow a job's name through the package, as a newcomer reading a run would.

    .venv/bin/python scripts/name_walk.py [NAME]   (default: quick, a job of the tests)

Runs ``manage.py run_exclusive NAME`` in this process (the test settings, on their SQLite
file, migrated first) and records every call into the package that receives the job's
name: the string itself, or an object whose ``name``, ``job`` or ``lock_name`` holds it.
Prints the modules the name enters, in order; the package's modules on the stack, call
by call, when it reaches its first SQL (the lock's take) and the run's history row; and
each climb: a call from a module into one on a higher layer of the import-linter
contract in pyproject.toml (a callback, since imports only point down). Issue 42 asks
for at most 6 modules and no climb on the way to the SQL.
"""

from __future__ import annotations

import itertools
import os
import sys
import tomllib
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = str(ROOT / "django_exclusive_jobs") + os.sep
FIRST_SQL = {"lock.sql": "the lock's take", "models.statements": "the run's history row"}


def layers() -> dict[str, int]:
    """Each module of the layers contract and its height (the top is highest)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contract = pyproject["tool"]["importlinter"]["contracts"][0]["layers"]
    return {
        name.strip(): len(contract) - height
        for height, entry in enumerate(contract)
        for name in entry.split("|")
    }


def module_of(filename: str) -> str:
    relative = filename[len(str(ROOT)) + 1 : -len(".py")].replace(os.sep, ".")
    return relative.removesuffix(".__init__").removeprefix("django_exclusive_jobs.")


def height(module: str, heights: dict[str, int]) -> int:
    name = f"django_exclusive_jobs.{module}"
    while name:
        if name in heights:
            return heights[name]
        name = name.rpartition(".")[0]
    return 0


def carries(value: Any, name: str, depth: int = 0) -> bool:
    if isinstance(value, str):
        return value == name
    if depth > 1 or not hasattr(value, "__dict__"):
        return False
    held = vars(value)
    return any(
        carries(held[key], name, depth + 1) for key in ("name", "job", "lock_name") if key in held
    )


def chain(frame: FrameType | None) -> list[str]:
    """The package's modules on the stack down to ``frame``, outermost first (a module's
    frames in a row count once)."""
    modules: list[str] = []
    while frame is not None:
        if frame.f_code.co_filename.startswith(PACKAGE):
            module = module_of(frame.f_code.co_filename)
            if not modules or modules[-1] != module:
                modules.append(module)
        frame = frame.f_back
    return modules[::-1]


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "quick"
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    calls: list[tuple[str, str, str]] = []  # (caller's module, callee's module, function)
    chains: dict[str, list[str]] = {}  # a statement's module -> the modules on the stack

    def profile(frame: FrameType, event: str, arg: object) -> None:
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(PACKAGE):
            return
        given = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        if not any(carries(frame.f_locals.get(arg_name), name) for arg_name in given):
            return
        callers = chain(frame.f_back)
        by = callers[-1] if callers else "-"
        module = module_of(code.co_filename)
        calls.append((by, module, code.co_qualname))
        if module in FIRST_SQL and module not in chains:
            chains[module] = chain(frame)

    heights = layers()
    sys.setprofile(profile)
    try:
        call_command("run_exclusive", name)
    except SystemExit:
        pass
    finally:
        sys.setprofile(None)
    entered = list(dict.fromkeys(module for _, module, _ in calls))
    print(f"the name enters {len(entered)} modules: {' '.join(entered)}")
    for statement, what in FIRST_SQL.items():
        route = chains.get(statement, [])
        up = sum(height(b, heights) > height(a, heights) for a, b in itertools.pairwise(route))
        print(
            f"to {what}, call by call: {len(set(route))} modules, {up} climbs: " + " > ".join(route)
        )
    climbs = [
        (by, module, function)
        for by, module, function in calls
        if by != "-" and height(module, heights) > height(by, heights)
    ]
    print(f"climbs (a call into a higher layer): {len(climbs)}")
    for by, module, function in climbs:
        print(f"  {by} -> {module}.{function}")


if __name__ == "__main__":
    main()
