"""Token models in `seq2onnx infer`: numbered text inputs, decoding options, JSON lines and attention maps.

Inputs are numbered from 0 in the order given (the n-th --text, or line n + 1 of --input); blank lines of --input
are skipped but keep their number, so output "index" i always answers line i + 1. Messages name places 1-based
('--input notes.txt line 3', '--text #2'), as editors count lines.
"""
from __future__ import annotations

import sys
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator

import numpy as np

from .binding import RUN_FAILED_ADVICE
from .declared import Sources, TokenContract
from .defaults import LONE_CR, NUL, UTF8_BOM, UTF16_BOMS
from .errors import InputError, ResourceError, Seq2OnnxError, UsageError, clipped
from .infer_records import heatmap, record
from .plot import MAX_ITEMS, Heatmap
from .spec import ModelSpec
from .token_steps import contract_for
from .tokens import Translation, source_token_limit, too_long
from .vocab import VocabError, Vocabulary

TOKEN_OUTPUT_SUFFIXES = (".jsonl",)
POINT_SUFFIXES = (".npy", ".npz", ".json")  # what point models read; a token model reads text lines
MAX_LINE_BYTES = 1 << 20  # one input line, read no further; the source token limit refuses far shorter lines
MAX_BATCH = 4096  # rows = batch * beam (beam: at most runtime.search.beam.MAX_BEAM); beyond, memory runs out
DEFAULT_BATCH_SIZE = 32
PROGRESS_SECONDS = 2.0  # between progress lines after the first batch's (and the last batch's, always)
SAMPLING = ("top_k", "top_p", "temperature", "seed")
TOKEN_ONLY = ("texts", "beam", "n_best", "max_len", "min_len", "length_penalty", "sample", *SAMPLING, "batch_size")


@dataclass(frozen=True)
class Item:
    """One input: its 0-based index, its text, and its place for messages ('--input f.txt line 3')."""

    index: int
    text: str
    where: str


def span(batch: list[Item]) -> str:
    """Where a batch's inputs are, for a message: '--input f.txt lines 1-4000', '--text #1 to #3', or one's place."""
    (head, first), (_, last) = batch[0].where.rsplit(" ", 1), batch[-1].where.rsplit(" ", 1)
    if len(batch) == 1:
        return batch[0].where
    return f"{head}s {first}-{last}" if head.endswith(" line") else f"{head} {first} to {last}"


def read_items(input_path: str | None, texts: tuple[str, ...]) -> Iterator[Item]:
    """The --text values, or the lines of --input ('-': stdin), one at a time."""
    if input_path is None:
        yield from (Item(i, text, f"--text #{i + 1}") for i, text in enumerate(texts))
    elif input_path == "-":
        try:
            yield from _lines(sys.stdin.buffer, "--input - (stdin)")
        except OSError as exc:  # a closed stdin (EBADF), a terminal gone (EIO)
            raise InputError(f"--input: stdin could not be read ({exc.strerror or exc})") from None
    else:
        try:
            with open(input_path, "rb") as stream:
                yield from _lines(stream, f"--input {input_path}")
        except OSError as exc:
            raise InputError(f"--input: {input_path} could not be read ({exc.strerror or exc})") from None


def _lines(stream: IO[bytes], name: str) -> Iterator[Item]:
    """UTF-8 lines without their line ends (and without a BOM), each at most MAX_LINE_BYTES."""
    for i in count():
        raw = stream.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        where = f"{name} line {i + 1}"
        if len(raw) > MAX_LINE_BYTES:
            raise InputError(f"{where} is longer than {MAX_LINE_BYTES >> 20} MiB; one input per line")
        raw = raw[len(UTF8_BOM):] if i == 0 and raw.startswith(UTF8_BOM) else raw
        fix = "send UTF-8 text" if stream is sys.stdin.buffer else "save the file as UTF-8"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            utf16 = " (it starts with UTF-16's byte-order mark: it is UTF-16)" if i == 0 and raw[:2] in UTF16_BOMS else ""
            raise InputError(f"{where}: not UTF-8 (byte {raw[exc.start]:#04x} at offset {exc.start}){utf16}; "
                             f"{fix}") from None
        text = text.removesuffix("\n").removesuffix("\r")
        if "\0" in text:  # UTF-16 without a BOM decodes as UTF-8: every other byte NUL, each read as unknown
            raise InputError(f"{where}, character {text.index(chr(0))}: {NUL}")
        if "\r" in text:  # classic Mac OS line ends: the whole file one line, each \r read as an unknown token
            raise InputError(f"{where}, character {text.index(chr(13))}: {LONE_CR}")
        yield Item(i, text, where)


