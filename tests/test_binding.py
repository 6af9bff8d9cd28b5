"""IO binding (runtime.binding): decoder state kept on the execution device between calls, same results.

On this CPU-only machine the bound path runs with the CPU as its device (OrtValues in CPU memory): the same code
that keeps state on a GPU with the CUDA provider. The CUDA rows run only where CUDA really works (conftest.DEVICES).
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from runtime import Seq2Seq
from runtime.binding import RUN_FAILED_ADVICE, BoundRunner, SessionRunner
from runtime.errors import InputError
from runtime.sessions import open_session

from support.devices import DEVICES
from support.models import source_batch

TEXTS = ["one is one", "two is two three", "three", "one two three four five"]
DEVICE_RTOL = 1e-4  # CUDA kernels round differently from the CPU's


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fused", [True, False])
def test_points_decode_the_same_with_state_bound_to_the_device(exported, device, fused):
    plain = Seq2Seq.load(exported.path, provider="cpu", fused=fused)
    bound = Seq2Seq.load(exported.path, provider=device, fused=fused, io_binding=True)
    assert bound.io_binding and not plain.io_binding
    source = source_batch(4, 5)
    got, got_attention = bound.predict(source, 6, return_attention=True)
    want, want_attention = plain.predict(source, 6, return_attention=True)
    if device == "cpu":
        np.testing.assert_array_equal(got, want)
        if want_attention is not None:
            np.testing.assert_array_equal(got_attention, want_attention)
    else:
        np.testing.assert_allclose(got, want, rtol=DEVICE_RTOL, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("options", [{}, {"beam_size": 3, "num_hypotheses": 2}, {"sampling_topk": 0, "seed": 3},
                                     {"return_attention": True, "max_decoding_length": 5}])
def test_token_search_is_the_same_with_state_bound_to_the_device(transformer_export, device, options):
    for fused in (True, False):
        plain = Seq2Seq.load(transformer_export.path, provider="cpu", fused=fused)
        bound = Seq2Seq.load(transformer_export.path, provider=device, fused=fused, io_binding=True)
        got, want = bound.translate_batch(TEXTS, **options), plain.translate_batch(TEXTS, **options)
        assert [[h.ids for h in hyps] for hyps in got] == [[h.ids for h in hyps] for hyps in want]
        np.testing.assert_allclose([h.score for hyps in got for h in hyps], [h.score for hyps in want for h in hyps],
                                   rtol=DEVICE_RTOL if device != "cpu" else 1e-7)


def test_bound_state_is_kept_as_device_values_and_reordered_through_the_host(transformer_export):
    """The step's fed-back cache comes back as OrtValues (not copied to numpy); beam reorders them via numpy."""
    runtime = Seq2Seq.load(transformer_export.path, provider="cpu", fused=False, io_binding=True)
    steps = runtime.token_steps
    ids, lengths = runtime.vocabularies["source"].encode_batch(TEXTS, add_eos=True)
    state = steps.encode(ids, lengths)
    assert all(isinstance(v, ort.OrtValue) for v in state.values())
    result = steps.step(np.ones(len(TEXTS), dtype=np.int64), state)
    assert isinstance(result.log_probs, np.ndarray)
    assert isinstance(result.state["past_keys"], ort.OrtValue) and result.state["past_keys"].shape()[3] == 1
    from runtime.search.step import select

    reordered = select(result.state, np.array([1, 0, 3, 2]), steps.batch_axes)
    np.testing.assert_array_equal(reordered["past_keys"][:, 0], result.state["past_keys"].numpy()[:, 1])


def _ones(session: ort.InferenceSession) -> dict[str, np.ndarray]:
    """A feed of ones for every input of `session`, each symbolic dimension 2."""
    kinds = {"tensor(float)": np.float32, "tensor(bool)": np.bool_, "tensor(int64)": np.int64}
    return {i.name: np.ones([d if isinstance(d, int) else 2 for d in i.shape], kinds[i.type])
            for i in session.get_inputs()}


def test_onnxruntime_failures_under_binding_are_input_errors(exports):
    runtime = Seq2Seq.load(exports["dot"].path, provider="cpu")
    encoder = BoundRunner(runtime._step, ["output"], "decoder_step.onnx", keep=set())
    with pytest.raises(InputError, match=r"decoder_step.onnx: the feed has no hidden, keys_t, values, source_mask; "):
        encoder({"decoder_input": np.zeros((1, 1, 3), np.float32)})
    feed = _ones(runtime._step)
    with pytest.raises(InputError, match=r"decoder_step.onnx: onnxruntime could not run on inputs of shapes"):
        encoder({**feed, "decoder_input": np.zeros((1, 1, 3), np.float32)})  # every input, one of a wrong shape


