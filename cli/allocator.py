"""`--allocator`: the C allocator a long-running process (`seq2onnx serve`, the benchmarks) runs with.

onnxruntime allocates small C++ objects for every kernel it runs (tensors, shapes, a Loop body's frame each
iteration): ~300 mallocs a step of the dates transformer's batch-1 beam graph, ~6,000 a call. glibc's malloc spent
~14% of that call's time in `perf` and ~1.5 M of its 13.5 M instructions (callgrind); mimalloc and jemalloc cost less
per allocation and keep the objects closer together. A process's allocator is chosen when it starts (the dynamic
loader's LD_PRELOAD), so `choose` starts the program again, in place (`execve`: the same pid, so a supervisor's
signals still reach it; Ctrl-C and SIGTERM are held across it and land once the program's handlers are back), with
the library preloaded, and the new process checks that `malloc` is now the library's. LD_PRELOAD is then put back as
the user had it, so processes this one starts run with their own allocator.

Choices: "system" (the C library's malloc), "mimalloc" (the `cmeel-mimalloc` wheel, installed with the `serve`
extra on Linux), a path to a shared library to preload (jemalloc, tcmalloc ...), or "auto": mimalloc where it is
installed and the platform is Linux and the address space is not limited (`limited_address_space`), else the
system's. Where `malloc` is already another library's (the user's own
LD_PRELOAD), auto and system say so and leave it, and a named allocator is refused: two allocators stacked crashed.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from pathlib import Path

import click

WHEEL = "cmeel-mimalloc"
PRELOADING = "SEQ2ONNX_PRELOADING"  # "pid:held:library" across the execve (the pid survives it; a stray value does
# not), held: which of HELD the process had blocked itself before, comma-separated
PRELOAD_WAS = "SEQ2ONNX_LD_PRELOAD_WAS"  # the user's own LD_PRELOAD, put back after the check
SYSTEM = "the system's malloc"  # what a process that keeps the C library's malloc runs with, in words
HELD = {signal.SIGINT, signal.SIGTERM}  # blocked across the execve: a signal then waits for the new handlers


def mimalloc_library() -> Path | None:
    """libmimalloc.so.* of the installed cmeel-mimalloc wheel, or None."""
    from importlib import metadata  # here: ~14 ms to import, which every command would pay (the arena cap below)

    try:
        files = metadata.distribution(WHEEL).files or []
    except metadata.PackageNotFoundError:
        return None
    found = sorted(f for f in files if f.name.startswith("libmimalloc.so.") and f.name.count(".") == 2)
    return Path(found[0].locate()).resolve() if found else None


def malloc_owner() -> Path | None:
    """The file whose `malloc` this process calls (the first definition the loader finds: a preloaded library's
    before the C library's), from this process's memory map; None where that cannot be read (not Linux)."""
    try:
        address = ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value or 0
    except (OSError, AttributeError):
        return None
    return next((Path(path).resolve() for start, end, path in _file_regions() if start <= address < end), None)


def _file_regions() -> list[tuple[int, int, str]]:
    """(start, end, file) of each region of this process's memory map that maps a file (file names that are not
    UTF-8 kept as os.fsdecode keeps them); none where the map cannot be read."""
    try:
        lines = Path("/proc/self/maps").read_text(errors="surrogateescape").splitlines()
    except OSError:
        return []
    regions = []
    for fields in (line.split(None, 5) for line in lines):
        start, _, end = fields[0].partition("-")
        if len(fields) == 6 and start and end:
            regions.append((int(start, 16), int(end, 16), fields[5]))
    return regions


def _mapped(library: Path) -> bool:
    """Whether `library` (resolved) is in this process's memory map."""
    return any(path == str(library.resolve()) for _, _, path in _file_regions())


def is_system(owner: Path | None) -> bool:
    """Whether `owner` (malloc_owner's) is the C library itself."""
    return owner is None or owner.name.startswith(("libc.so", "libc-", "ld-musl"))


