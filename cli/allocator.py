"""`--allocator`: the C allocator a long-running process (`seq2onnx serve`, the benchmarks) runs with.

onnxruntime allocates small C++ objects for every kernel it runs (tensors, shapes, a Loop body's frame each
iteration): ~300 mallocs a step of the dates transformer's batch-1 beam graph, ~6,000 a call. glibc's malloc spent
~14% of that call's time in `perf` and ~1.5 M of its 13.5 M instructions (callgrind); mimalloc and jemalloc cost less
per allocation and keep the objects closer together. A process's allocator is chosen when it starts (the dynamic
loader's LD_PRELOAD), so `choose` starts the program again, in place (`execv`: the same pid, so a supervisor's
signals still reach it), with the library preloaded, and the new process checks that the library is in its memory
map. LD_PRELOAD is then put back as the user had it, so processes this one starts run with their own allocator.

Choices: "system" (the C library's malloc), "mimalloc" (the `cmeel-mimalloc` wheel, installed with the `serve`
extra on Linux), a path to a shared library to preload (jemalloc, tcmalloc ...), or "auto": mimalloc where it is
installed and the platform is Linux, else the system's, and nothing at all where an allocator is preloaded already.
"""
from __future__ import annotations

import os
import sys
from importlib import metadata
from pathlib import Path

import click

CHOICES = ("auto", "system", "mimalloc")
WHEEL = "cmeel-mimalloc"
PRELOADING = "SEQ2ONNX_PRELOADING"  # set across the execv: the library this process was started again with
PRELOAD_WAS = "SEQ2ONNX_LD_PRELOAD_WAS"  # the user's own LD_PRELOAD, put back after the check
KNOWN = ("libmimalloc", "libjemalloc", "libtcmalloc")  # allocators "auto" leaves alone when already preloaded


def mimalloc_library() -> Path | None:
    """libmimalloc.so.* of the installed cmeel-mimalloc wheel, or None."""
    try:
        files = metadata.distribution(WHEEL).files or []
    except metadata.PackageNotFoundError:
        return None
    found = sorted(f for f in files if f.name.startswith("libmimalloc.so.") and f.name.count(".") == 2)
    return Path(found[0].locate()).resolve() if found else None


def mapped_libraries() -> set[str]:
    """The resolved paths of the shared libraries in this process's memory map (Linux), else an empty set."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return set()
    return {str(Path(line.split(None, 5)[5]).resolve()) for line in lines if len(line.split(None, 5)) == 6
            and ".so" in line.split(None, 5)[5]}


def choose(value: str, option: str = "--allocator", program: bool = True) -> str:
    """Run this process with the allocator `value` names, starting it again where needed (never returns then).
    Returns what it runs with, in words, for the program's ready line. `program`: this process is the command
    (not a test calling it in its own process), so it may be started again."""
    if os.environ.get(PRELOADING) is not None:
        return _after_restart(value, option)
    if value == "system":
        return "the system's malloc"
    preloaded = sorted(p for p in mapped_libraries() if Path(p).name.startswith(KNOWN))
    if value == "auto" and preloaded:
        return f"{Path(preloaded[0]).name} (preloaded already)"
    library = _library(value, option)
    if library is None:
        return "the system's malloc"
    if str(library) in mapped_libraries():
        return f"{library.name} (preloaded already)"
    if not program or not sys.executable or not sys.platform.startswith("linux"):
        if value == "auto":
            return "the system's malloc"
        raise click.BadParameter(f"{value!r} is preloaded by starting the program again, which only the seq2onnx "
                                 "program on Linux does; use --allocator system here", param_hint=f"'{option}'")
    if any(c in str(library) for c in ": \t\n"):  # LD_PRELOAD splits at colons and spaces, with no escape
        if value == "auto":
            return "the system's malloc"
        raise click.BadParameter(f"{str(library)!r}: the loader's LD_PRELOAD cannot hold a path with a colon or a "
                                 "space; link the library from a path without them", param_hint=f"'{option}'")
    _restart(library)
    raise AssertionError("unreachable: execv returned")


def _library(value: str, option: str) -> Path | None:
    """The library `value` asks for: None for auto without mimalloc (or off Linux)."""
    linux = sys.platform.startswith("linux")
    if value in ("auto", "mimalloc"):
        library = mimalloc_library() if linux else None
        if library is None and value == "mimalloc":
            why = "is not installed" if linux else "is preloaded on Linux only"
            raise click.BadParameter(f"mimalloc {why}; install the serve extra (pip install 'seq2onnx[serve]', "
                                     f"which brings {WHEEL} on Linux) or use --allocator system",
                                     param_hint=f"'{option}'")
        return library
    path = Path(value).expanduser()
    if not linux:
        raise click.BadParameter(f"a library to preload ({value!r}) works on Linux only; use --allocator system",
                                 param_hint=f"'{option}'")
    if not path.is_file():
        raise click.BadParameter(f"expected auto, system, mimalloc or the path of a shared library to preload, "
                                 f"got {value!r}, which is not a file", param_hint=f"'{option}'")
    return path.resolve()


def _restart(library: Path) -> None:
    """execv this program again with `library` first in LD_PRELOAD."""
    was = os.environ.get("LD_PRELOAD")
    env = dict(os.environ, LD_PRELOAD=f"{library}:{was}" if was else str(library), **{PRELOADING: str(library)})
    if was is not None:
        env[PRELOAD_WAS] = was
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, list(sys.orig_argv), env)


def _after_restart(value: str, option: str) -> str:
    """In the process started again: the user's LD_PRELOAD put back, and the library found in the memory map, or a
    refusal for an allocator asked for by name or path (auto goes on with the system's, saying so)."""
    library = os.environ.pop(PRELOADING)
    was = os.environ.pop(PRELOAD_WAS, None)
    if was is None:
        os.environ.pop("LD_PRELOAD", None)
    else:
        os.environ["LD_PRELOAD"] = was
    if library in mapped_libraries():
        return Path(library).name
    if value == "auto":
        click.echo(f"note: {library} could not be preloaded (see the loader's message above); running with the "
                   "system's malloc", err=True)
        return "the system's malloc"
    raise click.BadParameter(f"{library} could not be preloaded (see the loader's message above): not a shared "
                             "library this machine can load", param_hint=f"'{option}'")
