"""The package's sizes, as the "one core" work measures them: lines (without migrations),
the modules over 450 lines and the functions over 60 (exit 1 if there are any:
tests/test_layers.py keeps them out).

    python scripts/sizes.py            # from the checkout's root
"""

from __future__ import annotations

import ast
import pathlib
import sys

MODULE_LIMIT = 450
FUNCTION_LIMIT = 60


def main(root: pathlib.Path) -> int:
    package = root / "django_exclusive_jobs"
    total = 0
    modules: list[tuple[int, str]] = []
    functions: list[tuple[int, str]] = []
    for path in sorted(package.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        text = path.read_text()
        name = str(path.relative_to(package))
        lines = len(text.splitlines())
        total += lines
        if lines > MODULE_LIMIT:
            modules.append((lines, name))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > FUNCTION_LIMIT:
                    functions.append((length, f"{name}:{node.name}"))
    print(f"{total} lines in the package (migrations left out)")
    print(f"{len(modules)} modules over {MODULE_LIMIT} lines:")
    for lines, name in sorted(modules, reverse=True):
        print(f"  {lines:5}  {name}")
    print(f"{len(functions)} functions over {FUNCTION_LIMIT} lines:")
    for length, name in sorted(functions, reverse=True):
        print(f"  {length:5}  {name}")
    return 1 if modules or functions else 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")))
