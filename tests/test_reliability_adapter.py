"""The reliability table, declared-model rows: a bad declaration (`export --adapter`, `export_model(adapter)`,
`verify --adapter`) is refused with exit code 1 or 2 and one `Error:` line naming what is wrong, and nothing is
written. The declarations live in a module of the workspace, `bad_models.py`, as a user's would."""
from __future__ import annotations

import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from export.adapter import State

from support.reliability import (
    BAD_INPUT,
    USAGE,
    Case,
    assert_api_refused,
    assert_refused,
    case,
    workspace_fixtures,
    write,
)

BAD_MODELS = '''
"""Declarations gone wrong, one per function (tests/test_reliability_adapter.py)."""
import copy
import sys
from dataclasses import replace

import torch
from torch import nn

from export.adapter import State
from support.foreign import trained


def good():
    return trained("luong").adapter()


def wrong_batch_axis():
    adapter = good()
    return replace(adapter, state={**adapter.state, "h": State(batch_axis=1)})


def undeclared_state():
    adapter, model = good(), trained("luong")
    return replace(adapter, encode=lambda ids, lengths: {**model.encode(ids, lengths), "extra": ids})


def wrong_step_shape():
    adapter, model = good(), trained("luong")

    def step(tokens, state):
        scores, changed, attention = model.step(tokens, state)
        return scores, {**changed, "feed": changed["feed"][:, :5]}, attention
    return replace(adapter, step=step)


def wrong_scores():
    adapter, model = good(), trained("luong")

    def step(tokens, state):
        scores, changed, attention = model.step(tokens, state)
        return scores[:, :5], changed, attention
    return replace(adapter, step=step)


def growing_but_not_grown():
    adapter = good()
    return replace(adapter, state={**adapter.state, "h": State(batch_axis=0, grows=1)})


def _h_named(name):
    adapter, model = good(), trained("luong")

    def encode(ids, lengths):
        state = model.encode(ids, lengths)
        return {**state, name: state.pop("h")}

    def step(tokens, state):
        scores, changed, attention = model.step(tokens, {**state, "h": state[name]})
        return scores, {**{k: v for k, v in changed.items() if k != "h"}, name: changed["h"]}, attention
    return replace(adapter, encode=encode, step=step,
                   state={name: State(0), **{k: v for k, v in adapter.state.items() if k != "h"}})


def reserved_name():
    return _h_named("log_probs")


def reserved_loop_input():  # the greedy loop graph's own input: onnx's shape inference failed in a traceback
    return _h_named("max_length")


def reserved_loop_carry():  # the loop's own carried flags: "not in SSA form", a traceback
    return _h_named("finished")


def reserved_loop_output():  # the loop's output: "'tokens' dim 'decode_len' was fixed", far from the cause
    return _h_named("tokens")


def derived_name():  # a state named as another's first value narrowed for the loop
    return _h_named("c_narrow")


def encode_rows_read_one_another():
    adapter, model = good(), trained("luong")

    def encode(ids, lengths):
        state = model.encode(ids, lengths)
        memory = state["memory"]
        return {**state, "memory": memory - memory.mean(0, keepdim=True)}  # a batch's mean: the same in PyTorch
    return replace(adapter, encode=encode)


def reads_the_padding():
    adapter, model = good(), trained("luong")

    def encode(ids, lengths):  # the LSTM run over the pads, unpacked: exported and verified, batches decoded apart
        out, (h, c) = model.encoder(model.src_emb(ids))
        mask = torch.arange(ids.shape[1])[None, :] < lengths[:, None]
        return {"h": h[0], "c": c[0], "feed": torch.zeros_like(h[0]), "memory": out, "mask": mask}
    return replace(adapter, encode=encode)


def attention_over_the_padding():
    adapter, model = good(), trained("luong")

    def encode(ids, lengths):  # every position unmasked: the step attends to the pads
        state = model.encode(ids, lengths)
        return {**state, "mask": torch.ones_like(state["mask"])}
    return replace(adapter, encode=encode)


def baked_length():
    """nn.Transformer over variable-length sources: nn.MultiheadAttention bakes the traced length in."""
    adapter = trained("transformer").adapter()
    return replace(adapter, fixed_source_len=None, max_source_len=10)  # within its positional table


class Spectral(nn.Module):
    def forward(self, x):
        return torch.fft.fft(x).real


def untraceable():
    adapter, model = good(), trained("luong")
    spectral = Spectral()

    def step(tokens, state):
        scores, changed, attention = model.step(tokens, state)
        return scores, {**changed, "feed": spectral(changed["feed"])}, attention
    return replace(adapter, step=step, modules=(model, spectral))


def untraceable_outside_modules():
    adapter, model = good(), trained("luong")

    def step(tokens, state):
        scores, changed, attention = model.step(tokens, state)
        return scores, {**changed, "feed": torch.fft.ifft(changed["feed"]).real}, attention
    return replace(adapter, step=step)


class Broken(nn.Module):
    def forward(self, state):
        return state["cell"]


def raises_in_step():
    adapter, model = good(), trained("luong")
    broken = Broken()

    def step(tokens, state):
        broken(state)
        return model.step(tokens, state)
    return replace(adapter, step=step, modules=(model, broken))


def exits_in_step():
    adapter, model = good(), trained("luong")

    def step(tokens, state):
        sys.exit("no more steps")  # a script's exit inside the model's code
    return replace(adapter, step=step)


def changes_a_constant():
    adapter, model = good(), trained("luong")

    def step(tokens, state):
        scores, changed, attention = model.step(tokens, state)
        return scores, {**changed, "memory": state["memory"] * 2}, attention
    return replace(adapter, step=step)


def nan_scores():
    adapter, model = good(), trained("luong")

    def step(tokens, state):
        scores, changed, attention = model.step(tokens, state)
        return scores * float("nan"), changed, attention
    return replace(adapter, step=step)


def wrong_reference():
    adapter, model = good(), trained("luong")
    return replace(adapter, reference=lambda ids, lengths, n: [row[::-1] for row in model.greedy(ids, lengths, n)])


def grows_undeclared():
    adapter, model = good(), trained("luong")

    def encode(ids, lengths):
        return {**model.encode(ids, lengths), "past": torch.zeros(ids.shape[0], 0, 4)}

    def step(tokens, state):
        scores, changed, attention = model.step(tokens, state)
        grown = torch.cat([state["past"], torch.ones(tokens.shape[0], 1, 4)], dim=1)
        return scores, {**changed, "past": grown}, attention
    return replace(adapter, encode=encode, step=step, state={**adapter.state, "past": State(batch_axis=0)})


def _scores_as(change, **declared):
    """The good model with its step's scores changed by change(scores, tokens)."""
    adapter, model = good(), trained("luong")

    def step(tokens, state):
        scores, changed, attention = model.step(tokens, state)
        return change(scores, tokens), changed, attention
    return replace(adapter, step=step, **declared)


def float64_scores():
    return _scores_as(lambda scores, tokens: scores.double())


def logits_declared_log_probs():
    return replace(good(), scores="log_probs")  # its step returns logits


def masked_after_log_softmax():
    return _scores_as(lambda scores, tokens: torch.log_softmax(scores, dim=-1).masked_fill(
        tokens[:, None] == torch.arange(12), float("-inf")), scores="log_probs")


def attention_at_the_first_step_only():
    adapter, model = good(), trained("luong")

    def step(tokens, state):
        scores, changed, attention = model.step(tokens, state)
        return (scores, changed, attention) if bool((tokens == 2).all()) else (scores, changed)
    return replace(adapter, step=step)


def numpy_scores():
    return _scores_as(lambda scores, tokens: scores.numpy())


def list_scores():
    return _scores_as(lambda scores, tokens: scores.tolist())


def a_scalar_state():
    adapter, model = good(), trained("luong")
    return replace(adapter, encode=lambda ids, lengths: {**model.encode(ids, lengths), "t": torch.tensor(0)},
                   state={**adapter.state, "t": State(0, changes=False)})


def probabilities_declared_log_probs():
    adapter, model = good(), trained("luong")

    def step(tokens, state):
        scores, changed, attention = model.step(tokens, state)
        return torch.softmax(scores, dim=-1), changed, attention  # probabilities, not their log
    return replace(adapter, step=step, scores="log_probs")


def tuple_state():
    adapter, model = good(), trained("luong")

    def encode(ids, lengths):
        state = model.encode(ids, lengths)
        return {**state, "hc": (state["h"], state["h"])}  # an LSTM's (h, c), as nn.LSTM returns it
    return replace(adapter, encode=encode)


def python_counter():
    adapter, model = good(), trained("luong")
    calls = {"n": 0}

    def step(tokens, state):
        calls["n"] += 1  # the position kept outside the declared state
        scores, changed, attention = model.step(tokens, state)
        return scores + calls["n"], changed, attention
    return replace(adapter, step=step)


def width_in_a_python_int():
    adapter, model = good(), trained("luong")

    def encode(ids, lengths):
        state = model.encode(ids, lengths)
        width = int(ids.shape[1])  # a Python int: the trace keeps the example's width as a constant
        return {**state, "memory": state["memory"] * (width / 8.0)}
    return replace(adapter, encode=encode)


def rows_read_one_another():
    adapter, model = good(), trained("luong")

    def step(tokens, state):
        scores, changed, attention = model.step(tokens, state)
        h = changed["h"]
        return scores, {**changed, "h": h + h.mean(0, keepdim=True)}, attention  # each row reads the batch's mean
    return replace(adapter, step=step)


def branch_on_the_tokens():
    adapter, model = good(), trained("luong")

    def step(tokens, state):
        scores, changed, attention = model.step(tokens, state)
        if bool((tokens > 3).all()):  # a branch on the tokens' values: the trace keeps the branch its example took
            scores = scores * 0.5
        return scores, changed, attention
    return replace(adapter, step=step)


def loop_over_the_width():
    adapter, model = good(), trained("luong")

    def encode(ids, lengths):
        state = model.encode(ids, lengths)
        pooled = sum(state["memory"][:, i] for i in range(ids.shape[1]))  # unrolled at the traced width
        return {**state, "h": state["h"] + 0.0 * pooled}
    return replace(adapter, encode=encode)


def ids_beyond_the_embedding():
    adapter, model = good(), trained("luong")
    return replace(adapter, encode=lambda ids, lengths: model.encode(ids + 1000, lengths))  # as a longer vocabulary


def few_positions():
    adapter, model = good(), trained("luong")
    table = torch.zeros(16, 20)  # 16 positions, under the default max_source_len of 256

    def encode(ids, lengths):
        state = model.encode(ids, lengths)
        return {**state, "memory": state["memory"] + table[torch.arange(ids.shape[1])]}
    return replace(adapter, encode=encode)


def few_target_positions():
    adapter, model = good(), trained("luong")
    positions = nn.Embedding(40, 1)  # 40 target positions; no output_limit declared
    nn.init.zeros_(positions.weight)

    def step(tokens, state):
        scores, changed, attention = model.step(tokens, state)
        return scores + positions(state["t"]), {**changed, "t": state["t"] + 1}, attention
    return replace(adapter, step=step, encode=lambda ids, lengths: {**model.encode(ids, lengths),
                                                                    "t": torch.zeros_like(lengths)},
                   state={**adapter.state, "t": State(0)}, modules=[model, positions])


def random_step():
    adapter, model = good(), trained("luong")

    def step(tokens, state):
        scores, changed, attention = model.step(tokens, state)
        return scores + 0.1 * torch.randn_like(scores), changed, attention
    return replace(adapter, step=step)


def float64_model():
    return copy.deepcopy(trained("luong")).double().adapter()


def infinite_weight():  # a saturating gate kept the outputs finite: the graphs were written with it
    model = copy.deepcopy(trained("luong"))
    with torch.no_grad():
        model.src_emb.weight[3, 5] = float("inf")
    return model.adapter()


def nan_weight():  # the step's scores were blamed, not the weight
    model = copy.deepcopy(trained("luong"))
    with torch.no_grad():
        model.W_c.weight[0, 0] = float("nan")
    return model.adapter()


def weights_outside_modules():
    return replace(good(), modules=())


def reference_raises():
    return replace(good(), reference=lambda ids, lengths, n: {}["oops"])


NOT_A_FUNCTION = 3


def not_an_adapter():
    return 42


def fails():
    raise RuntimeError("no weights here")


def exits():
    raise SystemExit(0)  # a training script's exit, reached from the factory


def fails_in_torch():
    return torch.nn.Linear(2, 2)(torch.zeros(3, 3))  # raises inside torch's own Python, named at this line
'''


