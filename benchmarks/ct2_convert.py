"""A seq2onnx transformer checkpoint as a CTranslate2 model directory, so CTranslate2 can be benchmarked as a peer.

    python benchmarks/ct2_convert.py CHECKPOINT OUT [--force]

`Seq2OnnxConverter` is a `ctranslate2.converters.Converter` whose `_load()` fills a `TransformerSpec` from a
`TransformerSeq2Seq` (training/tokens/transformer.py). What goes where:

    source_embedding / target_embedding     encoder.embeddings[0] / decoder.embeddings (scale_embeddings False:
                                            ours are not multiplied by sqrt(d_model))
    positions.table (or the learned table)  {encoder,decoder}.position_encodings.encodings, all max_positions rows
                                            (ours interleave sin/cos per dimension; CT2's built-in table does not)
    layer.attention / self_attention        self_attention.linear[0] = [Wq; Wk; Wv], linear[1] = fc_attn
    layer.cross_attention                   attention.linear[0] = Wq, linear[1] = [Wk; Wv], linear[2] = fc_attn
    encoder res1, res2                      self_attention.layer_norm, ffn.layer_norm
    decoder res1, res2, res3                self_attention.layer_norm, attention.layer_norm, ffn.layer_norm
    encoder_norm / decoder_norm ("pre")     encoder.layer_norm / decoder.layer_norm ("post" has none, nor has CT2's)
    ffn.linear1 / linear2                   ffn.linear_0 / linear_1 (ReLU)
    output (tied: target_embedding)         decoder.projection; its bias plus `never_output` (NEVER_LOGIT at <pad>
                                            and <s>), so CT2's log-softmax is our log_probs
Layer norms are torch's (eps 1e-5, set in config.json). The vocabularies are the checkpoint's token lists, specials
<pad> <s> </s> <unk> at 0..3, which are CT2's default unk/bos/eos names; CT2 starts decoding from <s> as we do, and
adds nothing to the source: callers pass our encoder's tokens, `</s>` included (see `source_tokens`).

The directory is written whole or not at all (a staging sibling, then a rename), and only replaces an earlier
CTranslate2 conversion, with force. Needs the `bench` extra (ctranslate2).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import numpy as np
import torch
from ctranslate2.converters import Converter
from ctranslate2.converters.utils import fuse_linear
from ctranslate2.specs import common_spec, transformer_spec
from torch import nn

from runtime.atomic import staged_directory
from runtime.destination import DestinationError, check_destination, normalized
from runtime.errors import Seq2OnnxError
from runtime.spec import ModelSpec, SpecError
from runtime.vocab import BOS_TOKEN, EOS_TOKEN, SPECIAL_TOKENS, UNK_TOKEN, Vocabulary
from training.checkpoint import CheckpointError, load_checkpoint, load_checkpoint_vocabularies, read_meta
from training.tokens.transformer import MultiHeadAttention, TransformerSeq2Seq

CT2_MARKER = "model.bin"
CT2_FILES = frozenset({CT2_MARKER, "config.json", "source_vocabulary.json", "target_vocabulary.json",
                       "shared_vocabulary.json"})  # what CTranslate2's ModelSpec.save writes
LAYER_NORM_EPSILON = 1e-5  # nn.LayerNorm's default, which every norm of TransformerSeq2Seq uses


class ConversionError(Seq2OnnxError, ValueError):
    """The checkpoint or model cannot become a CTranslate2 transformer (not a transformer, vocabularies off)."""


def _array(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to(torch.float32).cpu().numpy().copy()


def _linear(spec: common_spec.LinearSpec, layer: nn.Linear) -> None:
    spec.weight, spec.bias = _array(layer.weight), _array(layer.bias)


def _fused(spec: common_spec.LinearSpec, layers: list[nn.Linear]) -> None:
    """`spec` = the layers stacked along their outputs: weight (sum of outs, in), bias (sum of outs,)."""
    parts = [common_spec.LinearSpec() for _ in layers]
    for part, layer in zip(parts, layers):
        _linear(part, layer)
    fuse_linear(spec, parts)


def _norm(spec: common_spec.LayerNormSpec, norm: nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _array(norm.weight), _array(norm.bias)


def _attention(spec: Any, attention: MultiHeadAttention, norm: nn.LayerNorm, cross: bool) -> None:
    """Self-attention: linear[0] = [q; k; v]; cross-attention: linear[0] = q, linear[1] = [k; v]. Last: fc_attn."""
    if cross:
        _linear(spec.linear[0], attention.queries)
        _fused(spec.linear[1], [attention.keys, attention.values])
    else:
        _fused(spec.linear[0], [attention.queries, attention.keys, attention.values])
    _linear(spec.linear[-1], attention.fc_attn)
    _norm(spec.layer_norm, norm)


def _ffn(spec: Any, ffn: nn.Module, norm: nn.LayerNorm) -> None:
    _linear(spec.linear_0, ffn.linear1)
    _linear(spec.linear_1, ffn.linear2)
    _norm(spec.layer_norm, norm)


def _position_table(model: TransformerSeq2Seq) -> np.ndarray:
    """Our position rows (max_positions, d_model): the sinusoid buffer or the learned embedding."""
    positions = model.positions
    return _array(positions.learned.weight if positions.learned is not None else positions.table)


def _inputs(spec: Any, embeddings: common_spec.EmbeddingsSpec, embedding: nn.Embedding, table: np.ndarray) -> None:
    """An encoder's or decoder's token embedding (not scaled by sqrt(d_model)) and our position rows."""
    embeddings.weight = _array(embedding.weight)
    spec.scale_embeddings = False
    spec.position_encodings.encodings = table


def check_convertible(spec: ModelSpec, what: str) -> None:
    """Refuse anything but a transformer token model, naming `what` was given."""
    if spec.kind != "tokens" or not spec.is_transformer:
        given = f"a {spec.arch} token model" if spec.kind == "tokens" else "a point model"
        raise ConversionError(f"{what}: CTranslate2 conversion needs a transformer (seq2onnx train --arch "
                              f"transformer), got {given}; pass a transformer checkpoint")


def transformer_spec_of(model: TransformerSeq2Seq, source: Vocabulary,
                        target: Vocabulary) -> transformer_spec.TransformerSpec:
    """A filled TransformerSpec (weights, vocabularies, config) computing what `model` computes."""
    spec = model.spec
    ct2 = transformer_spec.TransformerSpec.from_config(
        (spec.layers, spec.layers), spec.n_heads, pre_norm=spec.norm == "pre",
        activation=common_spec.Activation.RELU)
    table = _position_table(model)
    encoder, decoder = ct2.encoder, ct2.decoder
    _inputs(encoder, encoder.embeddings[0], model.source_embedding, table)  # one source embedding (no features)
    _inputs(decoder, decoder.embeddings, model.target_embedding, table)
    for layer_spec, layer in zip(encoder.layer, model.encoder_layers):
        _attention(layer_spec.self_attention, layer.attention, layer.res1.norm, cross=False)
        _ffn(layer_spec.ffn, layer.ffn, layer.res2.norm)
    for layer_spec, layer in zip(decoder.layer, model.decoder_layers):
        _attention(layer_spec.self_attention, layer.self_attention, layer.res1.norm, cross=False)
        _attention(layer_spec.attention, layer.cross_attention, layer.res2.norm, cross=True)
        _ffn(layer_spec.ffn, layer.ffn, layer.res3.norm)
    if spec.norm == "pre":
        _norm(encoder.layer_norm, model.encoder_norm)
        _norm(decoder.layer_norm, model.decoder_norm)
    weight = model.target_embedding.weight if model.output is None else model.output.weight  # (V, E)
    bias = torch.zeros(spec.target_vocab_size) if model.output is None else model.output.bias  # (V,)
    decoder.projection.weight = _array(weight)
    decoder.projection.bias = _array(bias + model.never_output)  # <pad>, <s>: NEVER_LOGIT, as our log_softmax
    ct2.config.layer_norm_epsilon = LAYER_NORM_EPSILON
    ct2.config.unk_token, ct2.config.bos_token, ct2.config.eos_token = UNK_TOKEN, BOS_TOKEN, EOS_TOKEN
    ct2.config.decoder_start_token = BOS_TOKEN
    ct2.register_source_vocabulary(list(source.tokens))
    ct2.register_target_vocabulary(list(target.tokens))
    return ct2


class Seq2OnnxConverter(Converter):
    """CTranslate2's converter interface over an in-memory TransformerSeq2Seq and its vocabularies."""

    def __init__(self, model: TransformerSeq2Seq, source: Vocabulary, target: Vocabulary) -> None:
        self._model, self._source, self._target = model, source, target

    def _load(self) -> transformer_spec.TransformerSpec:
        with torch.no_grad():
            return transformer_spec_of(self._model, self._source, self._target)


