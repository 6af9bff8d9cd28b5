"""What `seq2onnx infer` makes of a decoded text input: its JSON line (`record`, `json_line`) and its attention map
(`heatmap`). The inputs, the batches and the decoding are runtime.infer_tokens'."""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np

from .declared import Sources
from .plot import Heatmap
from .tokens import Translation
from .vocab import Vocabulary

if TYPE_CHECKING:
    from .infer_tokens import Item

ATTENTION_DECIMALS = 6  # float32 weights printed in full would triple the JSON for no information


def record(item: Item, hyps: list[Translation], columns: list[str] | None) -> dict[str, Any]:
    """One JSON line; with `columns` (the attention's column labels) each hypothesis carries its attention."""
    out = []
    for h in hyps:
        doc = {"text": h.text, "tokens": h.tokens, "score": h.score, "log_prob": h.log_prob,
               "finish_reason": h.finish_reason}
        if columns is not None:  # (len, Ls): this input's own columns (runtime.tokens.own_widths)
            doc["attention"] = np.round(h.attention.astype(np.float64), ATTENTION_DECIMALS).tolist()
        out.append(doc)
    doc = {"index": item.index, "source": item.text, "hypotheses": out}
    return doc if columns is None else {**doc, "source_tokens": columns}


LINE_BREAKS = {"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"}  # lines to str.splitlines


def json_line(doc: dict[str, Any]) -> str:
    """A record as one line of JSON, without its newline. Text stays as it is (UTF-8 once written: the JSON Lines
    format), not escaped to ASCII: a transliteration's output is read as written, and takes a third of the bytes.
    Only what a line splitter reads as a line break is escaped (U+2028, U+2029, U+0085: `str.splitlines` splits
    there, and json.dumps leaves them raw)."""
    line = json.dumps(doc, ensure_ascii=False)
    for raw, escaped in LINE_BREAKS.items():
        if raw in line:
            line = line.replace(raw, escaped)
    return line


def heatmap(item: Item, best: Translation, vocab: Vocabulary, rules: Sources, max_len: int) -> Heatmap:
    """The best hypothesis's attention with columns in reading order, labelled by tokens (* = read as unknown)."""
    tokens = vocab.tokenize(item.text)
    ids = vocab.encode(item.text, add_eos=False)
    unk = vocab.ids.unk
    bos, eos = [vocab.tokens[vocab.ids.bos]] * rules.add_bos, [vocab.tokens[vocab.ids.eos]] * rules.add_eos
    labels = bos + [_visible(t) + "*" * (i == unk) for t, i in zip(tokens, ids)] + eos
    body = list(range(len(bos), len(bos) + len(tokens)))
    order = list(range(len(bos))) + (body[::-1] if rules.reverse else body) + [len(bos) + len(tokens)] * len(eos)
    pad = list(range(len(order), rules.fixed_len or 0))  # a fixed-length model's padding, which it attends to
    labels += [vocab.tokens[vocab.ids.filler]] * len(pad)
    weights = best.attention[:, order + pad]  # (Lt, Ls): column j is labels[j]
    read = ("reading order; the model read the tokens reversed" if rules.reverse else
            "the order the model read them")
    unknown = "; * = unknown to the model, read as its unknown token" if unk is not None and unk in ids else ""
    stop = "ended by eos" if best.finish_reason == "eos" else f"stopped at {max_len} token{'s' * (max_len > 1)}"
    title = f"input {item.index}: {_short(item.text)}\n-> {_short(best.text)}  (score {best.score:.3f}; {stop})"
    return Heatmap(weights, [_visible(t) for t in best.tokens], labels, "output token",
                   f"source token ({read}){unknown}", title)


def _visible(token: str) -> str:
    """A label that shows: character models have a space token, which would be an empty tick."""
    return token.replace(" ", "\u2423") if token.strip() == "" else token


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
