"""Python 3.10, which pyproject allows, in what CI (3.11) cannot run: asyncio's timeouts raise
asyncio.TimeoutError there, a class of its own (3.11 made it TimeoutError). `except TimeoutError` around
asyncio.wait_for missed it on 3.10: the batcher's task died at its first batch_wait_ms timeout and every request
after hung (the embedded-server tests timed out on 3.10). ruff's target-version (py310) refuses newer syntax; this
covers the names."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def handlers_of_bare_timeout(path: Path) -> list[int]:
    """Lines of `except TimeoutError` (alone or in a tuple) in a module that awaits asyncio's timeouts."""
    tree = ast.parse(path.read_text(), str(path))
    uses_asyncio = any(isinstance(node, ast.Attribute) and node.attr in ("wait_for", "timeout")
                       and isinstance(node.value, ast.Name) and node.value.id == "asyncio" for node in ast.walk(tree))
    if not uses_asyncio:
        return []
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and node.type is not None:
            names = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
            if any(isinstance(n, ast.Name) and n.id == "TimeoutError" for n in names):
                lines.append(node.lineno)
    return lines


def test_asyncio_timeouts_are_caught_as_asyncio_timeout_error() -> None:
    found = {str(p.relative_to(ROOT)): lines for folder in ("serving", "runtime", "cli")
             for p in sorted((ROOT / folder).rglob("*.py")) if (lines := handlers_of_bare_timeout(p))}
    assert found == {}, f"catch asyncio.TimeoutError there (TimeoutError only from 3.11): {found}"