def line_of(text: str) -> int:
    """The line of bad_models.py that holds `text`."""
    return next(i for i, line in enumerate(BAD_MODELS.splitlines(), 1) if text in line)


def setup_adapter_workspace(case_dir: Path) -> None:
    write(case_dir / "bad_models.py", BAD_MODELS)
    write(case_dir / "needs_missing.py", "import not_installed_anywhere\n")
    write(case_dir / "raises_on_import.py", "1 / 0\n")
    write(case_dir / "bad_syntax.py", "def make(:\n")
    write(case_dir / "exits_on_import.py", "import sys\n\nsys.exit(0)  # a script without a __main__ guard\n")
    write(case_dir / "needs_sibling.py", "import my_missing_helpers  # a file of the user's, not there\n")
    write(case_dir / "copy.py", "def make():\n    pass\n")  # the standard library's copy is imported instead
    write(case_dir / "sys.py", "def make():\n    pass\n")
    (case_dir / "email").mkdir()
    write(case_dir / "email" / "mine.py", "def make():\n    pass\n")
    write(case_dir / "needs_a_name.py", "from json import nothing_here\n")


template, workspace = workspace_fixtures("reliability_adapter", setup_adapter_workspace)


def export(function: str, code: int = BAD_INPUT, *says: str) -> Case:
    return case("export", "--adapter", f"bad_models:{function}", "--out", "o", code=code, says=says)


