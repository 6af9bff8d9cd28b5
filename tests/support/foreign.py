"""Three seq2seq models written the way people write them, not the way seq2onnx does, brought in through a declared
contract (export.adapter): the PyTorch tutorial's Bahdanau GRU decoder (embedding and context concatenated before
its GRU; sources padded to a fixed 10 tokens, SOS 0 / EOS 1), an LSTM with Luong "general" attention and input
feeding (its own special ids, masked attention over packed variable-length sources), and a transformer built on
torch.nn.Transformer that re-reads its whole output every step (in fixed-size buffers: the legacy exporter bakes
nn.MultiheadAttention's sequence lengths into the graph). Each trains for a few steps on a small word-reversing
corpus and comes with its own greedy decode, the reference its export is checked against."""
from __future__ import annotations

import functools
import random

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from export.adapter import Seq2SeqAdapter, State
from runtime.specials import Specials
from runtime.vocab import Vocabulary

WORDS = "red green blue black white gold pink gray".split()
TRANSLATED = dict(zip(WORDS, "ROT GRUN BLAU SCHWARZ WEISS GOLD ROSA GRAU".split()))
MAX_LENGTH = 10  # the tutorial's: sources (with their EOS) padded to exactly this


def corpus(n: int = 200, seed: int = 0) -> list[tuple[str, str]]:
    """Word sequences of 1-6 colours, and their translations in reverse order."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 6))]
        pairs.append((" ".join(words), " ".join(TRANSLATED[w] for w in reversed(words))))
    return pairs


def vocab(words: list[str], specials: tuple[str, ...], ids: Specials) -> Vocabulary:
    return Vocabulary((*specials, *words), "whitespace", specials=ids)


def batch(texts: list[str], v: Vocabulary, eos: bool, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, L) ids right-padded with the vocabulary's filler, and lengths, as the runtime encodes them."""
    ids, lengths = v.encode_batch(texts, add_eos=eos)
    ids = torch.from_numpy(ids)
    if width is not None:
        ids = F.pad(ids, (0, width - ids.shape[1]), value=v.ids.filler)
    return ids, torch.from_numpy(lengths)