class Unknowns:
    """The inputs read with the unknown id: how many, and the first few with the tokens it stood for (a run of a
    million such lines holds five)."""

    SHOWN = 5  # inputs named in the note
    TOKENS = 8  # distinct tokens named for each
    TOKEN_CHARS = 40  # of each token, at most (and its length)

    def __init__(self) -> None:
        self.count = 0
        self.first: list[tuple[Item, list[str]]] = []

    def add(self, item: Item, tokens: list[str]) -> None:
        self.count += 1
        if len(self.first) < self.SHOWN:
            self.first.append((item, list(dict.fromkeys(tokens))))

    def note(self) -> str:
        """A line naming them (a model trained on lower case never saw a capital letter: it read one as unknown,
        and the decode went on without a word)."""
        def tokens(found: list[str]) -> str:
            shown = (repr(clipped(token, self.TOKEN_CHARS)) for token in found[:self.TOKENS])  # a 300 KB word: its start
            return ", ".join(shown) + (", ..." if len(found) > self.TOKENS else "")

        shown = "; ".join(f"{item.where} ({tokens(found)})" for item, found in self.first)
        more = "; ..." if self.count > len(self.first) else ""
        return (f"note: {self.count} input{'s' if self.count > 1 else ''} held tokens the model's source vocabulary "
                f"lacks, read as its unknown token: {shown}{more}; check their case and spelling")


def batches(items: Iterable[Item], size: int, vocab: Vocabulary, skipped: list[Item], spec: ModelSpec,
            contract: TokenContract | None = None, unknown: Unknowns | None = None) -> Iterator[list[Item]]:
    """Lists of up to `size` items; blank ones go to `skipped`, and ones with tokens the vocabulary reads as its
    unknown id to `unknown` (with those tokens), where given; over-long ones (see `source_token_limit`), and ones
    holding tokens a vocabulary without an unknown id lacks, are refused by place."""
    batch: list[Item] = []
    limit = source_token_limit(spec, contract)
    rules = contract_for(spec, contract).sources
    for item in items:
        if not item.text.strip():
            skipped.append(item)
            continue
        try:
            ids = vocab.encode(item.text, add_bos=rules.add_bos, add_eos=rules.add_eos)
        except VocabError as exc:
            raise InputError(f"{item.where}: {exc}") from None
        n = len(ids)
        if unknown is not None and vocab.ids.unk is not None and vocab.ids.unk in ids:
            unknown.add(item, vocab.unknown_tokens(item.text))
        if n > limit:
            raise InputError(f"{item.where}: {too_long(n, spec, contract)}; split it")
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def source_columns(vocab: Vocabulary, text: str, rules: Sources) -> list[str]:
    """The source tokens in the order the model read them (reversed if it was trained so), between the bos and
    eos it reads (</s> last, for seq2onnx's own)."""
    tokens = vocab.tokenize(text)
    ends = [vocab.tokens[vocab.ids.bos]] * rules.add_bos, [vocab.tokens[vocab.ids.eos]] * rules.add_eos
    columns = ends[0] + (tokens[::-1] if rules.reverse else tokens) + ends[1]
    padding = [vocab.tokens[vocab.ids.filler]] * ((rules.fixed_len or 0) - len(columns))  # a fixed-length model
    return columns + padding  # attends over its padding too: those columns are part of its weights


def batch_seed(seed: int | None, number: int) -> int | None:
    """Batch `number`'s sampling seed, mixed from --seed and the number: batches draw independently of each other,
    yet a run repeats with the same --seed and --batch-size. None stays None (fresh entropy)."""
    return None if seed is None else int(np.random.SeedSequence([seed, number]).generate_state(1)[0])


