"""seq2onnx and CTranslate2 on the same transformer, token for token: an export and its CT2 conversion must decode
the same ids and give the same log-probs.

    python benchmarks/ct2_check.py EXPORT_DIR CT2_DIR [--steps 20] [--texts 256]

EXPORT_DIR is a float32 `seq2onnx export` of a transformer, CT2_DIR its conversion by benchmarks/ct2_convert.py; the
sources are the first --texts held-out `dates` sources. Checked, each counted per input:
  free beam 1 / beam 5   ids of `translate_batch(beam_size=b, min_decoding_length=0, max_decoding_length=steps)`
                         identical on both sides; scores, as CT2 defines them (below), within LOG_PROB_ATOL
  forced beam 1          min = max = steps: greedy ids identical (scores differ by design, see below)
  forced beam 5          reported as is (it differs, see below), and with our beam search driven under CT2's rule
                         for a forbidden </s> (`eos_renormalised`), which must be identical
  log-probs              CT2 `score_batch` of our greedy outputs (</s> included) against ours, teacher-forced
                         through the exported step graph, within LOG_PROB_ATOL

What CTranslate2 (4.8.5) does differently, measured here:
- min_decoding_length masks </s> in the logits *before* the softmax, so the other tokens' log-probs are renormalised;
  ours sets log p(</s>) to -inf after it and keeps the model's log-probs. Greedy ids agree (the argmax is the same);
  beam ranks and all scores differ wherever a forbidden </s> was likely (forced lengths past a trained model's end).
- Its default min_decoding_length is 1 (ours 0) and its default beam_size 2 (ours 1): pass both, always.
- Its score is log_prob / length ** length_penalty, length counting the </s>, as our beam's, but for greedy too;
  our greedy Translation.score is the plain summed log-prob (Translation.log_prob either way).
- Its beam search stops once beam_size x patience hypotheses have ended (patience 1 by default), not once no running
  beam can beat the ended ones, as ours does: a well-trained dates model ends a short hypothesis early and stops
  there ('1976-' at -1.52 where ours finds '1976-10-20' at -0.001). The free beam check passes patience = --steps,
  which never stops it before max_decoding_length, so both sides return the best hypothesis. (The timing in
  ct2_bench.py keeps CTranslate2's default: every timed decode runs to min = max length, where no beam ends early.)
- It truncates sources after max_input_length (1024) tokens, where ours refuses them; it adds no </s> to a source
  (add_source_eos false), so it is given our encoder's tokens, </s> included (`ct2_convert.source_tokens`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import ctranslate2
import numpy as np
from ct2_convert import source_tokens

from runtime.errors import Seq2OnnxError, one_line
from runtime.model import Seq2Seq
from runtime.search import beam_search
from runtime.search.step import StepFn, StepResult
from runtime.tokens import encode_sources
from runtime.vocab import BOS, EOS
from training.tokens.builtin import DATES
from training.tokens.data import load_text_dataset

CHECK_BEAM = 5
LOG_PROB_ATOL = 1e-4  # float32 through two runtimes' kernels; a misplaced weight is off by far more
Ids = list[list[int]]


def ct2_ids(results: list[Any], model: Seq2Seq) -> Ids:
    """CT2's best hypothesis per input as our target ids."""
    index = {token: i for i, token in enumerate(model.vocabularies["target"].tokens)}
    return [[index[token] for token in r.hypotheses[0]] for r in results]


def forced_log_probs(model: Seq2Seq, texts: list[str], targets: Ids) -> list[np.ndarray]:
    """Our log-prob of each target token and the closing </s>, teacher-forced through the step graph."""
    steps = model.token_steps
    state = steps.encode(*encode_sources(texts, model.vocabularies["source"], model.spec))
    gold = np.full((len(texts), max(map(len, targets)) + 1), EOS, dtype=np.int64)  # (N, T + 1), </s>-padded
    for row, target in zip(gold, targets):
        row[: len(target)] = target
    tokens, picked = np.full(len(texts), BOS, dtype=np.int64), []
    for t in range(gold.shape[1]):
        result = steps.step(tokens, state)
        picked.append(result.log_probs[np.arange(len(texts)), gold[:, t]])  # (N,)
        state, tokens = result.state, gold[:, t]
    table = np.stack(picked, axis=1)  # (N, T + 1)
    return [table[i, : len(target) + 1] for i, target in enumerate(targets)]


def eos_renormalised(step: StepFn, min_length: int) -> StepFn:
    """`step` under CT2's rule: while </s> is forbidden, the log-softmax runs over the other tokens only."""
    calls = [0]  # the strategies call the step once per output position, in order

    def wrapped(tokens: np.ndarray, state: Any) -> StepResult:
        result, calls[0] = step(tokens, state), calls[0] + 1
        if calls[0] > min_length:
            return result
        log_probs = result.log_probs.astype(np.float64)  # (N, V)
        log_probs[:, EOS] = -np.inf
        log_probs -= np.logaddexp.reduce(log_probs, axis=1, keepdims=True)
        return StepResult(log_probs.astype(np.float32), result.state, result.attention)
    return wrapped


