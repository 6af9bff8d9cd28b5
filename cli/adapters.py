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
    from export.tracing import OWN_PACKAGES, raised_at
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
        if not isinstance(exc, ModuleNotFoundError):  # the user's code ran and raised: the model's failure
            raise click.ClickException(f"--adapter {value}: cannot import {module_name!r}: {type(exc).__name__}"
                                       f"{raised_at(exc)}: {exc}; the module raised while it was imported; fix "
                                       "it, then run again") from None
        if exc.name is not None and exc.name != module_name and not module_name.startswith(exc.name + "."):
            hint = f"{module_name!r} was found, but it imports {exc.name!r}, which is not installed here; install it"
        else:
            hint = "run seq2onnx where the module is, or put its directory on PYTHONPATH"
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