def check_ct2_destination(out: str | Path, force: bool) -> None:
    """Refuse protected paths and anything but an earlier CTranslate2 conversion (that one only with force)."""
    check_destination(out, force, kind="CTranslate2 model", marker=CT2_MARKER, owned=CT2_FILES,
                      marked=None)  # CTranslate2's binary model.bin


def convert_model(model: TransformerSeq2Seq, vocabularies: tuple[Vocabulary, Vocabulary], out: str | Path,
                  force: bool = False, what: str = "model") -> Path:
    """Write `model` with its (source, target) vocabularies as a CTranslate2 model directory `out`; returns it."""
    if not isinstance(model, TransformerSeq2Seq):
        raise ConversionError(f"{what}: expected a TransformerSeq2Seq, got {type(model).__name__}; CTranslate2 "
                              "conversion covers the transformer token model only")
    check_convertible(model.spec, what)
    sizes = tuple(len(v) for v in vocabularies)
    if sizes != (model.spec.source_vocab_size, model.spec.target_vocab_size):
        raise ConversionError(f"{what}: vocabularies of sizes {sizes} do not fit the model's (source_vocab_size, "
                              f"target_vocab_size) = {(model.spec.source_vocab_size, model.spec.target_vocab_size)};"
                              " pass the vocabularies it was trained with")
    out = normalized(out)
    check_ct2_destination(out, force)
    converter = Seq2OnnxConverter(model, *vocabularies)
    with staged_directory(out, lambda existing: check_ct2_destination(existing, force)) as staging:
        converter.convert(str(staging), force=True)  # the empty staging directory is ours to replace
    return out


