"""Where a declared model's code breaks, said by module: forward hooks name the innermost running module of the
adapter's own, and a TorchScript trace names the one running an operator the exporter cannot convert."""
from __future__ import annotations

import contextlib
import re
import sysconfig
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from runtime.errors import one_line

from .adapter import AdapterError, Seq2SeqAdapter

_ROOT = Path(__file__).resolve().parents[1]
OWN_PACKAGES = ("cli", "export", "runtime", "serving", "training")  # seq2onnx's: a user's module so named is shadowed
_TORCH = Path(torch.__file__).resolve().parent


def raised_at(exc: BaseException) -> str:
    """' at my_model.py:12': the innermost line of the user's own code in the traceback of `exc` (a SyntaxError: its
    own file and line), past the standard library's, installed packages' and seq2onnx's frames; where every other
    frame is one of those, the innermost outside the standard library, torch and seq2onnx (a user's model installed
    as a package); '' if none."""
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno and not exc.filename.startswith("<"):
        return f" at {_shown(exc.filename)}:{exc.lineno}"
    frames = traceback.extract_tb(exc.__traceback__)
    theirs = ([f for f in frames if not is_library(f.filename)]
              or [f for f in frames if not is_library(f.filename, installed=False)])
    return f" at {_shown(theirs[-1].filename)}:{theirs[-1].lineno}" if theirs else ""


def described(exc: BaseException) -> str:
    """'KeyError: 'cell'', 'SyntaxError: invalid syntax' (its place said by raised_at), 'SystemExit: it exited with
    0': what failed in the user's code, after its place."""
    if isinstance(exc, SystemExit):
        return f"SystemExit: it exited{'' if exc.code is None else f' with {exc.code!r}'}"
    return f"{type(exc).__name__}: {one_line(exc.msg if isinstance(exc, SyntaxError) else exc)}"


def is_library(filename: str, installed: bool = True) -> bool:
    """Whether `filename` is code the user did not write: frozen importlib, seq2onnx's own packages, torch, the
    standard library and (`installed`) every installed package. (In a virtual environment the standard library's
    platform folder holds site-packages: installed packages are told apart first.)"""
    if not filename or filename.startswith("<"):
        return True
    path = Path(filename).resolve()
    if any(path.is_relative_to(root) for root in [_ROOT / name for name in OWN_PACKAGES] + [_TORCH]):
        return True
    if is_installed(filename):
        return installed
    return _under(path, "stdlib", "platstdlib")


def is_installed(filename: str) -> bool:
    """Whether `filename` lies among the installed packages (site-packages: purelib or platlib)."""
    return _under(Path(filename).resolve(), "purelib", "platlib")


def _under(path: Path, *keys: str) -> bool:
    paths = sysconfig.get_paths()
    return any(path.is_relative_to(Path(paths[key]).resolve()) for key in keys)


def _shown(filename: str) -> str:
    """A path as the user would type it: relative to the current directory when under it."""
    path = Path(filename).resolve()
    return str(path.relative_to(Path.cwd().resolve())) if path.is_relative_to(Path.cwd().resolve()) else str(path)


class Tracing:
    """Which of the adapter's modules is running (forward hooks on every submodule), so an error raised while
    probing or tracing names the innermost one."""

    def __init__(self, adapter: Seq2SeqAdapter) -> None:
        self.modules = [(f"modules[{i}]{'.' + name if name else ''} ({type(m).__name__})", m)
                        for i, root in enumerate(adapter.modules) for name, m in root.named_modules()]
        self.stack: list[tuple[str, torch.nn.Module]] = []
        self.vocab_sizes = {len(adapter.source_vocab), len(adapter.target_vocab)}

    @contextlib.contextmanager
    def watch(self) -> Iterator[None]:
        handles = []
        for label, module in self.modules:
            handles.append(module.register_forward_pre_hook(lambda m, a, label=label: self.stack.append((label, m))))
            handles.append(module.register_forward_hook(lambda m, a, o: self.stack.pop() and None))
        self.stack.clear()
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def where(self) -> str:
        return f" in {self.stack[-1][0]}" if self.stack else ""

    def hint(self, exc: Exception, args: tuple) -> str:
        """What a failure of the user's code most likely means, where that can be told: an id beyond an embedding's
        rows (a vocabulary longer than the embedding), a state name the step looked for and was not given."""
        running = self.stack[-1][1] if self.stack else None
        if isinstance(exc, IndexError) and isinstance(running, torch.nn.Embedding):
            if running.num_embeddings > max(self.vocab_sizes):  # more rows than a vocabulary: a positional table
                return f"; an index beyond its {running.num_embeddings} rows"
            return (f"; an id beyond its {running.num_embeddings} rows: is the vocabulary longer than the "
                    "embedding?")
        if isinstance(exc, KeyError) and args and isinstance(args[-1], dict):
            return f"; if that is a state's name: the state it was given holds {sorted(args[-1])}"
        return ""