CLI_CASES: dict[str, Case] = {
    "wrong batch axis": export("wrong_batch_axis", BAD_INPUT, "state 'h'", "batch_axis 1 does not hold the batch",
                               "the batch is on axis 0"),
    "undeclared state": export("undeclared_state", BAD_INPUT, "encode returned", "undeclared ['extra']"),
    "step output shape": export("wrong_step_shape", BAD_INPUT, "step output 'feed' has shape (3, 5)",
                                "feeds back as 'feed', which is (3, 20)"),
    # the logsumexp was said without its sign (0.103 where it was -0.103)
    "log-probs masked after their softmax": export("masked_after_log_softmax", BAD_INPUT, "row 0's are not "
                                                   "log-probabilities (their logsumexp is -"),
    # it exported without attention, silently
    "attention at the first step only": export("attention_at_the_first_step_only", BAD_INPUT,
                                               "step returned attention from bos and none at the next step",
                                               "at every step"),
    # the array's numbers were dumped into the line
    "scores as a list": export("list_scores", BAD_INPUT, "got a list of 36 numbers (return a torch.Tensor)"),
    "numpy scores": export("numpy_scores", BAD_INPUT, "got a numpy.ndarray float32 (3, 12) (return a torch.Tensor"),
    "a scalar state": export("a_scalar_state", BAD_INPUT, "state 't': batch_axis 0 does not hold the batch of 3",
                             "give it a batch axis, shape (N,) for a number"),
    # it read as a dtype error: "must be a float32 tensor (batch 3, target vocabulary 12), got torch.float32 (3, 5)"
    "scores shape": export("wrong_scores", BAD_INPUT, "step's scores have 5 columns ((3, 5)), but the target "
                           "vocabulary holds 12 tokens"),
    "growing but not grown": export("growing_but_not_grown", BAD_INPUT, "step output 'h'", "axis 1 grows by one"),
    "reserved state name": export("reserved_name", BAD_INPUT, "state names ['log_probs'] are taken"),
    # these three were tracebacks or a message far from the cause (found by a fresh walk)
    "the loop graph's input as a state name": export("reserved_loop_input", BAD_INPUT,
                                                      "state names ['max_length'] are taken", "rename them"),
    "the loop graph's carried flag as a state name": export("reserved_loop_carry", BAD_INPUT,
                                                            "state names ['finished'] are taken"),
    "the loop graph's output as a state name": export("reserved_loop_output", BAD_INPUT,
                                                      "state names ['tokens'] are taken"),
    "a state named as another's narrowed first value": export("derived_name", BAD_INPUT,
                                                              "state names ['c_narrow'] are taken", "NAME_narrow"),
    # exported and verified (PyTorch was run on the same batch): a text decoded differently beside others
    "an encoder whose rows read one another": export("encode_rows_read_one_another", BAD_INPUT,
                                                     "'memory' encoded for source 0 of the probe differs when that "
                                                     "source is alone, at the batch's width 5,",
                                                     "its rows read one another",
                                                     "each row may depend on its own source only"),
    # the README's own example of a model no check could see
    "an encoder that reads the padding": export("reads_the_padding", BAD_INPUT, "encoded for source 1 of the probe "
                                                "differs when that source is alone at its own width",
                                                "(the batch pads it to 5)", "it reads the padding",
                                                "pack_padded_sequence"),
    "an attention over the padding": export("attention_over_the_padding", BAD_INPUT,
                                            "step's scores after one step for source 1 of the probe differ when",
                                            "at its own width", "it reads the padding", "mask them"),
    "a baked-in length": export("baked_length", BAD_INPUT, "encoder.onnx fails at batch 5", "baked into the graph"),
    "an untraceable op": export("untraceable", BAD_INPUT, "decoder_step.onnx: the model cannot be traced in "
                                "modules[1] (Spectral) at ", f"bad_models.py:{line_of('torch.fft.fft(x)')}: ",
                                "aten::fft_fft"),
    "an untraceable op in the step function": export(  # split at the path: in process, bad_models is imported once
        "untraceable_outside_modules", BAD_INPUT, "decoder_step.onnx: the model cannot be traced at ",
        f"bad_models.py:{line_of('torch.fft.ifft(')}: ", "aten::fft_ifft"),
    "a step that raises": export("raises_in_step", BAD_INPUT, "step failed in modules[1] (Broken) at ",
                                 f"bad_models.py:{line_of('return state[')}: KeyError",
                                 "'cell'", "; if that is a state's name: the state it was given holds ['c', 'feed', 'h', "
                                 "'mask', 'memory']"),
    "ids beyond the encoder's embedding": export("ids_beyond_the_embedding", BAD_INPUT, "encode failed in modules[0]",
                                                 "(Embedding) at ", ": IndexError", "an id beyond its",
                                                 "is the vocabulary longer than the embedding?"),
    # it exported, then failed in onnxruntime at run time on a text of 17 tokens (serve answered 400: found by a walk)
    "fewer positions than max_source_len": export("few_positions", BAD_INPUT, "at max_source_len=256 (a source of 256 "
                                                  "tokens, specials included", "encode failed at ", "IndexError",
                                                  "declare max_source_len=... no longer than the model takes"),
    # it exported, then failed in onnxruntime mid-decode, at output token 41 of a --max-len 50 (found by looking)
    "fewer target positions than it may decode": export("few_target_positions", BAD_INPUT,
                                                        "at output token 41 of the 256 the probe decodes (no "
                                                        "output_limit is declared", "modules[1] (Embedding) at ",
                                                        "IndexError", "an index beyond its 40 rows;",
                                                        "declare output_limit=40 if that is the most tokens"),
    # the exit ended the export with its message and exit 1, nothing saying it came from the step
    "a step that exits": export("exits_in_step", BAD_INPUT, "step failed at ",
                                f"bad_models.py:{line_of('sys.exit(')}: SystemExit: it exited with 'no more steps'"),
    "a constant the step changes": export("changes_a_constant", BAD_INPUT, "step changed 'memory'",
                                          "declared changes=False"),
    "NaN scores": export("nan_scores", BAD_INPUT, "step's scores hold NaN"),
    "a reference that disagrees": export("wrong_reference", BAD_INPUT, "your reference decode differs",
                                         "over your own step function", "leave reference out"),
    "a growing cache not declared": export("grows_undeclared", BAD_INPUT, "step output 'past' has shape (3, 1, 4)",
                                           "its axis 1 grew by one", "State(batch_axis=0, grows=1)"),
    "float64 scores": export("float64_scores", BAD_INPUT, "step's scores must be a float32 tensor",
                             "got torch.float64 (3, 12)"),
    "logits declared as log-probs": export("logits_declared_log_probs", BAD_INPUT, "scores='log_probs'",
                                           "are not log-probabilities", "declare scores='logits'"),
    # the advice was to declare them logits: log_softmax of probabilities, every score flattened, no check failing
    "probabilities declared as log-probs": export("probabilities_declared_log_probs", BAD_INPUT,
                                                  "but they are probabilities", "return their log"),
    "an LSTM's (h, c) as one state entry": export("tuple_state", BAD_INPUT, "what encode returns must be a dict",
                                                  "an LSTM's (h, c) pair is two entries"),
    "a counter kept outside the state": export("python_counter", BAD_INPUT, "step is not deterministic",
                                               "state kept outside the declared state"),
    # the graphs ran at every size, with other values than PyTorch's: a raw table and nothing said of the cause
    # (the graphs ran at every size, with other values than PyTorch's); now the probe sees its rows depend on the width
    "a width read as a Python int": export("width_in_a_python_int", BAD_INPUT, "encoded for source 1 of the probe "
                                           "differs when that source is alone at its own width",
                                           "the width it is padded to", "a value computed from x.shape[1]"),
    # it sent the user looking for an int(...) that is not there (found by a fresh walk)
    "a step whose rows read one another": export("rows_read_one_another", BAD_INPUT, "'h' after one step for "
                                                 "source 0", "its rows read one another",
                                                 "each row may depend on its own source only"),
    "a branch on the tokens' values": export("branch_on_the_tokens", BAD_INPUT, "onnxruntime and PyTorch differ",
                                             "a Python number baked into its trace", "if bool(...)"),
    # onnxruntime could not run it at a narrower batch: the runtime's advice was "pass a smaller batch"
    "a loop over the traced width": export("loop_over_the_width", BAD_INPUT, "at export, this is a size the graph "
                                           "was not traced at", "a loop over range(x.shape[1])"),
    "a random step": export("random_step", BAD_INPUT, "step is not deterministic", "'scores'", "random op"),
    "a float64 model": export("float64_model", BAD_INPUT, "modules[0] (Luong) holds torch.float64 weights",
                              "call .float()"),
    "an infinite weight": export("infinite_weight", BAD_INPUT, "modules[0] (Luong): src_emb.weight holds 1 NaN or "
                                 "infinite value of ", "repair its weights"),
    "a NaN weight": export("nan_weight", BAD_INPUT, "modules[0] (Luong): W_c.weight holds 1 NaN or infinite value of ",
                           "repair its weights"),
    "weights outside modules": export("weights_outside_modules", BAD_INPUT, "held by none of the declared modules",
                                      "modules=[...]"),
    "a reference that raises": export("reference_raises", BAD_INPUT, "reference failed", "KeyError", "'oops'"),
    "not an adapter": export("not_an_adapter", USAGE, "--adapter", "returned 42", "Seq2SeqAdapter"),
    "not a function": export("NOT_A_FUNCTION", USAGE, "--adapter", "has an int, not a function, named"),
    "a module named like seq2onnx's": case("export", "--adapter", "training:make", "--out", "o", code=USAGE,
                                           says=("'training' is the name of one of seq2onnx's own packages",
                                                 "rename your module")),
    "a failing function": export("fails", BAD_INPUT, "--adapter bad_models:fails", "fails() failed at ",
                                 f"bad_models.py:{line_of('no weights here')}: RuntimeError: no weights here"),
    # the innermost line of the user's own code, past torch's frames
    # (the in-process runner imports bad_models once, from the first case's copy of the workspace: the path before
    # the file's name is that copy's)
    "a function failing in torch": export("fails_in_torch", BAD_INPUT, "fails_in_torch() failed at ",
                                          f"bad_models.py:{line_of('torch.nn.Linear(2, 2)(')}: RuntimeError: "),
    "no such module": case("export", "--adapter", "nomodule:make", "--out", "o", code=USAGE,
                           says=("--adapter", "cannot import 'nomodule'", "PYTHONPATH")),
    "a file path for the module": case("export", "--adapter", "./bad_models.py:good", "--out", "o", code=USAGE,
                                       says=("--adapter", "not a file path", "pass bad_models:good")),
    # the user's module ran and one of its imports failed: its failure (exit 1), named where
    "a module whose import is missing": case("export", "--adapter", "needs_missing:make", "--out", "o",
                                             code=BAD_INPUT, says=("cannot import 'needs_missing' at needs_missing.py:"
                                                                   "1: ModuleNotFoundError: No module named "
                                                                   "'not_installed_anywhere'; install it",)),
    # the user's code ran and raised: the model's failure (exit 1, as a failing function), not a usage error
    "a module that raises on import": case("export", "--adapter", "raises_on_import:make", "--out", "o",
                                           code=BAD_INPUT, says=("cannot import 'raises_on_import' at "
                                                                 "raises_on_import.py:1: ZeroDivisionError",
                                                                 "raised while it was imported")),
    "a module with a syntax error": case("export", "--adapter", "bad_syntax:make", "--out", "o", code=BAD_INPUT,
                                         says=("cannot import 'bad_syntax' at bad_syntax.py:1: SyntaxError: invalid "
                                               "syntax; fix it",)),
    # a script's sys.exit(0) at import made export exit 0 with nothing written and nothing said
    "a module that exits on import": case("export", "--adapter", "exits_on_import:make", "--out", "o",
                                          code=BAD_INPUT, says=("cannot import 'exits_on_import' at "
                                                                "exits_on_import.py:3: SystemExit: it exited with 0",
                                                                "if __name__ == '__main__'")),
    "a function that exits": export("exits", BAD_INPUT, "exits() failed at ",
                                    f"bad_models.py:{line_of('raise SystemExit(0)')}: SystemExit: it exited with 0"),
    "a module whose own helper is missing": case("export", "--adapter", "needs_sibling:make", "--out", "o",
                                                 code=BAD_INPUT, says=("at needs_sibling.py:1: ModuleNotFoundError",
                                                                       "'my_missing_helpers'",
                                                                       "put it beside your module")),
    "a name imported from a module that lacks it": case("export", "--adapter", "needs_a_name:make", "--out", "o",
                                                        code=BAD_INPUT, says=("at needs_a_name.py:1: ImportError: "
                                                                              "cannot import name 'nothing_here'",
                                                                              "check the name")),
    "a relative module name": case("export", "--adapter", ".bad_models:good", "--out", "o", code=USAGE,
                                   says=("an absolute module name", "pass bad_models:good")),
    # the standard library's copy was imported, and its function (or none) was said to be the user's
    "a module shadowed by the standard library's": case("export", "--adapter", "copy:make", "--out", "o", code=USAGE,
                                                        says=("'copy' is the standard library's module ",
                                                              "which seq2onnx has imported already: your copy.py "
                                                              "here would never be read; rename yours")),
    "a shadowed module whose function exists": case("export", "--adapter", "copy:copy", "--out", "o", code=USAGE,
                                                    says=("'copy' is the standard library's module",)),
    "a module built into Python": case("export", "--adapter", "sys:make", "--out", "o", code=USAGE,
                                       says=("'sys' is Python's built-in module", "your sys.py here")),
    "a folder shadowed by the standard library's": case("export", "--adapter", "email.mine:make", "--out", "o",
                                                        code=USAGE, says=("'email' is the standard library's module",
                                                                          "your email/ here")),
    "an empty module name": case("export", "--adapter", ".:make", "--out", "o", code=USAGE,
                                 says=("expected MODULE:FUNCTION", "got '.:make'")),
    "a trailing dot": case("export", "--adapter", "bad_models.:good", "--out", "o", code=USAGE,
                           says=("expected MODULE:FUNCTION", "got 'bad_models.:good'")),
    "a file path in a folder": case("export", "--adapter", "models/nested.py:make", "--out", "o", code=USAGE,
                                    says=("not a file path", "pass models.nested:make from this directory")),
    "no such function": case("export", "--adapter", "bad_models:nothing", "--out", "o", code=USAGE,
                             says=("--adapter", "has no function 'nothing'")),
    "no colon": case("export", "--adapter", "bad_models", "--out", "o", code=USAGE,
                     says=("--adapter", "expected MODULE:FUNCTION")),
    "both sources": case("export", ".", "--adapter", "bad_models:good", "--out", "o", code=USAGE,
                         says=("CHECKPOINT", "--adapter", "not both")),
    "neither source": case("export", "--out", "o", code=USAGE, says=("CHECKPOINT", "--adapter", "neither")),
    "verify: two paths with --adapter": case("verify", ".", ".", "--adapter", "bad_models:good", code=USAGE,
                                             says=("MODEL_DIR alone with --adapter",)),
}