def checkpoint_spec(checkpoint_dir: str | Path) -> ModelSpec:
    """The spec of a checkpoint directory (its spec.json), or CheckpointError; no weights read."""
    try:
        return ModelSpec.from_dict(read_meta(checkpoint_dir).get("spec"))
    except SpecError as err:
        raise CheckpointError(f"checkpoint {str(checkpoint_dir)!r}: its spec.json is invalid ({err}); retrain or "
                              "restore it") from None


def convert(checkpoint_dir: str | Path, out_dir: str | Path, force: bool = False) -> Path:
    """Convert a `seq2onnx train --arch transformer` checkpoint directory into a CTranslate2 model directory."""
    what = f"checkpoint {str(checkpoint_dir)!r}"
    spec = checkpoint_spec(checkpoint_dir)
    check_convertible(spec, what)  # before the weights are read
    check_ct2_destination(normalized(out_dir), force)
    model, _, _ = load_checkpoint(checkpoint_dir)
    return convert_model(model, load_checkpoint_vocabularies(checkpoint_dir), out_dir, force, what)


def source_tokens(texts: list[str], vocab: Vocabulary, spec: ModelSpec) -> list[list[str]]:
    """The token strings our encoder reads for each text (reversed if the model was trained so, then </s>), which
    is what a CTranslate2 translator of the converted model must be given. A special token written in a text reads
    as <unk>, as in `Vocabulary.encode`; unknown tokens CT2 maps to <unk> itself."""
    rows = [[UNK_TOKEN if t in SPECIAL_TOKENS else t for t in vocab.tokenize(text)] for text in texts]  # as encode
    return [(row[::-1] if spec.reverse_source else row) + [EOS_TOKEN] for row in rows]


@click.command()
@click.argument("checkpoint", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Replace an earlier CTranslate2 conversion at OUT.")
def main(checkpoint: Path, out: Path, force: bool) -> None:
    """Convert a seq2onnx transformer CHECKPOINT into a CTranslate2 model directory OUT."""
    try:
        path = convert(checkpoint, out, force)
    except (ConversionError, CheckpointError, DestinationError) as err:
        raise click.ClickException(str(err)) from None
    click.echo(f"wrote {path}")


if __name__ == "__main__":
    main()
