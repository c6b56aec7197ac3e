"""The layers contract (pyproject.toml, checked by import-linter in CI) places every module.

import-linter checks only the modules its layers name: a new module left out of them
would be free to import anything. This test fails until it is given its layer.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "django_exclusive_jobs"


def _layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    [contract] = [c for c in config["contracts"] if c["type"] == "layers"]
    names = []
    for layer in contract["layers"]:
        names += [name.strip() for name in layer.replace(":", "|").split("|")]
    return names


def _modules() -> set[str]:
    found = set()
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if "migrations" in parts or parts[-1] == "__init__":
            continue
        found.add(".".join(parts))
    return found


def test_every_module_has_a_layer() -> None:
    layers = _layers()
    placed = {
        module
        for module in _modules()
        if any(module == name or module.startswith(name + ".") for name in layers)
    }
    assert sorted(_modules() - placed) == []


def test_every_layer_names_a_module_or_package() -> None:
    modules = _modules()
    for name in _layers():
        assert any(m == name or m.startswith(name + ".") for m in modules), name


def test_no_module_over_450_lines_and_no_function_over_60() -> None:
    """The sizes "one core" set (scripts/sizes.py says which, and exits 1 on any)."""
    import subprocess
    import sys

    sizes = [sys.executable, str(ROOT / "scripts" / "sizes.py"), str(ROOT)]
    done = subprocess.run(sizes, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout
