"""--allocator (cli.allocator): a real process started again with its allocator preloaded, checked in its own memory
map; the user's LD_PRELOAD put back for the processes it starts; refusals; and `seq2onnx serve` end to end."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.allocator import choose, mimalloc_library

from support.processes import default_stops, logged_process
from support.serve import DATES, free_port, wait_healthy

ROOT = Path(__file__).resolve().parents[1]
MIMALLOC = mimalloc_library()
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or MIMALLOC is None,
                                reason="mimalloc is preloaded on Linux, from the serve extra's cmeel-mimalloc")

# A program that says when it starts, then chooses its allocator (argv[1]) and reports what it and a child map.
PROGRAM = """
import os, subprocess, sys
sys.path.insert(0, {root!r})
import signal
print("start", os.getpid(), flush=True)
print("held", sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])), flush=True)
from pathlib import Path
from cli.allocator import PRELOADING, _restart, choose
if len(sys.argv) > 2 and PRELOADING not in os.environ:  # as if auto had found this library: start again with it
    _restart(Path(sys.argv[2]))
print("runs with", choose(sys.argv[1]))
print("held after", sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])))
print("LD_PRELOAD", os.environ.get("LD_PRELOAD"))
print("SEQ2ONNX", sorted(k for k in os.environ if k.startswith("SEQ2ONNX")))
own = open("/proc/self/maps", errors="surrogateescape").read()
child = subprocess.run(["cat", "/proc/self/maps"], capture_output=True, text=True, errors="surrogateescape").stdout
print("own maps mimalloc", "libmimalloc" in own)
print("child maps mimalloc", "libmimalloc" in child)
"""


def run(value: str, *restart_with: str, preexec_fn: Any = None, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    return subprocess.run([sys.executable, "-c", PROGRAM.format(root=str(ROOT)), value, *restart_with],
                          capture_output=True, text=True, errors="surrogateescape", timeout=60, env={**environ, **env},
                          preexec_fn=preexec_fn)


def libc_family(name: str) -> str:
    """The path of one of the C library's own files (libm.so.6, libc.so.6) on this machine."""
    found = [p for p in (f"/lib/x86_64-linux-gnu/{name}", f"/usr/lib/x86_64-linux-gnu/{name}",
                         f"/lib/aarch64-linux-gnu/{name}", f"/usr/lib/aarch64-linux-gnu/{name}") if Path(p).exists()]
    if not found:
        pytest.skip("not a Debian layout")
    return found[0]


def lines(done: subprocess.CompletedProcess) -> list[str]:
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize("value", ["mimalloc", "auto", str(MIMALLOC)])
def test_the_process_starts_again_with_mimalloc_and_its_children_do_not_inherit_it(value: str) -> None:
    out = lines(run(value))
    starts = [line for line in out if line.startswith("start")]
    assert len(starts) == 2 and len(set(starts)) == 1  # started again, in place: the same pid
    assert "runs with libmimalloc.so.3" in out
    assert "own maps mimalloc True" in out and "child maps mimalloc False" in out
    assert "LD_PRELOAD None" in out and "SEQ2ONNX []" in out
    # Ctrl-C and SIGTERM held from just before the execve until the program's handlers are back: a signal in
    # between waits for them (it killed the process, -2 or -15, with no word)
    assert [line for line in out if line.startswith("held")] == [
        "held []", f"held {sorted([int(signal.SIGINT), int(signal.SIGTERM)])}", "held after []"]


def test_the_system_allocator_starts_nothing_again() -> None:
    out = lines(run("system"))
    assert len([line for line in out if line.startswith("start")]) == 1
    assert "runs with the system's malloc" in out and "own maps mimalloc False" in out


def test_the_users_own_ld_preload_is_kept_and_put_back() -> None:
    libm = next(p for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6",
                            "/lib/aarch64-linux-gnu/libm.so.6", "/usr/lib/aarch64-linux-gnu/libm.so.6")
                if Path(p).exists())
    out = lines(run("mimalloc", LD_PRELOAD=libm))
    assert "own maps mimalloc True" in out and f"LD_PRELOAD {libm}" in out and "SEQ2ONNX []" in out


