"""The HTTP API's request and response bodies as pydantic models (shown at /docs).

Requests are strict (JSON numbers for numbers, true/false for flags, no unknown fields): a typo such as
"beam" for "beam_size" is refused, not ignored. Value ranges are the runtime's to check, with its messages."""
from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class PredictRequest(_Strict):
    """Point models: N source sequences of L points with F features each."""

    source: list[list[list[float]]] = Field(description="(N, L, F) source points",
                                            examples=[[[[-1.0, -1.0], [-1.0, 1.0]]]])
    # checked by the runtime (runtime.point_inputs.check_mask), whose one message names the shape or value refused: a
    # typed nesting here answered a wrong one with each alternative's error, and took no (N, 1, L)
    source_mask: Optional[list[Any]] = Field(
        None, description="(N, L) or (N, 1, L) true/false or 1/0 values: true/1 for a real point, false/0 for "
                          "padding (right-padded); default all real")
    target_len: Optional[int] = Field(None, description="points to predict per item; default the model's")
    return_attention: bool = Field(False, description="also return the attention weights")


class PredictResponse(BaseModel):
    """Predicted points (N, target_len, F) [and attention (N, [heads,] target_len, L)]."""

    outputs: list[list[list[float]]]
    attention: Optional[list[Any]] = None
    export_id: str


class TranslateRequest(_Strict):
    """Token models: texts and decoding options (CTranslate2's names, as `Seq2Seq.translate_batch`)."""

    texts: list[str] = Field(description="the source texts", examples=[["tuesday, march 3 2015", "3/3/15"]])
    beam_size: int = Field(1, description="1: greedy (or sampling); more: beam search, up to this server's "
                                          "max_beam_size (GET /v1/model; a wider beam is answered 400)",
                           json_schema_extra={"minimum": 1})  # stated, not validated: 0 gets the runtime's 400
    num_hypotheses: int = Field(1, description="n-best hypotheses per text (<= beam_size)",
                                json_schema_extra={"minimum": 1})
    length_penalty: float = Field(1.0, description="beam scores are log-prob / length ** length_penalty")
    max_decoding_length: Optional[int] = Field(None, description="output token bound; default the model's; at "
                                                                 "most this server's max_decoding_length (GET "
                                                                 "/v1/model)", json_schema_extra={"minimum": 1})
    min_decoding_length: int = Field(0, description="end-of-sequence is forbidden before this many tokens",
                                     json_schema_extra={"minimum": 0})
    sampling_topk: int = Field(1, description="sample from the k most likely tokens (0: all); 1: no sampling")
    sampling_topp: float = Field(1.0, description="nucleus sampling: the smallest set with this probability")
    sampling_temperature: float = Field(1.0, description="divides the logits before sampling")
    seed: Optional[int] = Field(None, description="sampling seed: equal seeds give equal samples")
    return_attention: bool = Field(False, description="also return each hypothesis' attention (len, L)")

    def options(self) -> dict[str, Any]:
        """The decoding options, as keyword arguments of `Seq2Seq.translate_batch`."""
        return self.model_dump(exclude={"texts"})


class Hypothesis(BaseModel):
    """One hypothesis: its text, tokens and ids (without end-of-sequence), score, summed log-prob, why it ended,
    and its attention where asked for (output tokens by the text's own source positions)."""

    text: str
    tokens: list[str]
    ids: list[int]
    score: float
    log_prob: float
    finish_reason: Literal["eos", "length"] = Field(description="eos: the model ended the text; length: it was cut at "
                                                                "max_decoding_length")
    attention: Optional[list[list[float]]] = None


class TranslateResponse(BaseModel):
    """Per text, its n-best hypotheses, best first."""

    translations: list[list[Hypothesis]]
    export_id: str


class ModelInfo(BaseModel):
    """What this replica serves and how."""

    kind: str
    spec: dict[str, Any]
    export_id: str
    precision: str = Field(description="the export's weights: fp32, int8 or fp16")
    vocabulary_size: Optional[dict[str, int]] = Field(None, description="token models: source and target")
    providers: list[str]
    threads: int = Field(description="onnxruntime intra-op threads of each copy")
    workers: int = Field(1, description="copies of the model, each decoding a batch of its own at once")
    max_batch_size: int
    batch_wait_ms: float
    max_decoding_length: int = Field(description="most output tokens (points: target_len) a request may ask for: "
                                                 "the server's --max-decoding-length, or the model's own length "
                                                 "where that is longer, and never past what the model can produce")
    max_beam_size: Optional[int] = Field(description="the widest beam_size a request may ask for (token models; "
                                                     "null for a point model)")
    replica: str
    node: str
    version: str


class ErrorBody(BaseModel):
    """Every refusal: one line naming the input, what was expected and what was given."""

    error: str
