"""Work spread when schedulers' views disagree: a simulation of ``spread.places``.

    python benchmarks/spread_views.py
    python benchmarks/spread_views.py --before /tmp/spread_2875a08.py

Each scheduler plans every burst from its own view of the live schedulers (their free
capacity, read at its own beat). This calls ``places`` for every scheduler of a burst,
each with a view perturbed at random, and counts the slots that no scheduler plans to
start first (they wait for a handoff: the second choice after 1 s, or the last resort
and the safety net) and those that two or more do (they race; the lock decides). No
database and no processes: the figures depend only on the code and the seeds.

``--before`` names another version's ``run/spread.py`` (``git show
REV:django_exclusive_jobs/run/spread.py > FILE``), counted beside the current one.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import random
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

T0 = dt.datetime(2026, 11, 27, 9, 0, tzinfo=dt.UTC)


def current() -> ModuleType:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import django
    from django.conf import settings

    settings.configure(USE_TZ=True, INSTALLED_APPS=["django_exclusive_jobs"])
    django.setup()
    from django_exclusive_jobs.run import spread

    return spread


def load(path: str) -> ModuleType:
    """Another version's spread.py, on its own (its one relative import stubbed)."""
    source = (
        Path(path)
        .read_text()
        .replace("from ..lock.retry import run_statement", "run_statement: Any = None")
    )
    spec = importlib.util.spec_from_loader("spread_before", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["spread_before"] = module
    exec(compile(source, path, "exec"), module.__dict__)
    return module


def count(
    spread: ModuleType, names: list[str], jobs: list[str], bursts: int, view: Callable[..., Any]
) -> tuple[int, int]:
    """Slots with no first choice, and with two or more, over ``bursts`` bursts."""
    none = several = 0
    for n in range(bursts):
        due = T0 + dt.timedelta(seconds=30 * n)
        burst = dict.fromkeys(jobs, due)
        firsts: Counter[str] = Counter()
        for me in names:
            for job, (place, _) in spread.places(me, due, burst, view(spread, me)).items():
                firsts[job] += place == 0
        none += sum(firsts[job] == 0 for job in jobs)
        several += sum(firsts[job] > 1 for job in jobs)
    return none, several


def busier(schedulers: int, jobs: int, free: int, share: float, seed: int = 3) -> Any:
    """Each view sees each other scheduler one run busier with probability ``share``."""
    names = [f"web-{i}:{100 + i}" for i in range(schedulers)]
    served = frozenset(f"bench_{j:03d}" for j in range(jobs))
    rng = random.Random(seed)

    def view(spread: ModuleType, me: str) -> list[Any]:
        return [
            spread.Peer(n, served, free - 1 if n != me and rng.random() < share else free)
            for n in names
        ]

    return names, sorted(served), view


def newcomer(schedulers: int, jobs: int, seed: int = 2) -> Any:
    """A scheduler that just started: it sees itself, half the others see it yet."""
    new = "web-new:999"
    names = [f"web-{i}:{100 + i}" for i in range(schedulers)]
    served = frozenset(f"bench_{j:03d}" for j in range(jobs))
    rng = random.Random(seed)

    def view(spread: ModuleType, me: str) -> list[Any]:
        sees = me == new or rng.random() < 0.5
        return [spread.Peer(n, served, 10) for n in names + ([new] if sees else [])]

    return [*names, new], sorted(served), view


CASES = [
    ("100 x 100, free 10, 5% of pairs see one run more", lambda: busier(100, 100, 10, 0.05), 10),
    ("20 x 1,000, free 100, the same", lambda: busier(20, 1000, 100, 0.05), 5),
    ("20 x 1,000, free 10, the same", lambda: busier(20, 1000, 10, 0.05), 5),
    ("100 x 100, a new scheduler seen by half the views", lambda: newcomer(100, 100), 10),
    ("20 x 1,000, the same", lambda: newcomer(20, 1000), 3),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="another version's run/spread.py, counted beside")
    args = parser.parse_args()
    versions = {"now": current()}
    if args.before:
        versions["before"] = load(args.before)
    print("| views | " + " | ".join(f"{v}: none / two" for v in versions) + " |")
    print("|---|" + "---|" * len(versions))
    for title, case, bursts in CASES:
        cells = []
        for spread in versions.values():
            names, jobs, view = case()  # the same draws for every version
            none, several = count(spread, names, jobs, bursts, view)
            cells.append(f"{none} / {several} of {len(jobs) * bursts:,}")
        print(f"| {title} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
