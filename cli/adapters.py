"""`--adapter MODULE:FUNCTION` (export, verify): a user's own model, loaded as one line of what is wrong.

A form that cannot name a module or function is a usage error (exit 2); the user's code raising, while its module is
imported or its function runs, is the model's failure (exit 1), said with the file and line where it raised."""
from __future__ import annotations

from typing import Any

import click

ADAPTER_HELP = ("Your own model instead of a checkpoint: FUNCTION() in MODULE (importable from the current "
                "directory or PYTHONPATH) returns an export.adapter.Seq2SeqAdapter declaring it (README: Bring your "
                "own model).")


def load_adapter(value: str) -> Any:
    """--adapter MODULE:FUNCTION -> the Seq2SeqAdapter that FUNCTION() returns; what is wrong, as one line."""
    import os
    import sys

    from export.adapter import Seq2SeqAdapter
    from export.tracing import OWN_PACKAGES, described, raised_at
    from runtime.errors import brief

    module_name, sep, function = value.partition(":")
    if not sep or "" in module_name.lstrip(".").split(".") or module_name != module_name.strip() \
            or not function.isidentifier():
        raise click.BadParameter(f"expected MODULE:FUNCTION (as in mymodel:make_adapter), got {value!r}",
                                 param_hint="'--adapter'")
    if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
        raise click.BadParameter(f"expected MODULE:FUNCTION with a module name, not a file path, got {value!r}; "
                                 f"{_as_module(module_name, function)}", param_hint="'--adapter'")
    if module_name.startswith("."):
        raise click.BadParameter(f"expected MODULE:FUNCTION with an absolute module name, got {value!r}: a relative "
                                 "one ('.' first) has no package to be relative to; pass "
                                 f"{module_name.lstrip('.')}:{function} where the module is", param_hint="'--adapter'")
    if module_name.split(".")[0] in OWN_PACKAGES:
        raise click.BadParameter(f"{module_name!r} is the name of one of seq2onnx's own packages "
                                 f"({', '.join(OWN_PACKAGES)}), which would be imported instead of yours; rename your "
                                 f"module (say, my_{module_name.split('.')[0]}.py)", param_hint="'--adapter'")
    if sys.path[:1] != [os.getcwd()]:  # first, as `python -m` puts it: a module of that name elsewhere on
        sys.path.insert(0, os.getcwd())  # PYTHONPATH (the current directory listed after it) would win otherwise
    shadowed = _shadowed(module_name.split(".")[0])
    if shadowed:
        raise click.BadParameter(shadowed, param_hint="'--adapter'")
    module = _imported(module_name, value)
    make = getattr(module, function, None)
    if not callable(make):
        kind = type(make).__name__
        has = "no function" if make is None else f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}, not a function, named"
        raise click.BadParameter(f"{module_name!r} has {has} {function!r}", param_hint="'--adapter'")
    try:
        adapter = make()
    except (Exception, SystemExit) as exc:  # the user's function
        raise click.ClickException(f"--adapter {value}: {function}() failed{raised_at(exc)}: {described(exc)}"
                                   f"{SCRIPT_ADVICE if isinstance(exc, SystemExit) else ''}") from None
    if not isinstance(adapter, Seq2SeqAdapter):
        raise click.BadParameter(f"{value} returned {brief(adapter)}, expected an export.adapter.Seq2SeqAdapter",
                                 param_hint="'--adapter'")
    return adapter


SCRIPT_ADVICE = "; a script's own code runs when it is imported: put it in an if __name__ == '__main__' block"


def _imported(module_name: str, value: str) -> Any:
    """The user's module; what is wrong, as one line: not found (usage, exit 2), or its code failed while imported,
    a failing import of its own included (the model's failure, exit 1, with where)."""
    import importlib

    from export.tracing import described, raised_at

    try:
        return importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # not found, or the user's code ran (or could not be read) and failed
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
        if missing == module_name or (missing and module_name.startswith(missing + ".")):
            raise click.BadParameter(f"cannot import {module_name!r} ({type(exc).__name__}: {exc}); run seq2onnx "
                                     "where the module is, or put its directory on PYTHONPATH",
                                     param_hint="'--adapter'") from None
        if isinstance(exc, ImportError):  # a module it imports (or a name from one) that is not there
            advice = ("; install it, or put it beside your module (or on PYTHONPATH)" if missing else
                      "; check the name and the module it is imported from")
        else:
            advice = SCRIPT_ADVICE if isinstance(exc, SystemExit) else (
                "" if isinstance(exc, SyntaxError) else "; the module raised while it was imported")
        raise click.ClickException(f"--adapter {value}: cannot import {module_name!r}{raised_at(exc)}: "
                                   f"{described(exc)}{advice}; fix it, then run again") from None


def _shadowed(top: str) -> str:
    """Why the user's `top`.py (or folder) here is not what `import top` gives, or '': Python's own module of that
    name (built in, or the standard library's) or an installed package's is imported already, or found first, and
    the user's would never be read (its function 'missing', or another module's function called)."""
    import importlib.util
    import sys
    from pathlib import Path

    from export.tracing import is_installed, is_library

    here = Path.cwd()
    local = next((path for path in (here / f"{top}.py", here / top) if path.exists()), None)
    if local is None:
        return ""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return ""
    origin = None if spec is None else spec.origin or next(iter(spec.submodule_search_locations or []), None)
    if origin is None or (origin not in ("built-in", "frozen") and not is_library(origin)):
        return ""  # yours (or nothing) is what Python imports
    if origin in ("built-in", "frozen"):
        whose = "Python's built-in module"
    else:
        whose = f"{'the installed package' if is_installed(origin) else 'the standard library'}'s module {origin}"
    how = "seq2onnx has imported already" if top in sys.modules else "Python finds first"
    mine = f"{local.name}/" if local.is_dir() else local.name
    return f"{top!r} is {whose}, which {how}: your {mine} here would never be read; rename yours (say, my_{top})"


def _as_module(path: str, function: str) -> str:
    """What to pass instead of a file path: the dotted name from here ('pkg/mod.py' -> pkg.mod) where the path is
    relative and inside this directory, and the module's own name from its directory."""
    from pathlib import PurePath

    parts = PurePath(path).with_suffix("").parts if path.endswith(".py") else PurePath(path).parts
    stem = parts[-1] if parts else path
    here = [p for p in parts if p != "."]
    dotted = ".".join(here)
    own = f"run seq2onnx in the file's directory (or put it on PYTHONPATH) and pass {stem}:{function}"
    if not PurePath(path).is_absolute() and len(here) > 1 and all(p.isidentifier() for p in here):
        return f"pass {dotted}:{function} from this directory (its folders as packages), or {own}"
    return own