def untraceable(adapter: Seq2SeqAdapter, module: torch.nn.Module, args: tuple, exc: Exception,
                where: str) -> str:
    """Where tracing `module` broke: the module running when the tracer raised, or, for an operator the exporter
    cannot convert (found after tracing), the module that runs it and the user's line that calls it: the scope and
    the call stack a TorchScript trace records for it (the wrapper holds the adapter's modules as `parts`:
    parts.1.gru is modules[1].gru)."""
    op = re.search(r"operator '([\w:.]+)'", str(exc))
    if where or op is None:
        return where
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's warnings about Python values: not what is wrong
            graph = torch.jit.trace(module, args, check_trace=False, strict=False).inlined_graph
    except Exception:  # only looking: the export's own error is what is reported
        return ""
    nodes = [node for node in graph.nodes() if node.kind() == op.group(1)]
    if not nodes:
        return ""
    at = _source_line(nodes[0].sourceRange())
    path = re.search(r"parts\.(\d+)((?:\.[\w]+)*)$", nodes[0].scopeName().split("/")[-1].replace("__module.", ""))
    if path is None:
        return at
    root = adapter.modules[int(path.group(1))]
    inner = path.group(2).lstrip(".")
    found = root.get_submodule(inner) if inner else root
    return f" in modules[{path.group(1)}]{'.' + inner if inner else ''} ({type(found).__name__}){at}"


def _source_line(source_range: str) -> str:
    """' at my_model.py:12': the innermost line of the user's own code in a traced node's call stack (TorchScript's
    'FILE(LINE): FUNCTION' lines, innermost first), as raised_at says it; '' if none."""
    for file_name, line in re.findall(r"^(.+)\((\d+)\): \S+$", source_range, flags=re.MULTILINE):
        if not is_library(file_name):
            return f" at {_shown(file_name)}:{line}"
    return ""


def run_declared(adapter: Seq2SeqAdapter, what: str, call: Any, *args: Any) -> Any:
    """Call the adapter's encode or step (eager, no grad); a failure inside names the module it happened in."""
    tracing = Tracing(adapter)
    try:
        with torch.no_grad(), tracing.watch():
            return call(*args)
    except AdapterError:
        raise
    except (Exception, SystemExit) as exc:  # the user's code: any error (an exit too), reported with where it was
        raise AdapterError(f"{what} failed{tracing.where()}{raised_at(exc)}: {described(exc)}"
                           f"{tracing.hint(exc, args)}") from exc


def check_deterministic(what: str, first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> None:
    """Two calls on the same inputs gave the same tensors (within float rounding), else AdapterError naming it."""
    for name, value in first.items():
        other = second[name]
        if value.is_floating_point():
            same = torch.allclose(value, other, rtol=1e-5, atol=1e-6, equal_nan=True)
        else:
            same = torch.equal(value, other)
        if not same:
            worst = float((value.double() - other.double()).abs().max()) if value.is_floating_point() else None
            by = f" by up to {worst:.3g}" if worst is not None else ""
            raise AdapterError(f"{what} is not deterministic: two calls on the same inputs differ in {name!r}{by}; "
                               "dropout left on (in a module not listed in modules=[...], which export puts in eval "
                               "mode), a random op, or state kept outside the declared state (a Python counter or a "
                               "module attribute that each call changes) would make every export differ from "
                               "PyTorch; make it deterministic, and carry what changes in the state")