def cross_check(model: Seq2Seq, translator: ctranslate2.Translator, texts: list[str],
                steps: int) -> dict[str, Any]:
    """Ids equal per input, score and log-prob differences: see the module docstring."""
    tokens = source_tokens(texts, model.vocabularies["source"], model.spec)
    out: dict[str, Any] = {"texts": len(texts), "steps": steps}
    for length, low in (("free", 0), ("forced", steps)):
        for beam in (1, CHECK_BEAM):
            ours = [h[0] for h in model.translate_batch(texts, beam_size=beam, min_decoding_length=low,
                                                        max_decoding_length=steps)]
            theirs = translator.translate_batch(tokens, beam_size=beam, min_decoding_length=low,
                                                max_decoding_length=steps, return_scores=True,
                                                patience=float(steps))  # never stops early (module docstring)
            same = sum(h.ids == c for h, c in zip(ours, ct2_ids(theirs, model)))
            lengths = [len(h.ids) + (len(h.ids) < steps) for h in ours]  # CT2 counts the </s>
            score = max(abs(h.log_prob / n - r.scores[0]) for h, n, r in zip(ours, lengths, theirs))
            out[f"{length} beam {beam}"] = {"identical": same, "max_score_diff": score}
            if low and beam > 1:
                steps_fn = model.token_steps
                state = steps_fn.encode(*encode_sources(texts, model.vocabularies["source"], model.spec))
                ruled = beam_search(eos_renormalised(steps_fn.step, low), state, steps_fn.batch_axes,
                                    batch_size=len(texts), bos_id=BOS, eos_id=EOS, beam_size=beam,
                                    min_decoding_length=low, max_decoding_length=steps)
                out[f"{length} beam {beam}"]["identical_under_ct2_eos_rule"] = sum(
                    h[0].tokens == c for h, c in zip(ruled, ct2_ids(theirs, model)))
    greedy = [h[0] for h in model.translate_batch(texts, beam_size=1, max_decoding_length=steps)]
    scored = translator.score_batch(tokens, [h.tokens for h in greedy])
    diffs = [np.abs(np.asarray(s.log_probs) - ours).max()
             for s, ours in zip(scored, forced_log_probs(model, texts, [h.ids for h in greedy]))]
    out["log_prob_max_diff"] = float(max(diffs))
    return out


def check_failures(check: dict[str, Any]) -> list[str]:
    """What the cross-check found wrong (every one, at once)."""
    n, wrong = check["texts"], []
    for case in ("free beam 1", f"free beam {CHECK_BEAM}", "forced beam 1"):
        if check[case]["identical"] != n:
            wrong.append(f"{case}: {check[case]['identical']}/{n} identical")
        if case.startswith("free") and not check[case]["max_score_diff"] <= LOG_PROB_ATOL:
            wrong.append(f"{case}: scores differ by {check[case]['max_score_diff']:.3g} > {LOG_PROB_ATOL:g}")
    ruled = check[f"forced beam {CHECK_BEAM}"]["identical_under_ct2_eos_rule"]
    if ruled != n:
        wrong.append(f"forced beam {CHECK_BEAM} under CT2's </s> rule: {ruled}/{n} identical")
    if not check["log_prob_max_diff"] <= LOG_PROB_ATOL:
        wrong.append(f"log-probs differ by {check['log_prob_max_diff']:.3g} > {LOG_PROB_ATOL:g}")
    return wrong


@click.command()
@click.argument("export_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("ct2_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--steps", type=click.IntRange(min=1), default=20, show_default=True, help="max_decoding_length.")
@click.option("--texts", "n_texts", type=click.IntRange(min=1), default=256, show_default=True,
              help="How many held-out dates sources.")
def main(export_dir: Path, ct2_dir: Path, steps: int, n_texts: int) -> None:
    """Cross-check the seq2onnx export EXPORT_DIR against its CTranslate2 conversion CT2_DIR."""
    _, test = load_text_dataset(DATES)
    try:
        model = Seq2Seq.load(export_dir, provider="cpu")
    except Seq2OnnxError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        translator = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type="float32")
    except RuntimeError as exc:  # CTranslate2's own errors
        raise click.ClickException(f"{ct2_dir}: not a CTranslate2 model ({one_line(exc)}); make one with "
                                   "benchmarks/ct2_convert.py CHECKPOINT OUT") from None
    check = cross_check(model, translator, list(test.sources[:n_texts]), steps)
    click.echo(json.dumps(check, indent=2))
    wrong = check_failures(check)
    if wrong:
        raise click.ClickException("seq2onnx and CTranslate2 disagree: " + "; ".join(wrong))
    click.echo("identical where they must be; log-probs within tolerance")


if __name__ == "__main__":
    main()