def test_a_plain_runner_calls_onnxruntimes_cpp_run_and_still_names_a_missing_input(exports):
    """SessionRunner skips the Python `run`'s checks (runtime.binding.direct_run): it calls the C++ run of an
    onnxruntime session, whose outputs are the public run's; a feed without an input the graph declares is still an
    InputError naming the graph and the input, and one of a wrong shape names the shapes. A session-like object
    without onnxruntime's inner session runs through its own `run`."""
    session = Seq2Seq.load(exports["dot"].path, provider="cpu")._step
    runner = SessionRunner(session, ["output"], "decoder_step.onnx")
    assert runner.direct == session._sess.run
    feed = _ones(session)
    np.testing.assert_array_equal(runner(feed)["output"], session.run(["output"], feed)[0])
    first = next(iter(feed))
    missing = dict(list(feed.items())[1:])
    with pytest.raises(InputError, match=rf"decoder_step.onnx: the feed has no {first}; the graph reads {first}, "):
        runner(missing)
    with pytest.raises(InputError, match=r"decoder_step.onnx: onnxruntime could not run on inputs of shapes"):
        runner({**feed, first: feed[first][..., :1]})  # every input, one of the wrong shape

    class Wrapped:  # a session behind a wrapper of the caller's, as tests or tools may pass
        def run(self, names, feed, options=None):
            return session.run(names, feed, options)

    wrapped = SessionRunner(Wrapped(), ["output"], "wrapped")
    assert wrapped.direct.__self__.__class__ is Wrapped
    np.testing.assert_array_equal(wrapped(feed)["output"], runner(feed)["output"])


def test_a_bound_runner_binds_through_onnxruntimes_cpp_objects_with_the_public_bindings_results(transformer_export):
    """BoundRunner binds and runs through the session's C++ objects (the Python IOBinding's wrappers and its run's
    `gpu_graph_id` lookup, a raised and caught C++ exception, cost ~60 us a call): the same outputs as the plain run,
    kept ones as OrtValues that feed the next call, numpy inputs that must be copied to be contiguous (read after the
    copy is bound) included. A session-like object without onnxruntime's inner session binds through its own
    `io_binding`, with the same results."""
    session = Seq2Seq.load(transformer_export.path, provider="cpu", fused=False)._step
    outputs = [o.name for o in session.get_outputs()]
    keep = {"present_keys", "present_values"}  # fed back as past_keys, past_values
    bound = BoundRunner(session, outputs, "decoder_step.onnx", keep)
    assert bound.inner is session._sess
    plain = SessionRunner(session, outputs, "decoder_step.onnx")
    feed = {name: np.asfortranarray(value + np.arange(value.size, dtype=value.dtype).reshape(value.shape) % 3)
            if value.dtype != np.bool_ else value for name, value in _ones(session).items()}
    assert not all(value.flags.c_contiguous for value in feed.values())

    class Wrapped:  # a session behind a wrapper of the caller's
        def __init__(self) -> None:
            self.get_providers, self.io_binding = session.get_providers, session.io_binding
            self.run, self.run_with_iobinding = session.run, session.run_with_iobinding

    wrapped = BoundRunner(Wrapped(), outputs, "wrapped", keep)
    assert wrapped.inner is None
    want = plain(feed)
    fed_back = {**feed, "past_keys": want["present_keys"], "past_values": want["present_values"]}
    want_next = plain(fed_back)
    for runner in (bound, wrapped):
        got = runner(feed)
        assert {name for name, value in got.items() if isinstance(value, ort.OrtValue)} == keep
        for name in outputs:
            np.testing.assert_array_equal(got[name].numpy() if name in keep else got[name], want[name])
        following = runner({**fed_back, "past_keys": got["present_keys"], "past_values": got["present_values"]})
        np.testing.assert_array_equal(following["log_probs"], want_next["log_probs"])


@pytest.mark.parametrize("bound", [False, True])
def test_a_failed_run_is_said_once_without_onnxruntimes_own_log_line(recurrent_export, capfd, bound):
    """A kernel that fails while the graph runs (here the embedding's Gather, given an id beyond the vocabulary) made
    onnxruntime log a red '[E:onnxruntime:...]' line to the process's stderr (fd 2) before it raised; the runner
    raises the failure as an InputError, so a service's log held it twice. Runs are made with quiet options
    (runtime.binding.QUIET), a watched run (cancel) with quiet options of its own."""
    session = open_session((recurrent_export.path / "encoder.onnx").read_bytes(), "cpu", 1, "encoder.onnx")
    outputs = [o.name for o in session.get_outputs()]
    runner = (BoundRunner(session, outputs, "encoder.onnx", keep=set()) if bound
              else SessionRunner(session, outputs, "encoder.onnx"))
    feed = {"source_ids": np.full((2, 3), 10**9, np.int64), "source_lengths": np.array([3, 3], np.int64)}
    capfd.readouterr()
    for cancel in (None, lambda: False):
        with pytest.raises(InputError, match=r"encoder.onnx: onnxruntime could not run .*indices element out of") \
                as refused:
            runner(feed, cancel)
        assert not str(refused.value).endswith(RUN_FAILED_ADVICE)  # memory's advice, for a failure of another kind
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize("value", [1, "yes", 0.0])
def test_io_binding_must_be_a_bool_or_none(exports, value):
    with pytest.raises(InputError, match="io_binding: expected True or False or None"):
        Seq2Seq.load(exports["dot"].path, io_binding=value)


def test_io_binding_defaults_to_off_on_the_cpu(exports):
    assert not Seq2Seq.load(exports["dot"].path, provider="cpu").io_binding


@pytest.mark.parametrize("device_id", [-1, 1.5, True, "0"])
def test_a_bad_device_id_is_refused_by_name_before_loading(exports, device_id):
    with pytest.raises(InputError, match="device_id: expected an int from 0 to 2147483647"):
        Seq2Seq.load(exports["dot"].path, device_id=device_id)
