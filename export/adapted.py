"""A declared model (export.adapter) made exportable: probed in PyTorch to learn and check its state's shapes, and
its contract (runtime.declared) built (its two functions as modules with flat tensor arguments:
export.adapted_modules).

The probe runs `encode` on two batches (3 and 2 sources, of two widths unless the model fixes its source length)
and `step` twice (the first call of each repeated: the same inputs must give the same outputs), and reads every
state tensor's dims from what changed: the declared batch axis must be the batch, an axis that follows the source
width is `source_len`, a declared growing axis is `past_len`, every other axis is a fixed size. Then each source of
the first batch is encoded and stepped once alone, at the batch's width and at its own: it must give what it gave
within the batch (a model whose rows read one another or the padding passes parity, which runs PyTorch on the same
batch, and decodes a text differently beside others); a source of max_source_len tokens must encode and step once,
and a source must decode PROBE_OUTPUT_STEPS tokens on (output_limit, if fewer; max_decoding_length, if more).
Anything that does not fit the declaration is an AdapterError naming the tensor and axis (what encode and step
return is checked by export.probe_checks, each source alone by export.probe_rows)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from runtime.contract import BATCH, PAST_LEN, PRESENT_LEN, SOURCE_LEN, Dims
from runtime.declared import SOURCE_INPUTS, Sources, TokenContract
from runtime.spec import ModelSpec
from runtime.vocab import Vocabulary

from .adapter import AdapterError, Seq2SeqAdapter
from .probe_checks import check_encoded, check_step, tensor_dict
from .tracing import check_deterministic, run_declared
from .weights import check_declared_weights

PROBE_BATCHES = (3, 2)
PROBE_WIDTHS = (5, 7)  # source widths (tokens, specials included) when the model does not fix one
# the step graph's and the greedy loop graph's own names (export.tokens.loop: its inputs max_length and min_length, its
# outputs tokens and token_log_probs, its carried finished); besides these, NAME_out and NAME_narrow of each state
RESERVED = {"previous_tokens", "log_probs", "alphas", "max_length", "min_length", "tokens", "token_log_probs",
            "finished", *SOURCE_INPUTS}


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


def probe(adapter: Seq2SeqAdapter) -> Adapted:
    """Run the adapter on example batches, check it against its declaration, and build its contract and spec."""
    derived = {made for s in adapter.state for made in (out_name(s), f"{s}_narrow")}
    clash = sorted(set(adapter.state) & (RESERVED | derived))
    if clash:
        raise AdapterError(f"state names {clash} are taken by the graphs' own inputs and outputs ({sorted(RESERVED)}, "
                           "and NAME_out and NAME_narrow for each state NAME); rename them")
    adapter.train_mode_off()
    check_declared_weights(adapter)
    fixed = adapter.fixed_source_len
    widths = (fixed, fixed) if fixed is not None else PROBE_WIDTHS
    probes = []
    for n, width, seed in zip(PROBE_BATCHES, widths, (0, 1)):
        ids, lengths = (torch.from_numpy(a) for a in example_sources(adapter, n, width, seed))
        state = tensor_dict(run_declared(adapter, "encode", adapter.encode, ids, lengths), "what encode returns")
        check_encoded(adapter, state, n)
        if seed == 0:  # the same sources again: the same state, or the graphs could not match PyTorch
            again = tensor_dict(run_declared(adapter, "encode", adapter.encode, ids, lengths), "what encode returns")
            check_deterministic("encode", state, again)
        probes.append((n, width, state))
    dims = state_dims(adapter, probes)
    n, width, state = probes[0]
    tokens = torch.full((n,), adapter.target_vocab.ids.bos, dtype=torch.int64)
    attends = []
    for t in range(2):  # two steps: shapes hold, growing axes grow
        out = run_declared(adapter, "step", adapter.step, tokens, dict(state))
        scores, changed, alphas = check_step(adapter, state, out, n, width)
        attends.append(alphas is not None)
        if len(set(attends)) > 1:
            raise AdapterError(f"step returned {'no ' if attends[1] else ''}attention from bos and "
                               f"{'' if attends[1] else 'none '}at the next step: return "
                               "(scores, next_state, attention) at every step, or (scores, next_state) at every step")
        if t == 0:
            repeated = check_step(adapter, state, run_declared(adapter, "step", adapter.step, tokens, dict(state)), n,
                                  width)
            check_deterministic("step", {"scores": scores, **changed}, {"scores": repeated[0], **repeated[1]})
        state, tokens = {**state, **{name: changed[name] for name in adapter.changing}}, scores.argmax(-1)
    n, width, state = probes[0]  # deterministic: its sources alone give what they gave in the batch, or it differs
    from .probe_rows import check_alone, check_long_output, check_longest  # they use this module's checks

    check_alone(adapter, dims, *(torch.from_numpy(a) for a in example_sources(adapter, n, width, 0)), state)
    check_longest(adapter)
    check_long_output(adapter)
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
