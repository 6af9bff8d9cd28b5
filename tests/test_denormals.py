"""Denormals flushed to zero while seq2onnx runs a graph, on the threads that run it, and the caller's flags left as
they were (runtime.denormals): real onnxruntime sessions, real threads, a fresh process where onnxruntime's
once-per-process setting matters."""
from __future__ import annotations

import subprocess
import threading
from typing import Callable, Iterator

import numpy as np
import pytest
from onnx import TensorProto, helper

from runtime import denormals
from runtime.binding import SessionRunner
from runtime.denormals import DENORMAL_AS_ZERO, FLAGS, flushes_now, flushing, keeping_flags, session_flag
from runtime.model import Seq2Seq
from runtime.sessions import open_session

from support.devices import X86_LINUX

needs_flags = pytest.mark.skipif(not X86_LINUX, reason="denormals are flushed on x86-64 Linux only")
TINY = np.float32(1e-38)  # the smallest normal float32 is 1.18e-38: TINY * 0.01 is denormal unless flushed


def scale_graph() -> bytes:
    """y = x * 0.01 (float32, any shape)."""
    graph = helper.make_graph([helper.make_node("Mul", ["x", "scale"], ["y"])], "scale",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
                              initializer=[helper.make_tensor("scale", TensorProto.FLOAT, [], [0.01])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def flags_seen(decode: Callable[[Callable[[], bool]], object]) -> list[bool]:
    """Whether the thread flushed each time `decode(cancel)` asked its cancel (the step loop asks before every
    step, on the calling thread); asserts it asked at least once and that nothing flushes after."""
    seen: list[bool] = []
    caller = threading.get_ident()

    def probe() -> bool:
        if threading.get_ident() == caller:  # the watchdog asks too, on its own thread, while a graph runs
            seen.append(flushes_now())
        return False

    decode(probe)
    assert seen and not flushes_now()
    return seen


@pytest.fixture
def flush_off() -> Iterator[None]:
    yield
    denormals.FLUSH = True


def test_the_flags_work_where_they_are_promised() -> None:
    assert FLAGS.works is X86_LINUX
    assert not flushes_now()  # nothing is flushed outside a block, import included


@needs_flags
def test_a_block_flushes_on_its_thread_and_restores_the_flags_nested_and_on_error() -> None:
    with flushing():
        assert flushes_now()
        with flushing():
            assert flushes_now()
        assert flushes_now()  # the inner block leaves the outer one's flags
    assert not flushes_now()
    with pytest.raises(KeyError), flushing():
        raise KeyError("x")
    assert not flushes_now()


@needs_flags
def test_threads_flush_apart() -> None:
    seen: dict[str, bool] = {}
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with flushing():
            seen["other inside"] = flushes_now()
            inside.set()
            release.wait(10)
        seen["other after"] = flushes_now()

    thread = threading.Thread(target=other)
    thread.start()
    assert inside.wait(10)
    seen["main while other flushes"] = flushes_now()
    release.set()
    thread.join(10)
    assert seen == {"other inside": True, "main while other flushes": False, "other after": False}


@needs_flags
@pytest.mark.parametrize("threads", [1, 2])
def test_a_run_in_a_block_flushes_on_the_caller_and_on_onnxruntime_s_workers(threads: int) -> None:
    """A large Mul is split over onnxruntime's worker threads at 2 threads: every element comes out 0 only when
    the workers flush too (the session option), and the caller's thread as well (the block)."""
    session = open_session(scale_graph(), "cpu", threads, "scale")
    assert session.get_session_options().get_session_config_entry(DENORMAL_AS_ZERO) == "1"
    run = SessionRunner(session, ["y"], "scale")
    with flushing():
        y = run({"x": np.full(1 << 20, TINY, np.float32)})["y"]
    assert not np.any(y)
    assert not flushes_now()


@needs_flags
def test_a_block_that_is_not_wanted_leaves_the_flags() -> None:
    with flushing(False):
        assert not flushes_now()
        with flushing():  # a block that wants them inside one that does not: its own
            assert flushes_now()
        assert not flushes_now()
    with flushing(), flushing(False):
        assert flushes_now()
    assert not flushes_now()


@needs_flags
def test_one_block_object_entered_inside_itself_puts_the_flags_back() -> None:
    block = flushing()
    with block:
        with block:
            assert flushes_now()
        assert flushes_now()
    assert not flushes_now()


@needs_flags
def test_a_thread_that_flushes_of_its_own_keeps_its_flags_after_a_block() -> None:
    """A service that set FTZ/DAZ itself: a block finds them set and puts nothing back, so they stay set."""
    with keeping_flags():
        denormals.FLAGS.enter()  # the thread's own choice, not a block's
        with flushing():
            assert flushes_now()
        assert flushes_now()
    assert not flushes_now()


@needs_flags
def test_with_flush_off_a_run_keeps_ieee_denormals(flush_off: None) -> None:
    denormals.FLUSH = False
    assert session_flag() == {}
    session = open_session(scale_graph(), "cpu", 2, "scale")
    with pytest.raises(RuntimeError):  # onnxruntime: no such config entry
        session.get_session_options().get_session_config_entry(DENORMAL_AS_ZERO)
    y = SessionRunner(session, ["y"], "scale")({"x": np.full(1 << 20, TINY, np.float32)})["y"]
    np.testing.assert_allclose(y, np.float32(1e-40), rtol=1e-3)


@needs_flags
def test_the_first_use_check_holds_on_a_thread_that_already_flushes() -> None:
    """Another library may have set FTZ/DAZ on the thread that first asks: the check tests both states itself and
    leaves the thread's flags as they were."""
    fresh = denormals._Flags()
    with flushing():
        assert fresh.works
        assert flushes_now()
    assert not flushes_now()


@needs_flags
def test_keeping_flags_undoes_a_change_made_inside() -> None:
    with keeping_flags():
        with flushing():
            pass
        denormals.FLAGS.enter()  # as onnxruntime does to the thread that makes its first session
        assert flushes_now()
    assert not flushes_now()


@needs_flags
def test_making_the_first_session_of_a_process_leaves_its_thread_as_it_was(python: str) -> None:
    """onnxruntime sets FTZ/DAZ, for good, on the thread that makes the process's first session with the option:
    open_session puts the thread back (a fresh process, so that this session is the first)."""
    code = ("import sys; sys.path.insert(0, 'tests'); from test_denormals import scale_graph;"
            "from runtime.sessions import open_session; from runtime.denormals import flushes_now;"
            "open_session(scale_graph(), 'cpu', 1, 'scale'); print(flushes_now())")
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


@needs_flags
def test_the_flags_load_libm_without_a_child_process(python: str) -> None:
    """libm is loaded by its soname: ctypes.util.find_library would run /sbin/ldconfig in a child process, which a
    supervisor watching the server's process group sees come and go (and which costs milliseconds at start)."""
    code = ("import subprocess; started = []; real = subprocess.Popen.__init__\n"
            "def spy(self, args, *a, **k): started.append(args); real(self, args, *a, **k)\n"
            "subprocess.Popen.__init__ = spy\n"
            "from runtime.denormals import FLAGS, flushing, flushes_now\n"
            "with flushing(): flushed = flushes_now()\n"
            "print(FLAGS.works, flushed, started)")
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "[]"], done.stdout


@needs_flags
@pytest.mark.parametrize("texts, beam, flushed", [(["a b", "c"], 1, True), (["a b"], 2, True), (["a b"], 1, False)])
def test_a_decode_of_more_than_one_row_flushes_for_its_length_only(transformer_export, texts: list[str], beam: int,
                                                                    flushed: bool) -> None:
    """The step loop asks `cancel` before every step on the calling thread: it flushes there for a decode of more
    than one row (inputs x beams) and not after; one row (no masked attention to flush) keeps the flags as they
    are, sparing the flag changes' cost (~1% of a greedy batch-1 call)."""
    model = Seq2Seq.load(transformer_export.path, provider="cpu", threads=1, fused=False)
    seen = flags_seen(lambda cancel: model.translate_batch(texts, beam_size=beam, max_decoding_length=4,
                                                           cancel=cancel))
    assert set(seen) == {flushed}


@needs_flags
@pytest.mark.parametrize("batch, flushed", [(2, True), (1, False)])
def test_a_point_decode_flushes_from_two_sources(exports, batch: int, flushed: bool) -> None:
    model = Seq2Seq.load(exports["dot"].path, provider="cpu", threads=1, fused=False)
    source = np.zeros((batch, 4, model.spec.n_features), np.float32)
    assert set(flags_seen(lambda cancel: model.predict(source, target_len=3, cancel=cancel))) == {flushed}


@needs_flags
def test_a_point_decode_of_one_padded_source_flushes(exports) -> None:
    model = Seq2Seq.load(exports["dot"].path, provider="cpu", threads=1, fused=False)
    source = np.zeros((1, 4, model.spec.n_features), np.float32)
    assert all(flags_seen(lambda cancel: model.predict(source, target_len=3, source_mask=np.array([[1, 1, 1, 0]]),
                                                       cancel=cancel)))


WATCHDOG_PROBE = """
import sys, threading, time
import onnxruntime as ort
from runtime.binding import WATCHDOG
from runtime.denormals import flushes_now
from runtime.model import Seq2Seq
model = Seq2Seq.load(sys.argv[1], provider="cpu", threads=1)
model.translate_batch(["a b", "c"], beam_size=2, max_decoding_length=4, cancel=lambda: False)  # starts the watchdog
assert WATCHDOG._thread is not None
seen = set()
def probe():
    seen.add((threading.current_thread().name, flushes_now()))
    return False
options = ort.RunOptions()
WATCHDOG.watch(options, probe)  # the watchdog asks it every few ms
time.sleep(0.1)
WATCHDOG.unwatch(options)
print(sorted(seen))
"""


@needs_flags
def test_the_watchdog_started_inside_a_flushed_decode_does_not_flush(transformer_export, python: str) -> None:
    """A new thread inherits its starter's FTZ/DAZ: the cancel watchdog's askers, started by the first watched
    decode (here a flushed one, in a fresh process), clear them, so the cancels they ask run as their callers' would."""
    done = subprocess.run([python, "-c", WATCHDOG_PROBE, str(transformer_export.path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "('seq2onnx-watchdog-ask', False)" in done.stdout and "True" not in done.stdout, done.stdout


@needs_flags
def test_decoded_ids_are_the_same_flushed_or_not(transformer_export, flush_off: None) -> None:
    texts = ["a b c", "b", "c a"]
    flushed = Seq2Seq.load(transformer_export.path, provider="cpu", threads=1)
    decoded = [flushed.translate_batch(texts, beam_size=k, num_hypotheses=k, max_decoding_length=6) for k in (1, 3)]
    denormals.FLUSH = False
    plain = Seq2Seq.load(transformer_export.path, provider="cpu", threads=1)
    again = [plain.translate_batch(texts, beam_size=k, num_hypotheses=k, max_decoding_length=6) for k in (1, 3)]
    for ours, theirs in zip(decoded, again):
        for a, b in zip(ours, theirs):
            assert [h.tokens for h in a] == [h.tokens for h in b]
            np.testing.assert_allclose([h.score for h in a], [h.score for h in b], rtol=1e-6)