def teacher_forced(texts: list[str], v: Vocabulary) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoder inputs (bos + target) and outputs (target + eos), padded with eos (ignored in the loss)."""
    rows = [v.encode(t, add_eos=False) for t in texts]
    width = max(map(len, rows)) + 1
    inputs = torch.full((len(rows), width), v.ids.eos)
    outputs = torch.full((len(rows), width), -100)
    for i, r in enumerate(rows):
        inputs[i, :len(r) + 1] = torch.tensor([v.ids.bos, *r])
        outputs[i, :len(r) + 1] = torch.tensor([*r, v.ids.eos])
    return inputs, outputs


def train(model: nn.Module, loss_of, steps: int, seed: int) -> None:
    torch.manual_seed(seed)
    pairs = corpus()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model.train()
    for s in range(steps):
        chunk = pairs[(s * 16) % len(pairs):][:16]
        opt.zero_grad()
        loss = loss_of([p[0] for p in chunk], [p[1] for p in chunk])
        loss.backward()
        opt.step()
    model.eval()


# -- 1. the PyTorch tutorial: EncoderRNN + AttnDecoderRNN (Bahdanau) ------------------------------------------------

class EncoderRNN(nn.Module):
    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(input_size, hidden_size)
        self.gru = nn.GRU(hidden_size, hidden_size, batch_first=True)

    def forward(self, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.gru(self.embedding(source))


class BahdanauAttention(nn.Module):
    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.Wa, self.Ua, self.Va = (nn.Linear(hidden_size, hidden_size), nn.Linear(hidden_size, hidden_size),
                                     nn.Linear(hidden_size, 1))

    def forward(self, query: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = self.Va(torch.tanh(self.Wa(query) + self.Ua(keys))).squeeze(2).unsqueeze(1)
        weights = F.softmax(scores, dim=-1)
        return torch.bmm(weights, keys), weights


class AttnDecoderRNN(nn.Module):
    def __init__(self, hidden_size: int, output_size: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(output_size, hidden_size)
        self.attention = BahdanauAttention(hidden_size)
        self.gru = nn.GRU(2 * hidden_size, hidden_size, batch_first=True)
        self.out = nn.Linear(hidden_size, output_size)

    def forward_step(self, input: torch.Tensor, hidden: torch.Tensor, encoder_outputs: torch.Tensor):
        embedded = self.embedding(input)
        context, attn = self.attention(hidden.permute(1, 0, 2), encoder_outputs)
        output, hidden = self.gru(torch.cat((embedded, context), dim=2), hidden)
        return self.out(output), hidden, attn


class Tutorial:
    """SOS 0 and EOS 1 on both sides, sources closed by EOS and padded with 0 to MAX_LENGTH, as trained."""

    def __init__(self, steps: int = 60, seed: int = 0, hidden: int = 24) -> None:
        ids = Specials(bos=0, eos=1, pad=0)  # the tutorial pads with zeros: SOS's id
        self.source = vocab(WORDS, ("SOS", "EOS"), ids)
        self.target = vocab(list(TRANSLATED.values()), ("SOS", "EOS"), ids)
        torch.manual_seed(seed)
        self.encoder, self.decoder = EncoderRNN(len(self.source), hidden), AttnDecoderRNN(hidden, len(self.target))
        train(nn.ModuleList([self.encoder, self.decoder]), self.loss, steps, seed)

    def loss(self, sources: list[str], targets: list[str]) -> torch.Tensor:
        ids, _ = batch(sources, self.source, eos=True, width=MAX_LENGTH)
        inputs, outputs = teacher_forced(targets, self.target)
        memory, hidden = self.encoder(ids)
        steps = []
        for t in range(inputs.shape[1]):
            out, hidden, _ = self.decoder.forward_step(inputs[:, t:t + 1], hidden, memory)
            steps.append(out)
        return F.nll_loss(F.log_softmax(torch.cat(steps, 1), -1).flatten(0, 1), outputs.flatten())

    def greedy(self, source_ids: torch.Tensor, source_lengths: torch.Tensor, max_length: int) -> list[list[int]]:
        """The tutorial's own evaluate(): max_length argmax steps, each row cut at its first EOS."""
        with torch.no_grad():
            memory, hidden = self.encoder(source_ids)
            token = torch.full((len(source_ids), 1), self.target.ids.bos)
            out = []
            for _ in range(max_length):
                logits, hidden, _ = self.decoder.forward_step(token, hidden, memory)
                token = F.log_softmax(logits, -1).topk(1)[1].squeeze(-1)
                out.append(token[:, 0])
        return [_cut(row, self.target.ids.eos) for row in torch.stack(out, 1).tolist()]

    def adapter(self) -> Seq2SeqAdapter:
        def encode(source_ids: torch.Tensor, source_lengths: torch.Tensor) -> dict[str, torch.Tensor]:
            memory, hidden = self.encoder(source_ids)
            return {"hidden": hidden, "encoder_outputs": memory}

        def step(tokens: torch.Tensor, state: dict[str, torch.Tensor]):
            logits, hidden, attn = self.decoder.forward_step(tokens[:, None], state["hidden"], state["encoder_outputs"])
            return F.log_softmax(logits[:, 0], -1), {"hidden": hidden}, attn[:, 0]

        return Seq2SeqAdapter(encode, step, {"hidden": State(batch_axis=1),
                                             "encoder_outputs": State(batch_axis=0, changes=False)},
                              self.source, self.target, modules=[self.encoder, self.decoder],
                              fixed_source_len=MAX_LENGTH, max_decoding_length=MAX_LENGTH, reference=self.greedy,
                              name="tutorial")


# -- 2. an LSTM with Luong "general" attention and input feeding -----------------------------------------------------

