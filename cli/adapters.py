"""`--adapter MODULE:FUNCTION` (export, verify): a user's own model, loaded as one line of what is wrong.

A form that cannot name a module or function is a usage error (exit 2); the user's code raising, while its module is
imported or its function runs, is the model's failure (exit 1), said with the file and line where it raised."""
from __future__ import annotations

import sysconfig
import traceback
from pathlib import Path
from typing import Any

import click

OWN_PACKAGES = ("cli", "export", "runtime", "serving", "training")  # a user's module of one of these names is shadowed
ADAPTER_HELP = ("Your own model instead of a checkpoint: FUNCTION() in MODULE (importable from the current "
                "directory or PYTHONPATH) returns an export.adapter.Seq2SeqAdapter declaring it (README: Bring your "
                "own model).")
_ROOT = Path(__file__).resolve().parents[1]


def raised_at(exc: BaseException) -> str:
    """' at my_model.py:12': the innermost line of the user's own code in the traceback of `exc` (a SyntaxError: its
    own file and line), past the standard library's, installed packages' and seq2onnx's frames; '' if none."""
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        return f" at {_shown(exc.filename)}:{exc.lineno}"
    theirs = [f for f in traceback.extract_tb(exc.__traceback__) if not _library(f.filename)]
    return f" at {_shown(theirs[-1].filename)}:{theirs[-1].lineno}" if theirs else ""


def _library(filename: str) -> bool:
    """Whether `filename` is code the user did not write: frozen importlib, the standard library, installed packages
    (torch's frames inside a model's forward) or seq2onnx's own packages."""
    if filename.startswith("<"):
        return True
    path = Path(filename).resolve()
    paths = sysconfig.get_paths()
    roots = [Path(paths[key]).resolve() for key in ("stdlib", "platstdlib", "purelib", "platlib")]
    roots += [_ROOT / name for name in OWN_PACKAGES]
    return any(path.is_relative_to(root) for root in roots)


def _shown(filename: str) -> str:
    """A path as the user would type it: relative to the current directory when under it."""
    path = Path(filename).resolve()
    return str(path.relative_to(Path.cwd().resolve())) if path.is_relative_to(Path.cwd().resolve()) else str(path)


def load_adapter(value: str) -> Any:
    """--adapter MODULE:FUNCTION -> the Seq2SeqAdapter that FUNCTION() returns; what is wrong, as one line."""
    import importlib
    import os
    import sys

    from export.adapter import Seq2SeqAdapter
    from runtime.errors import brief

    module_name, sep, function = value.partition(":")
    if not sep or not module_name or not function.isidentifier():
        raise click.BadParameter(f"expected MODULE:FUNCTION (as in mymodel:make_adapter), got {value!r}",
                                 param_hint="'--adapter'")
    if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
        stem = os.path.splitext(os.path.basename(module_name))[0]
        raise click.BadParameter(f"expected MODULE:FUNCTION with a module name, not a file path, got {value!r}; run "
                                 f"seq2onnx in the file's directory (or put it on PYTHONPATH) and pass "
                                 f"{stem}:{function}", param_hint="'--adapter'")
    if module_name.split(".")[0] in OWN_PACKAGES:
        raise click.BadParameter(f"{module_name!r} is the name of one of seq2onnx's own packages "
                                 f"({', '.join(OWN_PACKAGES)}), which would be imported instead of yours; rename your "
                                 f"module (say, my_{module_name.split('.')[0]}.py)", param_hint="'--adapter'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # a module beside the command, as `python -m` would find it
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module: ModuleNotFoundError, or anything it raises while imported
        missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
        if missing is not None and missing != module_name and not module_name.startswith(missing + "."):
            hint = f"{module_name!r} was found, but it imports {missing!r}, which is not installed here; install it"
        elif isinstance(exc, ModuleNotFoundError):
            hint = "run seq2onnx where the module is, or put its directory on PYTHONPATH"
        else:  # the user's code ran and raised: the model's failure, as a failing function's is
            raise click.ClickException(f"--adapter {value}: cannot import {module_name!r}: {type(exc).__name__}"
                                       f"{raised_at(exc)}: {exc}; the module raised while it was imported; fix "
                                       "it, then run again") from None
        raise click.BadParameter(f"cannot import {module_name!r} ({type(exc).__name__}: {exc}); {hint}",
                                 param_hint="'--adapter'") from None
    make = getattr(module, function, None)
    if not callable(make):
        has = "no function" if make is None else f"a {type(make).__name__}, not a function, named"
        raise click.BadParameter(f"{module_name!r} has {has} {function!r}", param_hint="'--adapter'")
    try:
        adapter = make()
    except Exception as exc:  # the user's function
        raise click.ClickException(f"--adapter {value}: {function}() failed: {type(exc).__name__}{raised_at(exc)}: "
                                   f"{exc}") from None
    if not isinstance(adapter, Seq2SeqAdapter):
        raise click.BadParameter(f"{value} returned {brief(adapter)}, expected an export.adapter.Seq2SeqAdapter",
                                 param_hint="'--adapter'")
    return adapter