@pytest.mark.parametrize("value", ["auto", "system", "mimalloc"])
def test_an_allocator_the_user_preloaded_is_left_as_it_is(value: str) -> None:
    out = lines(run(value, LD_PRELOAD=str(MIMALLOC)))
    assert len([line for line in out if line.startswith("start")]) == 1
    assert f"runs with libmimalloc.so.3 (preloaded already{', by your LD_PRELOAD' if value != 'mimalloc' else ''})" \
        in out


def test_a_second_allocator_over_the_users_is_refused(tmp_path: Path) -> None:
    """Another copy of mimalloc (as a distribution's would be) preloaded by the user, then the wheel's asked for:
    two allocators in one process crashed it (exit 139, no word)."""
    other = tmp_path / "libmimalloc.so.2"
    other.write_bytes(MIMALLOC.read_bytes())
    done = run("mimalloc", LD_PRELOAD=str(other))
    assert done.returncode == 1 and "runs with" not in done.stdout
    assert f"malloc is {other} already (your LD_PRELOAD)" in done.stderr, done.stderr[-2000:]


def test_a_stray_preloading_variable_is_not_taken_for_a_restart() -> None:
    """Only the process that set it (the pid survives execve) reads it."""
    out = lines(run("mimalloc", SEQ2ONNX_PRELOADING="1:/bogus"))
    assert len([line for line in out if line.startswith("start")]) == 2 and "runs with libmimalloc.so.3" in out


@pytest.mark.parametrize("value, says", [
    ("notes.txt", ("could not be preloaded", "not an allocator this machine can preload")),
    ("missing.so", ("expected auto, system, mimalloc or the path", "missing.so', which is not a file")),
    ("x" * 300 + ".so", ("expected auto, system, mimalloc or the path", "which cannot be read (File name too long)")),
    ("~nosuchuser/lib.so", ("expected auto, system, mimalloc or the path", "which cannot be read")),
    ("/lib/x86_64-linux-gnu/libm.so.6", ("was preloaded, but malloc is", "not an allocator")),
])
def test_what_cannot_be_preloaded_is_refused(tmp_path: Path, value: str, says: tuple[str, ...]) -> None:
    (tmp_path / "notes.txt").write_text("not a library\n")
    if value.endswith("libm.so.6") and not Path(value).exists():
        pytest.skip("not a Debian x86-64 layout")
    done = run(value if value.startswith(("/", "~")) else str(tmp_path / value))
    assert done.returncode == 1 and "runs with" not in done.stdout
    assert all(s in done.stderr for s in says), done.stderr


def test_auto_goes_on_with_the_system_allocator_where_the_library_will_not_load(tmp_path: Path) -> None:
    """A process started again whose library the loader refused (here: as if auto had found a broken one)."""
    broken = tmp_path / "libmimalloc.so.3"
    broken.write_text("not a library\n")
    done = run("auto", str(broken))
    out = lines(done)
    assert "runs with the system's malloc" in out and "could not be preloaded" in done.stderr
    assert "LD_PRELOAD None" in out


def _limited() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # `ulimit -v 4194304`: room enough to run


def test_auto_keeps_the_system_allocator_where_the_address_space_is_limited() -> None:
    """Under `ulimit -v` an allocation can fail, and mimalloc's operator new then aborts the process (a server sent
    requests that outgrew its limit died by SIGABRT, saying nothing) where glibc's throws std::bad_alloc, which is
    answered as a refused request. auto keeps the system's malloc there; mimalloc asked for by name still loads."""
    out = lines(run("auto", preexec_fn=_limited))
    assert len([line for line in out if line.startswith("start")]) == 1  # not started again
    assert "runs with the system's malloc (auto, as the address space is limited: ulimit -v)" in out
    assert "own maps mimalloc False" in out
    done = run("mimalloc", preexec_fn=_limited)
    named = lines(done)
    assert "runs with libmimalloc.so.3" in named and "own maps mimalloc True" in named
    assert done.stderr.count("note: the address space is limited (ulimit -v): libmimalloc.so.3 may abort") == 1


