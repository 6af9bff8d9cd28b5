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
    import importlib
    import os
    import sys

    from export.adapter import Seq2SeqAdapter
    from export.tracing import OWN_PACKAGES, is_library, raised_at
    from runtime.errors import brief

    module_name, sep, function = value.partition(":")
    if not sep or not module_name or not function.isidentifier():
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
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # a module beside the command, as `python -m` would find it
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:  # not there, or a module it imports is not
        if exc.name is not None and exc.name != module_name and not module_name.startswith(exc.name + "."):
            hint = (f"{module_name!r} was found, but it imports {exc.name!r}{raised_at(exc)}, which cannot be found "
                    "here: install it, or put it beside your module (or on PYTHONPATH)")
        else:
            hint = "run seq2onnx where the module is, or put its directory on PYTHONPATH"
        raise click.BadParameter(f"cannot import {module_name!r} ({type(exc).__name__}: {exc}); {hint}",
                                 param_hint="'--adapter'") from None
    except (Exception, SystemExit) as exc:  # the user's code ran (or could not be read) and failed: the model's failure
        advice = (SCRIPT_ADVICE if isinstance(exc, SystemExit) else "" if isinstance(exc, SyntaxError) else
                  "; the module raised while it was imported") + "; fix it, then run again"
        raise click.ClickException(f"--adapter {value}: cannot import {module_name!r}: {failure(exc)}"
                                   f"{advice}") from None
    make = getattr(module, function, None)
    if not callable(make):
        kind = type(make).__name__
        has = "no function" if make is None else f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}, not a function, named"
        origin = getattr(module, "__file__", None) or ""
        shadowed = (f"; the {module_name!r} imported is {origin}, not yours: the standard library or an installed "
                    "package has a module of that name; rename yours") if is_library(origin) else ""
        raise click.BadParameter(f"{module_name!r} has {has} {function!r}{shadowed}", param_hint="'--adapter'")
    try:
        adapter = make()
    except (Exception, SystemExit) as exc:  # the user's function
        raise click.ClickException(f"--adapter {value}: {function}() failed: {failure(exc)}") from None
    if not isinstance(adapter, Seq2SeqAdapter):
        raise click.BadParameter(f"{value} returned {brief(adapter)}, expected an export.adapter.Seq2SeqAdapter",
                                 param_hint="'--adapter'")
    return adapter


SCRIPT_ADVICE = "; a script's own code runs when it is imported: put it under if __name__ == '__main__':"


def failure(exc: BaseException) -> str:
    """How the user's code failed, where: 'KeyError at my_model.py:12: ...', 'SyntaxError at my_model.py:3: invalid
    syntax', 'it called sys.exit(0) at my_model.py:5' (a SystemExit is a failure here: nothing was made)."""
    from export.tracing import raised_at

    if isinstance(exc, SystemExit):
        return f"it called sys.exit({'' if exc.code is None else repr(exc.code)}){raised_at(exc)}"
    if isinstance(exc, SyntaxError):
        return f"{type(exc).__name__}{raised_at(exc)}: {exc.msg}"
    return f"{type(exc).__name__}{raised_at(exc)}: {exc}"


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
