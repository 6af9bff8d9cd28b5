"""A declared model (export.adapter) made exportable: probed in PyTorch to learn and check its state's shapes,
its two functions wrapped as modules with flat tensor arguments, and its contract (runtime.declared) built.

The probe runs `encode` on two batches (3 and 2 sources, of two widths unless the model fixes its source length)
and `step` twice, and reads every state tensor's dims from what changed: the declared batch axis must be the
batch, an axis that follows the source width is `source_len`, a declared growing axis is `past_len`, every other
axis is a fixed size. Anything that does not fit the declaration is an AdapterError naming the tensor and axis."""
from __future__ import annotations

import contextlib
import os
import re
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
import torch.nn.functional as F

from runtime.contract import BATCH, DECODER_STEP_FILE, ENCODER_FILE, PAST_LEN, PRESENT_LEN, SOURCE_LEN, Dims
from runtime.declared import SOURCE_INPUTS, Sources, TokenContract
from runtime.errors import brief, one_line
from runtime.spec import ModelSpec
from runtime.vocab import Vocabulary

from .adapter import AdapterError, Seq2SeqAdapter

PROBE_BATCHES = (3, 2)
PROBE_WIDTHS = (5, 7)  # source widths (tokens, specials included) when the model does not fix one
RESERVED = {"previous_tokens", "log_probs", "alphas", *SOURCE_INPUTS}


def out_name(state: str) -> str:
    """The step output that feeds state `state` back."""
    return f"{state}_out"


def sources_of(adapter: Seq2SeqAdapter) -> Sources:
    return Sources(add_bos=adapter.source_bos, add_eos=adapter.source_eos, reverse=adapter.reverse_source,
                   fixed_len=adapter.fixed_source_len, max_len=adapter.max_source_len)