@pytest.mark.parametrize("name", list(CLI_CASES))
def test_a_bad_declaration_is_refused_with_one_line(workspace, name):
    assert_refused(workspace, CLI_CASES[name])


def _api(make: str):
    def call(case_dir: Path):
        import importlib
        import sys

        from export.api import export_model

        sys.path.insert(0, str(case_dir))
        try:
            module = importlib.import_module("bad_models")
            return export_model(getattr(module, make)() if make else torch_module(), case_dir / "o")
        finally:
            sys.path.remove(str(case_dir))
    return call


def torch_module():
    """What a new user tries first: the model object itself."""
    from support.foreign import trained

    return trained("tutorial").encoder


API_CASES = {
    "export_model(an nn.Module)": (_api(""), ("source: expected a checkpoint directory", "Seq2SeqAdapter",
                                              "EncoderRNN")),
    "export_model(wrong batch axis)": (_api("wrong_batch_axis"), ("state 'h'", "batch_axis 1")),
}


@pytest.mark.parametrize("name", list(API_CASES))
def test_the_api_refuses_a_bad_declaration_by_name(workspace, name):
    from export.errors import ExportError

    call, says = API_CASES[name]
    assert_api_refused(workspace, call, ExportError, says)


@pytest.mark.parametrize(("change", "says"), [
    (dict(scores="probs"), "scores must be one of ('log_probs', 'logits')"),
    (dict(state={}), "state must map each state tensor's name to a State"),
    (dict(never_emit=(3,)), "never_emit must hold target ids"),
    (dict(fixed_source_len=1), "fixed_source_len must be an int >= 2"),
    (dict(source_vocab=["a"]), "source_vocab must be a runtime.vocab.Vocabulary"),
    (dict(output_limit=3), "output_limit must be None or an int >= max_decoding_length"),
    (dict(max_decoding_length=10**6), "max_decoding_length must be at most 10000 (the most tokens one decode "
                                      "produces), got 1000000"),
    (dict(modules=torch.nn.Linear(2, 2)), "modules must be a list of torch.nn.Modules, got Linear"),
    (dict(name=123), "name must be a printable str of 1 to 200 characters"),
    (dict(name="a\nb"), "name must be a printable str"),
    # it showed the State, which was fine, and not the name
    (dict(state={"h.0": State(0), "c": State(0), "d-1": State(0)}),
     "state's names must be Python identifiers (they name the graphs' inputs and outputs), got ['h.0', 'd-1']"),
])
def test_a_declaration_is_checked_when_it_is_made(change, says):
    from export.adapter import AdapterError

    from support.foreign import trained

    adapter = trained("luong").adapter()
    with pytest.raises(AdapterError, match=re.escape(says)):
        replace(adapter, **change)