def test_a_caller_in_its_own_process_is_never_started_again() -> None:
    """A test (or a library) calling the command: auto keeps the system's malloc; a named allocator is refused."""
    assert choose("auto", program=False) in ("the system's malloc", "libmimalloc.so.3 (preloaded already)")
    if "libmimalloc" not in Path("/proc/self/maps").read_text():
        with pytest.raises(Exception, match="only the seq2onnx program on Linux does"):
            choose("mimalloc", program=False)


@pytest.mark.parametrize("allocator, loaded", [("auto", True), ("system", False)])
def test_serve_runs_with_the_allocator_it_was_given(tmp_path: Path, allocator: str, loaded: bool) -> None:
    port, log = free_port(), tmp_path / "serve.log"
    with logged_process([sys.executable, "-m", "cli", "serve", str(DATES), "--port", str(port), "--allocator",
                         allocator], log, cwd=ROOT, preexec_fn=default_stops) as process:
        wait_healthy(f"http://127.0.0.1:{port}/healthz", 120, process)
        maps = Path(f"/proc/{process.pid}/maps").read_text()  # the pid the supervisor holds is the server's
        assert ("libmimalloc" in maps) == loaded
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/translate", json={"texts": ["march 3 1999"]}, timeout=30)
        assert reply.status_code == 200 and reply.json()["translations"][0][0]["text"]
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
    text = log.read_text()
    assert ("libmimalloc.so.3; Ctrl-C stops" if loaded else "the system's malloc; Ctrl-C stops") in text, text
    assert "serve: stopped" in text


@pytest.mark.parametrize("name", ["lib mimalloc.so", "lib:mimalloc.so"])
def test_a_path_ld_preload_cannot_hold_is_refused_before_starting_again(tmp_path: Path, name: str) -> None:
    """LD_PRELOAD splits at colons and spaces: such a path would preload something else, or nothing. (A link to
    the library from such a path is fine: the link is followed.)"""
    copy = tmp_path / name
    copy.write_bytes(MIMALLOC.read_bytes())
    done = run(str(copy))
    assert done.returncode == 1 and len([line for line in done.stdout.splitlines() if line.startswith("start")]) == 1
    assert "cannot hold a path with a colon or a space" in done.stderr, done.stderr


def test_what_the_walk_found_second(tmp_path: Path) -> None:
    """A file name that is not UTF-8 in the memory map; a link from a plain path to a library under a path with a
    space (the link is what the loader gets); the C library itself asked for."""
    odd = os.fsdecode(bytes(tmp_path) + b"/m\xff.so")
    Path(odd).write_bytes(Path(libc_family("libm.so.6")).read_bytes())
    out = lines(run("system", LD_PRELOAD=odd))
    assert "runs with the system's malloc" in out
    spaced = tmp_path / "with space"
    spaced.mkdir()
    (spaced / "libmimalloc.so.3").write_bytes(MIMALLOC.read_bytes())
    (tmp_path / "linked.so").symlink_to(spaced / "libmimalloc.so.3")
    assert "runs with linked.so" in lines(run(str(tmp_path / "linked.so")))
    out = lines(run(libc_family("libc.so.6")))
    assert len([line for line in out if line.startswith("start")]) == 1 and "runs with the system's malloc" in out


def test_a_closed_stderr_and_a_parents_held_sigterm_survive_the_restart() -> None:
    """The restart flushes what it can (a closed descriptor's stream is None), and lets in only what it held:
    a SIGTERM the parent had blocked stays blocked."""
    def closed_and_held() -> None:
        os.close(2)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    done = run("mimalloc", preexec_fn=closed_and_held)
    out = done.stdout.splitlines()
    assert done.returncode == 0 and "runs with libmimalloc.so.3" in out, done.stdout
    term = int(signal.SIGTERM)
    assert [line for line in out if line.startswith("held")] == [
        f"held [{term}]", f"held {sorted([int(signal.SIGINT), term])}", f"held after [{term}]"]