def example_sources(adapter: Seq2SeqAdapter, n: int, width: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random sources (n, width) for a declared model: `random_sources` by its own rules and vocabulary."""
    return random_sources(sources_of(adapter), adapter.source_vocab, n, width, seed)


def random_sources(rules: Sources, vocab: Vocabulary, n: int, width: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random right-padded ids (n, width) of the vocabulary's own tokens, laid out as the runtime lays out a batch
    of texts (bos, tokens, eos; the filler after; the fixed width if the model has one); row 0 is full, the others
    shorter."""
    ids = vocab.ids
    regular = np.array(sorted(set(range(len(vocab))) - ids.ids))
    if regular.size == 0:
        raise AdapterError(f"the source vocabulary holds only special ids {sorted(ids.ids)}: nothing to encode")
    rng = np.random.default_rng(seed)
    longest = max(width - int(rules.add_bos) - int(rules.add_eos), 1)
    out = np.full((n, width), ids.filler, np.int64)
    lengths = np.zeros(n, np.int64)
    for row in range(n):
        k = longest if row == 0 else int(rng.integers(1, longest + 1))
        row_ids = [ids.bos] * rules.add_bos + list(rng.choice(regular, k)) + [ids.eos] * rules.add_eos
        out[row, :len(row_ids)] = row_ids
        lengths[row] = len(row_ids)
    return out, lengths


@contextlib.contextmanager
def quiet_native_stdout() -> Iterator[None]:
    """File descriptor 1 to /dev/null for the block: when an operator cannot be exported, torch.onnx's C++ side
    prints the whole TorchScript graph there (70 lines and more) before raising; the error names what failed. For
    the export's duration only (it is not a server's concern)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


class Tracing:
    """Which of the adapter's modules is running (forward hooks on every submodule), so an error raised while
    probing or tracing names the innermost one."""

    def __init__(self, adapter: Seq2SeqAdapter) -> None:
        self.modules = [(f"modules[{i}]{'.' + name if name else ''} ({type(m).__name__})", m)
                        for i, root in enumerate(adapter.modules) for name, m in root.named_modules()]
        self.stack: list[str] = []

    @contextlib.contextmanager
    def watch(self) -> Iterator[None]:
        handles = []
        for label, module in self.modules:
            handles.append(module.register_forward_pre_hook(lambda m, a, label=label: self.stack.append(label)))
            handles.append(module.register_forward_hook(lambda m, a, o: self.stack.pop() and None))
        self.stack.clear()
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def where(self) -> str:
        return f" in {self.stack[-1]}" if self.stack else ""


def untraceable(adapter: Seq2SeqAdapter, module: torch.nn.Module, args: tuple, exc: Exception,
                where: str) -> str:
    """Where tracing `module` broke: the module running when the tracer raised, or, for an operator the exporter
    cannot convert (found after tracing), the module that runs it: the scope a TorchScript trace records for it
    (the wrapper holds the adapter's modules as `parts`: parts.1.gru is modules[1].gru)."""
    op = re.search(r"operator '([\w:.]+)'", str(exc))
    if where or op is None:
        return where
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's warnings about Python values: not what is wrong
            graph = torch.jit.trace(module, args, check_trace=False, strict=False).inlined_graph
    except Exception:  # only looking: the export's own error is what is reported
        return ""
    scopes = [node.scopeName() for node in graph.nodes() if node.kind() == op.group(1)]
    path = re.search(r"parts\.(\d+)((?:\.[\w]+)*)$", scopes[0].split("/")[-1].replace("__module.", "")) \
        if scopes else None
    if path is None:
        return ""
    root = adapter.modules[int(path.group(1))]
    inner = path.group(2).lstrip(".")
    found = root.get_submodule(inner) if inner else root
    return f" in modules[{path.group(1)}]{'.' + inner if inner else ''} ({type(found).__name__})"


def run_declared(adapter: Seq2SeqAdapter, what: str, call: Any, *args: Any) -> Any:
    """Call the adapter's encode or step (eager, no grad); a failure inside names the module it happened in."""
    tracing = Tracing(adapter)
    try:
        with torch.no_grad(), tracing.watch():
            return call(*args)
    except AdapterError:
        raise
    except Exception as exc:  # the user's code: any error, reported with where it happened
        raise AdapterError(f"{what} failed{tracing.where()}: {type(exc).__name__}: {one_line(exc)}") from exc


def _tensor_dict(value: Any, what: str) -> dict[str, torch.Tensor]:
    if not isinstance(value, dict) or not all(isinstance(v, torch.Tensor) for v in value.values()):
        raise AdapterError(f"{what} must be a dict of name: torch.Tensor, got {_what(value)}")
    return value


def _what(value: Any) -> str:
    """What a value is, without printing tensors' numbers: types and shapes."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor {tuple(value.shape)}"
    if isinstance(value, dict):
        return "a dict of " + ", ".join(f"{k!r}: {_what(v)}" for k, v in list(value.items())[:6])
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of " + ", ".join(_what(v) for v in value[:6])
    return brief(value)


def check_encoded(adapter: Seq2SeqAdapter, state: dict[str, torch.Tensor], n: int) -> None:
    """Exactly the declared names, each a tensor whose declared batch axis holds the n sources."""
    missing, extra = sorted(set(adapter.state) - set(state)), sorted(set(state) - set(adapter.state))
    if missing or extra:
        raise AdapterError(f"encode returned {sorted(state)}; the declaration names {sorted(adapter.state)} "
                           f"(missing {missing}, undeclared {extra}): declare every state tensor, and only those")
    for name, decl in adapter.state.items():
        shape = tuple(state[name].shape)
        if decl.batch_axis >= len(shape) or shape[decl.batch_axis] != n:
            holds = [axis for axis, size in enumerate(shape) if size == n]
            hint = f"; the batch is on axis {holds[0]}" if len(holds) == 1 else ""
            raise AdapterError(f"state {name!r}: batch_axis {decl.batch_axis} does not hold the batch of {n} "
                               f"sources (its shape is {shape}){hint}")
        if decl.grows is not None and decl.grows >= len(shape):
            raise AdapterError(f"state {name!r}: grows={decl.grows} is not an axis of its shape {shape}")


def state_dims(adapter: Seq2SeqAdapter, probes: list[tuple[int, int, dict[str, torch.Tensor]]]) -> dict[str, Dims]:
    """Each state tensor's dims, from two probes (batch, width, state): batch, source_len, past_len, or a size."""
    (n1, w1, a), (n2, w2, b) = probes
    dims: dict[str, Dims] = {}
    for name, decl in adapter.state.items():
        first, second = tuple(a[name].shape), tuple(b[name].shape)
        if len(first) != len(second):
            raise AdapterError(f"state {name!r} has rank {len(first)} for one batch and {len(second)} for another")
        out: Dims = []
        for axis, (x, y) in enumerate(zip(first, second)):
            if axis == decl.batch_axis:
                out.append(BATCH)
            elif axis == decl.grows:
                if x != y:
                    raise AdapterError(f"state {name!r}: its growing axis {axis} starts at {x} for one batch and {y} "
                                       "for another; it must start at one size")
                out.append(x)
            elif (x, y) == (w1, w2) and w1 != w2:
                out.append(SOURCE_LEN)
            elif x != y:
                raise AdapterError(f"state {name!r}: axis {axis} is {x} for {n1} sources of {w1} tokens and {y} for "
                                   f"{n2} of {w2}; only the batch axis and the source length may vary")
            else:
                out.append(x)
        dims[name] = out
    return dims


@dataclass(frozen=True)
class Adapted:
    """A probed adapter: what export, parity and the manifest work from."""

    adapter: Seq2SeqAdapter
    contract: TokenContract
    spec: ModelSpec


def check_step(adapter: Seq2SeqAdapter, state: dict[str, torch.Tensor], out: Any, n: int,
               width: int) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor | None]:
    """(scores (n, V), the changed state, attention (n, width) or None), each as declared."""
    if not isinstance(out, tuple) or len(out) not in (2, 3):
        raise AdapterError(f"step must return (scores, next_state) or (scores, next_state, attention), got "
                           f"{_what(out)}")
    scores, changed, attention = (*out, None)[:3]
    size = len(adapter.target_vocab)
    if not isinstance(scores, torch.Tensor) or tuple(scores.shape) != (n, size) or not scores.is_floating_point():
        got = f"{scores.dtype} {tuple(scores.shape)}" if isinstance(scores, torch.Tensor) else _what(scores)
        raise AdapterError(f"step's scores must be a float tensor (batch {n}, target vocabulary {size}), got {got}")
    if torch.isnan(scores).any():
        raise AdapterError(f"step's scores hold NaN (for {int(torch.isnan(scores).any(-1).sum())} of {n} rows); a "
                           "model that yields NaN cannot be decoded")
    changed = _tensor_dict(changed, "step's next state")
    missing = sorted(set(adapter.changing) - set(changed))
    extra = sorted(set(changed) - set(adapter.state))
    if missing or extra:
        raise AdapterError(f"step's next state holds {sorted(changed)}; it must hold every state tensor declared "
                           f"changes=True {adapter.changing} (missing {missing}) and no undeclared one ({extra})")
    for name in sorted(set(changed) - set(adapter.changing)):  # returned, but declared read-only
        if changed[name].shape != state[name].shape or not torch.equal(changed[name], state[name]):
            raise AdapterError(f"step changed {name!r}, which is declared changes=False (read unchanged by every "
                               f"step); declare it State(changes=True), or leave it as it was")
    for name in adapter.changing:
        want = list(state[name].shape)
        grows = adapter.state[name].grows
        if grows is not None:
            want[grows] += 1
        if list(changed[name].shape) != want:
            why = f" (axis {grows} grows by one per step)" if grows is not None else ""
            raise AdapterError(f"step output {name!r} has shape {tuple(changed[name].shape)}, but it feeds back as "
                               f"{name!r}, which is {tuple(state[name].shape)}: expected {tuple(want)}{why}")
        if changed[name].dtype != state[name].dtype:
            raise AdapterError(f"step output {name!r} is {changed[name].dtype}, but {name!r} is "
                               f"{state[name].dtype}; a state keeps its dtype")
    if attention is not None and (not isinstance(attention, torch.Tensor) or tuple(attention.shape) != (n, width)):
        got = tuple(attention.shape) if isinstance(attention, torch.Tensor) else _what(attention)
        raise AdapterError(f"step's attention must be (batch {n}, source length {width}) or None, got {got}")
    return scores, changed, attention


def probe(adapter: Seq2SeqAdapter) -> Adapted:
    """Run the adapter on example batches, check it against its declaration, and build its contract and spec."""
    clash = sorted(set(adapter.state) & (RESERVED | {out_name(s) for s in adapter.state}))
    if clash:
        raise AdapterError(f"state names {clash} are taken by the graphs' own inputs and outputs ({sorted(RESERVED)}, "
                           "and NAME_out for each state); rename them")
    adapter.train_mode_off()
    fixed = adapter.fixed_source_len
    widths = (fixed, fixed) if fixed is not None else PROBE_WIDTHS
    probes = []
    for n, width, seed in zip(PROBE_BATCHES, widths, (0, 1)):
        ids, lengths = (torch.from_numpy(a) for a in example_sources(adapter, n, width, seed))
        state = _tensor_dict(run_declared(adapter, "encode", adapter.encode, ids, lengths), "encode")
        check_encoded(adapter, state, n)
        probes.append((n, width, state))
    dims = state_dims(adapter, probes)
    n, width, state = probes[0]
    tokens = torch.full((n,), adapter.target_vocab.ids.bos, dtype=torch.int64)
    for _ in range(2):  # two steps: shapes hold, growing axes grow
        out = run_declared(adapter, "step", adapter.step, tokens, dict(state))
        scores, changed, alphas = check_step(adapter, state, out, n, width)
        state, tokens = {**state, **{name: changed[name] for name in adapter.changing}}, scores.argmax(-1)
    return Adapted(adapter, build_contract(adapter, dims, alphas is not None), declared_spec(adapter))


def build_contract(adapter: Seq2SeqAdapter, dims: dict[str, Dims], attention: bool) -> TokenContract:
    """The contract of a probed adapter: its state by name, each changing entry fed back from NAME_out."""
    length = SOURCE_LEN if adapter.fixed_source_len is None else adapter.fixed_source_len
    step_state = {name: [PAST_LEN if axis == adapter.state[name].grows else d for axis, d in enumerate(d_list)]
                  for name, d_list in dims.items()}
    outputs: dict[str, Dims] = {"log_probs": [BATCH, len(adapter.target_vocab)]}
    outputs.update({out_name(name): [PRESENT_LEN if d == PAST_LEN else d for d in step_state[name]]
                    for name in adapter.changing})
    if attention:
        outputs["alphas"] = [BATCH, length]
    return TokenContract(
        encoder={"inputs": {"source_ids": [BATCH, length], "source_lengths": [BATCH]}, "outputs": dims},
        step={"inputs": {"previous_tokens": [BATCH], **step_state}, "outputs": outputs},
        feedback={out_name(name): name for name in adapter.changing}, specials=adapter.target_vocab.ids,
        sources=sources_of(adapter), never=tuple(adapter.never_emit), max_decoding_length=adapter.output_limit)


def declared_spec(adapter: Seq2SeqAdapter) -> ModelSpec:
    return ModelSpec(kind="tokens", arch="declared", source_vocab_size=len(adapter.source_vocab),
                     target_vocab_size=len(adapter.target_vocab),
                     input_len=adapter.fixed_source_len or adapter.max_source_len,
                     target_len=adapter.max_decoding_length)


class AdaptedEncoder(torch.nn.Module):
    """source_ids, source_lengths -> the declared state tensors, in declaration order."""

    def __init__(self, adapter: Seq2SeqAdapter) -> None:
        super().__init__()
        self.parts = torch.nn.ModuleList(adapter.modules)  # the weights, as this module's own
        self.adapter = adapter
        self.output_names = list(adapter.state)

    def forward(self, source_ids: torch.Tensor, source_lengths: torch.Tensor) -> tuple[torch.Tensor, ...]:
        state = self.adapter.encode(source_ids, source_lengths)
        return tuple(state[name] for name in self.output_names)


class AdaptedStep(torch.nn.Module):
    """previous_tokens and the state -> log_probs (log-softmax of logits; never-emitted ids at -inf), each changing
    state tensor's next value, and the attention when the model gives it."""

    def __init__(self, adapter: Seq2SeqAdapter, attention: bool) -> None:
        super().__init__()
        self.parts = torch.nn.ModuleList(adapter.modules)
        self.adapter, self.attention = adapter, attention
        self.state_names = list(adapter.state)
        self.register_buffer("never", torch.tensor(sorted(adapter.never_emit), dtype=torch.int64), persistent=False)

    def forward(self, previous_tokens: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        scores, changed, attention = (*self.adapter.step(previous_tokens, dict(zip(self.state_names, state))),
                                      None)[:3]
        log_probs = F.log_softmax(scores, dim=-1) if self.adapter.scores == "logits" else scores
        if self.never.numel():
            log_probs = log_probs.index_fill(1, self.never, float("-inf"))
        return (log_probs, *(changed[name] for name in self.adapter.changing),
                *((attention,) if self.attention else ()))


OTHER_BATCH, OTHER_WIDTH = 5, 9  # sizes a graph is run at after export, other than those it was traced at


def check_other_sizes(adapted: Adapted, out_dir: Path) -> None:
    """Run the written encoder and step in onnxruntime at another batch size (and source width) than traced:
    a size the tracer baked in fails here, or gives other shapes than declared, and is named."""
    adapter, contract = adapted.adapter, adapted.contract
    width = adapter.fixed_source_len or OTHER_WIDTH
    ids, lengths = example_sources(adapter, OTHER_BATCH, width, seed=2)
    sizes = {BATCH: OTHER_BATCH, SOURCE_LEN: width}
    options = ort.SessionOptions()
    options.log_severity_level = 4  # its own red log line of the failure would come before ours, which says it
    sessions = {name: ort.InferenceSession(str(out_dir / name), options, providers=["CPUExecutionProvider"])
                for name in (ENCODER_FILE, DECODER_STEP_FILE)}
    what = f"batch {OTHER_BATCH} and {width}-token sources"
    state = _run(adapter, sessions[ENCODER_FILE], {"source_ids": ids, "source_lengths": lengths}, ENCODER_FILE, what)
    _check_shapes(state, contract.encoder["outputs"], sizes, ENCODER_FILE, what)
    tokens = np.full(OTHER_BATCH, contract.specials.bos, np.int64)
    produced = _run(adapter, sessions[DECODER_STEP_FILE], {"previous_tokens": tokens, **state}, DECODER_STEP_FILE,
                    what)
    grown = {PRESENT_LEN: None}  # a growing axis: one more than its input's, checked by the contract's feedback
    _check_shapes(produced, contract.step["outputs"], {**sizes, **grown}, DECODER_STEP_FILE, what)


MHA_HINT = ("; this model uses nn.MultiheadAttention, which (as nn.Transformer, which uses it) bakes its sequence "
            "lengths into a traced graph: give it fixed lengths (fixed_source_len=..., and a fixed-size output buffer "
            "with output_limit=...; see the README's Bring your own model)")


def _run(adapter: Seq2SeqAdapter, session: Any, feed: dict[str, np.ndarray], name: str,
         what: str) -> dict[str, np.ndarray]:
    try:
        return dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
    except Exception as exc:  # onnxruntime's own errors
        text = one_line(exc)
        node = re.search(r"running (\w+) node\. Name:'([^']*)'", text)
        shapes = re.search(r"Input shape:\{[^}]*\}, requested shape:\{[^}]*\}", text)
        part = re.match(r"/parts\.(\d+)/", node.group(2)) if node else None
        where = f" in modules[{part.group(1)}]" if part else ""
        said = (f"its {node.group(1)} node {node.group(2)!r}{where} fails{': ' + shapes.group(0) if shapes else ''}"
                if node else text[:300])
        mha = any(isinstance(m, torch.nn.MultiheadAttention) for root in adapter.modules for m in root.modules())
        raise AdapterError(f"{name} fails at {what}, other sizes than it was traced at ({said}): a size was baked "
                           "into the graph; compute shapes from tensors (x.shape[0]), not Python ints"
                           f"{MHA_HINT if mha else ''}") from None


def _check_shapes(values: dict[str, np.ndarray], declared: dict[str, Dims], sizes: dict[str, int | None],
                  name: str, what: str) -> None:
    for out, dims in declared.items():
        want = [sizes.get(d, d) if isinstance(d, str) else d for d in dims]
        got = list(values[out].shape)
        if len(got) != len(want) or any(w is not None and w != g for w, g in zip(want, got)):
            raise AdapterError(f"{name} output {out!r} is {tuple(got)} at {what}, declared {dims}: a size was "
                               "baked into the graph; compute shapes from tensors (x.shape[0]), not Python ints")