class TokenRun:
    """Decode inputs batch by batch with fixed options; keeps the skipped lines and the first results to plot."""

    def __init__(self, model: Any, options: dict[str, Any], batch_size: int, attention: bool, plot: bool) -> None:
        self.model, self.options, self.batch_size = model, options, batch_size
        self.attention, self.plot = attention, plot
        self.vocab: Vocabulary = model.vocabularies["source"]
        self.max_len = options["max_decoding_length"] or model.spec.target_len
        self.skipped: list[Item] = []
        self.unknown = Unknowns()
        self.shown: list[tuple[Item, Translation]] = []
        self.decoded = 0

    def check(self, model_dir: Path) -> None:
        """Refuse what this model cannot do: attention it does not have, an output bound beyond a transformer's
        position table, a --min-len beyond the output bound."""
        spec, limit = self.model.spec, self.model.contract.max_decoding_length
        if limit is not None and self.max_len > limit:
            given = (f"--max-len {self.max_len}" if self.options["max_decoding_length"] is not None
                     else f"the model's target_len {self.max_len} (the default --max-len)")
            why = ("output token t reads row t of the transformer's position table" if spec.is_transformer else
                   "the most tokens it can produce")
            bound = f"max_positions {limit}" if spec.is_transformer else f"output limit {limit}"
            raise UsageError(f"{given} is more than {model_dir}'s {bound}: {why}; pass --max-len {limit} or less")
        if self.options["min_decoding_length"] > self.max_len:
            raise UsageError(f"--min-len {self.options['min_decoding_length']} is more than the output bound "
                             f"{self.max_len} (--max-len, default the model's target_len); lower it")
        wanted = [flag for flag, on in (("--attention", self.attention), ("--plot", self.plot)) if on]
        if wanted and not self.model.contract.has_attention:
            says = "its spec says attention 'none'" if not spec.is_declared else "its step gives no attention"
            raise InputError(f"{', '.join(wanted)}: {model_dir} has no attention ({says}), so there are no weights "
                             f"to return or draw; drop {' and '.join(wanted)}")

    def records(self, items: Iterable[Item],
                progress: Callable[[str], None] | None = None) -> Iterator[dict[str, Any]]:
        """One JSON-ready record per non-blank input, in input order, each batch's as soon as it is decoded (no
        batch is read ahead: a caller feeding a pipe a batch at a time gets its answers); `progress` hears of the
        second batch, then at most every PROGRESS_SECONDS, and of the last (a run of one batch says nothing)."""
        rules = self.model.contract.sources
        chunks = batches(items, self.batch_size, self.vocab, self.skipped, self.model.spec, self.model.contract,
                         self.unknown)
        told, unsaid = 0.0, ""
        for number, batch, found in self._decoded(chunks):
            for item, hyps in zip(batch, found):
                if self.plot and len(self.shown) < MAX_ITEMS:
                    self.shown.append((item, hyps[0]))
                columns = source_columns(self.vocab, item.text, rules) if self.attention else None
                yield record(item, hyps, columns)
            self.decoded += len(batch)
            unsaid = (f"infer: {self.decoded} input{'s' if self.decoded > 1 else ''} decoded (to "
                      f"{batch[-1].where})") if number else ""
            if progress is not None and unsaid and (number == 1 or time.monotonic() - told >= PROGRESS_SECONDS):
                progress(unsaid)
                told, unsaid = time.monotonic(), ""
        if progress is not None and unsaid:
            progress(unsaid)

    def _decoded(self, chunks: Iterable[list[Item]]) -> Iterator[tuple[int, list[Item], list[list[Translation]]]]:
        """(number, batch, its translations), in order. A model loaded with workers decodes that many
        batches at once, batch n on copy n mod N (`Seq2Seq.copies`: each decodes a call whole), as one copy decodes
        it alone (the same seed, the same attention for the plot): the output is one copy's, byte for byte."""
        copies = self.model.copies

        def decode(copy: Any, number: int, batch: list[Item], before: int) -> list[list[Translation]]:
            want = self.attention or (self.plot and before < MAX_ITEMS)  # the plot's first items carry attention
            options = {**self.options, "seed": batch_seed(self.options["seed"], number), "return_attention": want}
            try:
                return copy.translate_batch([i.text for i in batch], **options)
            except ResourceError as exc:  # short of memory: what the options made of the batch
                raise ResourceError(f"{span(batch)}: {str(exc).removesuffix(RUN_FAILED_ADVICE)}{self._smaller()}") \
                    from None
            except Seq2OnnxError as exc:
                raise InputError(f"{span(batch)}: {exc}") from None

        before = 0
        if len(copies) == 1:
            for number, batch in enumerate(chunks):
                yield number, batch, decode(copies[0], number, batch, before)
                before += len(batch)
            return
        pending: deque[tuple[int, list[Item], Future[list[list[Translation]]]]] = deque()
        with ThreadPoolExecutor(len(copies), thread_name_prefix="seq2onnx-infer") as pool:
            for number, batch in enumerate(chunks):
                pending.append((number, batch, pool.submit(decode, copies[number % len(copies)], number, batch,
                                                           before)))
                before += len(batch)
                if len(pending) == len(copies):  # the oldest's copy is the next batch's
                    number, done, future = pending.popleft()
                    yield number, done, future.result()
            while pending:
                number, done, future = pending.popleft()
                yield number, done, future.result()

    def _smaller(self) -> str:
        """What to pass for a batch the memory could not decode: the options that set its size, as given."""
        given = self.options
        said = [f"a smaller --batch-size (this one was {self.batch_size})"]
        said += [f"a narrower --beam ({given['beam_size']})"] if given["beam_size"] > 1 else []
        said += [f"a smaller --max-len ({given['max_decoding_length']})"] if given["max_decoding_length"] else []
        said += [f"a smaller --min-len ({given['min_decoding_length']})"] if given["min_decoding_length"] else []
        said += ["no --attention"] if self.attention else []
        return f"; pass {', '.join(said)} or shorter inputs"

    def heatmaps(self) -> list[Heatmap]:
        """The attention maps of the first inputs' best hypotheses."""
        rules = self.model.contract.sources
        return [heatmap(item, best, self.vocab, rules, self.max_len) for item, best in self.shown]

    def skipped_note(self) -> str:
        """A line naming the blank lines that were skipped."""
        shown = ", ".join(str(i.index + 1) for i in self.skipped[:5]) + (", ..." if len(self.skipped) > 5 else "")
        return (f"note: skipped {len(self.skipped)} blank line(s) (line {shown}); each output's \"index\" is its "
                "line number - 1")