class Luong(nn.Module):
    """<pad> 0, <unk> 1, <bos> 2, <eos> 3; packed variable-length sources; the attentional vector h~ is fed to the
    next step's LSTM beside the embedding (input feeding); scores h_t . W_a h_s; the step returns logits."""

    def __init__(self, steps: int = 60, seed: int = 0, emb: int = 12, hidden: int = 20) -> None:
        super().__init__()
        ids = Specials(bos=2, eos=3, pad=0, unk=1)
        self.source = vocab(WORDS, ("<pad>", "<unk>", "<bos>", "<eos>"), ids)
        self.target = vocab(list(TRANSLATED.values()), ("<pad>", "<unk>", "<bos>", "<eos>"), ids)
        torch.manual_seed(seed)
        self.src_emb = nn.Embedding(len(self.source), emb, padding_idx=0)
        self.encoder = nn.LSTM(emb, hidden, batch_first=True)
        self.tgt_emb = nn.Embedding(len(self.target), emb, padding_idx=0)
        self.decoder = nn.LSTMCell(emb + hidden, hidden)
        self.W_a = nn.Linear(hidden, hidden, bias=False)
        self.W_c = nn.Linear(2 * hidden, hidden, bias=False)
        self.out = nn.Linear(hidden, len(self.target))
        train(self, self.loss, steps, seed)

    def encode(self, source_ids: torch.Tensor, source_lengths: torch.Tensor) -> dict[str, torch.Tensor]:
        packed = pack_padded_sequence(self.src_emb(source_ids), source_lengths, batch_first=True, enforce_sorted=False)
        out, (h, c) = self.encoder(packed)
        memory, _ = pad_packed_sequence(out, batch_first=True, total_length=source_ids.shape[1])
        mask = torch.arange(source_ids.shape[1])[None, :] < source_lengths[:, None]
        return {"h": h[0], "c": c[0], "feed": torch.zeros_like(h[0]), "memory": memory, "mask": mask}

    def step(self, tokens: torch.Tensor, state: dict[str, torch.Tensor]):
        h, c = self.decoder(torch.cat([self.tgt_emb(tokens), state["feed"]], -1), (state["h"], state["c"]))
        scores = torch.bmm(state["memory"], self.W_a(h)[:, :, None]).squeeze(2)
        attn = torch.softmax(scores.masked_fill(~state["mask"], float("-inf")), -1)
        context = torch.bmm(attn[:, None], state["memory"])[:, 0]
        feed = torch.tanh(self.W_c(torch.cat([context, h], -1)))
        return self.out(feed), {"h": h, "c": c, "feed": feed}, attn

    def loss(self, sources: list[str], targets: list[str]) -> torch.Tensor:
        state = self.encode(*batch(sources, self.source, eos=True))
        inputs, outputs = teacher_forced(targets, self.target)
        logits = []
        for t in range(inputs.shape[1]):
            out, changed, _ = self.step(inputs[:, t], state)
            state = {**state, **changed}
            logits.append(out)
        return F.cross_entropy(torch.stack(logits, 1).flatten(0, 1), outputs.flatten())

    def greedy(self, source_ids: torch.Tensor, source_lengths: torch.Tensor, max_length: int) -> list[list[int]]:
        with torch.no_grad():
            state = self.encode(source_ids, source_lengths)
            token, out = torch.full((len(source_ids),), self.target.ids.bos), []
            for _ in range(max_length):
                logits, changed, _ = self.step(token, state)
                state, token = {**state, **changed}, logits.argmax(-1)
                out.append(token)
        return [_cut(row, self.target.ids.eos) for row in torch.stack(out, 1).tolist()]

    def adapter(self) -> Seq2SeqAdapter:
        changing = {name: State(batch_axis=0) for name in ("h", "c", "feed")}
        constant = {name: State(batch_axis=0, changes=False) for name in ("memory", "mask")}
        return Seq2SeqAdapter(self.encode, self.step, {**changing, **constant}, self.source, self.target,
                              modules=[self], scores="logits", never_emit=(0, 1, 2), max_decoding_length=12,
                              reference=self.greedy, name="luong")


# -- 3. a transformer on torch.nn.Transformer, with fixed-size source and output buffers ---------------------------

SOURCE_WIDTH, OUTPUT_WIDTH = 10, 12  # nn.MultiheadAttention bakes its sequence lengths into a traced graph