def test_a_buffer_may_hold_minus_inf_but_no_nan():
    """A causal mask of -inf is a common buffer and stays exportable; a NaN in a buffer is refused by name, as a
    weight's NaN or infinity is (the CLI rows above)."""
    import copy

    from export.adapter import AdapterError
    from export.weights import check_declared_weights

    from support.foreign import trained

    model = copy.deepcopy(trained("luong"))
    model.register_buffer("causal", torch.triu(torch.full((4, 4), float("-inf")), diagonal=1))
    check_declared_weights(model.adapter())
    model.causal[0, 0] = float("nan")
    with pytest.raises(AdapterError, match=r"modules\[0\] \(Luong\): causal holds 1 NaN value of 16;"):
        check_declared_weights(model.adapter())


def test_a_model_installed_as_a_package_is_still_named_where_it_raised(tmp_path, monkeypatch):
    """A user's model pip-installed (not editable) lives among the installed packages, whose frames are passed over
    (torch's inside a forward): where no other frame is left, the innermost outside torch, seq2onnx and the standard
    library is the user's (no file and line were said; then, in a virtual environment, whose standard library's
    platform folder holds site-packages, still none)."""
    import importlib.util
    import sysconfig

    from export.tracing import raised_at

    site = tmp_path / "lib" / "python3" / "site-packages"  # a virtual environment's: inside its platstdlib
    (site / "usermodel").mkdir(parents=True)
    (site / "usermodel" / "__init__.py").write_text("import torch\n\n\ndef make():\n"
                                                    "    return torch.nn.Linear(2, 2)(torch.zeros(3, 3))\n")
    paths = {**sysconfig.get_paths(), "purelib": str(site), "platlib": str(site), "platstdlib": str(site.parent)}
    monkeypatch.setattr(sysconfig, "get_paths", lambda: paths)
    spec = importlib.util.spec_from_file_location("usermodel", site / "usermodel" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(RuntimeError) as raised:
        module.make()
    called = raised.value.with_traceback(raised.value.__traceback__.tb_next)  # from make() in, as seq2onnx calls it
    assert raised_at(called) == f" at {site / 'usermodel' / '__init__.py'}:5"


ROOT_SCRIPT = Path(sys.executable).parent / "seq2onnx"  # the installed program, as a user runs it


def test_the_module_beside_the_command_wins_over_one_on_pythonpath(tmp_path):
    """`python -m` puts the current directory first; the `seq2onnx` program (the console script, whose path starts
    at its own bin folder) put it first only when it was not on the path at all, so with PYTHONPATH=OTHER:. OTHER's
    module of the same name was imported (here: one that raises)."""
    import os
    import subprocess

    program = ROOT_SCRIPT if ROOT_SCRIPT.exists() else pytest.skip("no seq2onnx console script beside this Python")

    here, other = tmp_path / "here", tmp_path / "other"
    here.mkdir(), other.mkdir()
    (here / "twin_model.py").write_text("def make():\n    raise RuntimeError('the one beside the command')\n")
    (other / "twin_model.py").write_text("raise RuntimeError('the one on PYTHONPATH')\n")
    for path in (f"{other}:{here}", f"{other}:."):
        done = subprocess.run([str(program), "export", "--adapter", "twin_model:make", "--out", "o"],
                              cwd=here, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": f"{path}:{os.environ.get('PYTHONPATH', '')}"})
        assert done.returncode == 1, done.stderr
        assert "make() failed at twin_model.py:2: RuntimeError: the one beside the command" in done.stderr, done.stderr
    assert sorted(p.name for p in here.iterdir()) == ["twin_model.py"]


def test_an_installed_module_hides_yours_even_where_the_environment_is_under_this_directory(tmp_path, monkeypatch):
    """A virtual environment made in the project (`python -m venv .venv`) puts site-packages under the current
    directory: an installed module imported already, of your module's name, was taken for yours (its function
    'missing'), where from any other directory it is refused by name."""
    import sys
    import sysconfig

    from cli.adapters import _shadowed

    site = tmp_path / ".venv" / "lib" / "site-packages"
    (site / "hidden_twin").mkdir(parents=True)
    (site / "hidden_twin" / "__init__.py").write_text("")
    (tmp_path / "hidden_twin.py").write_text("def make():\n    pass\n")
    paths = {**sysconfig.get_paths(), "purelib": str(site), "platlib": str(site)}
    monkeypatch.setattr(sysconfig, "get_paths", lambda: paths)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "hidden_twin", raising=False)
    __import__("hidden_twin")  # imported already, as seq2onnx imports its dependencies
    monkeypatch.chdir(tmp_path)
    try:
        said = _shadowed("hidden_twin")
    finally:
        sys.modules.pop("hidden_twin", None)
    assert said == (f"'hidden_twin' is the installed package's module {site / 'hidden_twin' / '__init__.py'}, which "
                    "seq2onnx has imported already: your hidden_twin.py here would never be read; rename yours (say, "
                    "my_hidden_twin)")