def choose(value: str, option: str = "--allocator", program: bool = True) -> str:
    """Run this process with the allocator `value` names, starting it again where needed (never returns then).
    Returns what it runs with, in words, for the program's ready line. `program`: this process is the command
    (not a test calling it in its own process), so it may be started again."""
    pid, _, rest = os.environ.get(PRELOADING, "").partition(":")
    held, _, library = rest.partition(":")
    if pid == str(os.getpid()) and library:
        return _after_restart(Path(library), held, value, option)
    owner = malloc_owner()
    if not is_system(owner):
        if value in ("auto", "system"):
            return f"{owner.name} (preloaded already, by your LD_PRELOAD)"  # type: ignore[union-attr]
        library = _library(value, option)
        if library is not None and library.resolve() == owner:
            return f"{owner.name} (preloaded already)"  # type: ignore[union-attr]
        raise click.BadParameter(f"malloc is {owner} already (your LD_PRELOAD), and two allocators in one process "
                                 f"crash; drop it from LD_PRELOAD, or use --allocator auto", param_hint=f"'{option}'")
    if value == "system":
        return SYSTEM
    if value == "auto" and limited_address_space():
        return f"{SYSTEM} (auto, as the address space is limited: ulimit -v)"
    library = _library(value, option)
    if library is None or is_system(library.resolve()):
        return SYSTEM
    if not program or not sys.executable or not sys.platform.startswith("linux"):
        if value == "auto":
            return SYSTEM
        raise click.BadParameter(f"{value!r} is preloaded by starting the program again, which only the seq2onnx "
                                 "program on Linux does; use --allocator system here", param_hint=f"'{option}'")
    if any(c in str(library) for c in ": \t\n"):  # LD_PRELOAD splits at colons and spaces, with no escape
        why = (f"{str(library)!r}: the loader's LD_PRELOAD cannot hold a path with a colon or a space; a symbolic "
               "link to it from a path without them will do")
        if value == "auto":
            click.echo(f"note: {why}; running with {SYSTEM}", err=True)
            return SYSTEM
        raise click.BadParameter(why, param_hint=f"'{option}'")
    if limited_address_space():  # asked for by name (auto keeps the system's malloc here)
        click.echo(f"note: the address space is limited (ulimit -v): {library.name} may abort this process when an "
                   "allocation fails, where the system's malloc lets the request be refused; --allocator auto keeps "
                   "the system's malloc here", err=True)
    _restart(library)
    raise AssertionError("unreachable: execve returned")


def limited_address_space() -> bool:
    """Whether this process's address space is limited (`ulimit -v`, RLIMIT_AS): where it is, an allocation can fail,
    and mimalloc's C++ `operator new` aborts the process when one does (a server under `ulimit -v 800000`, sent
    requests that outgrew it, died by SIGABRT with nothing said) where the C library's throws `std::bad_alloc`,
    which onnxruntime reports and the server answers as a refused request. auto keeps the system's malloc there."""
    try:
        import resource
    except ImportError:  # not a Unix
        return False
    return resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY


ARENAS_UNDER_A_LIMIT = 2
M_ARENA_MAX = -8  # glibc's mallopt parameter


def fewer_arenas_under_a_limit() -> bool:
    """Where the address space is limited (`ulimit -v`) and malloc is glibc's: at most ARENAS_UNDER_A_LIMIT malloc
    arenas. glibc gives each thread that allocates an arena of its own, reserving 64 MB of address space, which the
    limit counts though little of it is used: onnxruntime's thread pools (one per session; a transformer export holds
    a dozen) reserved 1.15 GB at --threads 2 for a model of 120 MB resident, so under `ulimit -v 900000` it could
    not load; with 2 arenas, 390 MB (as MALLOC_ARENA_MAX=2 does). Returns whether the cap was set."""
    if not limited_address_space() or "MALLOC_ARENA_MAX" in os.environ:  # the user's own setting stands
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc's, not musl's or another allocator's mallopt
        return bool(libc.mallopt(M_ARENA_MAX, ARENAS_UNDER_A_LIMIT))
    except (OSError, AttributeError):
        return False