class TinyTransformer(nn.Module):
    """<unk> 0, <pad> 1, <sos> 2, <eos> 3; sources without eos, padded to SOURCE_WIDTH; learned positions. No cache:
    each step writes the previous token into a fixed OUTPUT_WIDTH-token buffer at its position, runs the causal
    decoder over the whole buffer and reads that position's output (causal masking makes the rest of the buffer
    irrelevant), the export-friendly form of re-reading the growing prefix, which its own decode does."""

    def __init__(self, steps: int = 60, seed: int = 0, d: int = 16) -> None:
        super().__init__()
        ids = Specials(bos=2, eos=3, pad=1, unk=0)
        self.source = vocab(WORDS, ("<unk>", "<pad>", "<sos>", "<eos>"), ids)
        self.target = vocab(list(TRANSLATED.values()), ("<unk>", "<pad>", "<sos>", "<eos>"), ids)
        torch.manual_seed(seed)
        self.src_emb, self.tgt_emb = nn.Embedding(len(self.source), d), nn.Embedding(len(self.target), d)
        self.pos = nn.Parameter(torch.randn(max(SOURCE_WIDTH, OUTPUT_WIDTH), d) * 0.1)
        self.transformer = nn.Transformer(d, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=32,
                                          dropout=0.0, batch_first=True)
        self.transformer.encoder.enable_nested_tensor = False  # a prototype fast path; the same arithmetic
        self.out = nn.Linear(d, len(self.target))
        train(self, self.loss, steps, seed)

    def encode(self, source_ids: torch.Tensor, source_lengths: torch.Tensor) -> dict[str, torch.Tensor]:
        padding = torch.arange(source_ids.shape[1])[None, :] >= source_lengths[:, None]  # (N, L): True = pad
        memory = self.transformer.encoder(self.src_emb(source_ids) + self.pos[:source_ids.shape[1]],
                                          src_key_padding_mask=padding)
        buffer = torch.full_like(source_ids[:, :1], self.target.ids.pad).expand(-1, OUTPUT_WIDTH)
        return {"memory": memory, "padding": padding, "buffer": buffer.contiguous(),
                "position": torch.zeros_like(source_lengths)}

    def decode(self, prefix: torch.Tensor, memory: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        t = prefix.shape[1]
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        y = self.transformer.decoder(self.tgt_emb(prefix) + self.pos[:t], memory, tgt_mask=causal,
                                     memory_key_padding_mask=padding)
        return self.out(y)  # (N, t, V) logits

    def step(self, tokens: torch.Tensor, state: dict[str, torch.Tensor]):
        position = state["position"]
        buffer = state["buffer"].scatter(1, position[:, None], tokens[:, None])
        logits = self.decode(buffer, state["memory"], state["padding"])  # (N, OUTPUT_WIDTH, V)
        here = logits.gather(1, position[:, None, None].expand(-1, 1, logits.shape[2]))[:, 0]  # (N, V)
        return torch.log_softmax(here, -1), {"buffer": buffer, "position": position + 1}

    def loss(self, sources: list[str], targets: list[str]) -> torch.Tensor:
        state = self.encode(*batch(sources, self.source, eos=False, width=SOURCE_WIDTH))
        inputs, outputs = teacher_forced(targets, self.target)
        logits = self.decode(inputs, state["memory"], state["padding"])
        return F.cross_entropy(logits.flatten(0, 1), outputs.flatten())

    def greedy(self, source_ids: torch.Tensor, source_lengths: torch.Tensor, max_length: int) -> list[list[int]]:
        """Its own decode: the growing prefix, re-read whole every step."""
        with torch.no_grad():
            state = self.encode(source_ids, source_lengths)
            prefix = torch.full((len(source_ids), 1), self.target.ids.bos)
            for _ in range(max_length):
                logits = self.decode(prefix, state["memory"], state["padding"])
                prefix = torch.cat([prefix, logits[:, -1].argmax(-1, keepdim=True)], 1)
        return [_cut(row[1:], self.target.ids.eos) for row in prefix.tolist()]

    def adapter(self) -> Seq2SeqAdapter:
        return Seq2SeqAdapter(self.encode, self.step, {"memory": State(batch_axis=0, changes=False),
                                                       "padding": State(batch_axis=0, changes=False),
                                                       "buffer": State(batch_axis=0), "position": State(batch_axis=0)},
                              self.source, self.target, modules=[self], source_eos=False,
                              fixed_source_len=SOURCE_WIDTH, max_decoding_length=OUTPUT_WIDTH,
                              output_limit=OUTPUT_WIDTH, reference=self.greedy, name="tiny-transformer")


def _cut(ids: list[int], eos: int) -> list[int]:
    return ids[:ids.index(eos)] if eos in ids else ids


FOREIGN = {"tutorial": Tutorial, "luong": Luong, "transformer": TinyTransformer}


@functools.lru_cache(maxsize=None)
def trained(kind: str):
    """One trained model of each kind per process (a few seconds each)."""
    return FOREIGN[kind]()