def unwinder_loaded() -> bool:
    """Has glibc load its unwinder (libgcc_s) now, while there is room to, by asking for a one-frame backtrace
    (~0.2 ms). glibc opens libgcc_s the first time a thread ends by pthread_exit, and Python ends a daemon thread so
    when it wakes while the interpreter shuts down; where that open then fails (the address space spent under
    `ulimit -v`, or no file descriptor left) glibc aborts the process: infer under `ulimit -v 145000` decoded its
    line, then died by SIGABRT with "libgcc_s.so.1 must be installed for unwinding to work" and its output lost.
    Returns whether the backtrace was taken (glibc on Linux)."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc's backtrace is the one that opens libgcc_s
        frames = (ctypes.c_void_p * 1)()
        return libc.backtrace(frames, 1) > 0
    except (OSError, AttributeError):
        return False


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
    if not linux:
        raise click.BadParameter(f"a library to preload ({value!r}) works on Linux only; use --allocator system",
                                 param_hint=f"'{option}'")
    try:
        path = Path(value).expanduser()
        if path.is_file():
            return path.absolute()  # as given: a link is what the loader is handed (resolved where compared)
        why = "which is not a file"
    except (OSError, RuntimeError) as exc:  # a name too long, a directory we may not search, ~nosuchuser
        why = f"which cannot be read ({getattr(exc, 'strerror', None) or exc})"
    raise click.BadParameter(f"expected auto, system, mimalloc or the path of a shared library to preload, got "
                             f"{value[:200]!r}, {why}", param_hint=f"'{option}'")


def _restart(library: Path) -> None:
    """execve this program again with `library` first in LD_PRELOAD, Ctrl-C and SIGTERM held until it is back."""
    was = os.environ.get("LD_PRELOAD")
    for stream in (sys.stdout, sys.stderr):  # None where the descriptor was closed
        with contextlib.suppress(Exception):
            stream.flush()  # type: ignore[union-attr]
    before = signal.pthread_sigmask(signal.SIG_BLOCK, HELD) & HELD  # what the process's parent had held stays held
    held = ",".join(str(int(s)) for s in sorted(before))
    env = dict(os.environ, LD_PRELOAD=f"{library}:{was}" if was else str(library),
               **{PRELOADING: f"{os.getpid()}:{held}:{library}"})
    if was is not None:
        env[PRELOAD_WAS] = was
    try:
        os.execve(sys.executable, list(sys.orig_argv), env)
    except OSError as exc:
        raise click.ClickException(f"could not start {sys.executable} again with {library} preloaded "
                                   f"({exc.strerror or exc}); use --allocator system") from None
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD - before)


def _after_restart(library: Path, held: str, value: str, option: str) -> str:
    """In the process started again: the user's LD_PRELOAD put back, a signal held across the execve let in, and
    malloc found to be the library's, or a refusal for an allocator asked for by name or path (auto goes on with
    the system's, saying so)."""
    os.environ.pop(PRELOADING)
    was = os.environ.pop(PRELOAD_WAS, None)
    if was is None:
        os.environ.pop("LD_PRELOAD", None)
    else:
        os.environ["LD_PRELOAD"] = was
    before = {signal.Signals(int(s)) for s in held.split(",") if s.isdigit()}
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD - before)
    owner = malloc_owner()
    if owner is not None and owner == library.resolve():
        return library.name
    why = (f"was preloaded, but malloc is {owner}'s" if _mapped(library) and owner is not None else
           "could not be preloaded (see the loader's message above)")
    if value == "auto":
        click.echo(f"note: {library} {why}; running with {SYSTEM}", err=True)
        return SYSTEM
    raise click.BadParameter(f"{library} {why}: not an allocator this machine can preload", param_hint=f"'{option}'")
