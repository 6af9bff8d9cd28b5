"""A token model's special ids: where a sequence starts and ends, padding, and unknown tokens (stdlib only).

seq2onnx's own models share one fixed layout, <pad> <s> </s> <unk> at ids 0..3 (`FIXED`); a model brought in
through a declared contract names its own ids (the PyTorch tutorial's translation model: SOS 0, EOS 1, no padding
or unknown id), and its vocabularies and decoding follow them."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import Seq2OnnxError, brief, is_count

ROLES = ("bos", "eos", "pad", "unk")  # pad and unk may be absent (None)
PAD, BOS, EOS, UNK = 0, 1, 2, 3  # seq2onnx's own fixed ids: every one of its vocabularies starts with these four
PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)  # in id order


class SpecialsError(Seq2OnnxError, ValueError):
    """Special ids that cannot work: missing, negative, repeated, or outside a vocabulary."""


@dataclass(frozen=True)
class Specials:
    """bos starts every decode, eos ends a sequence (and closes each source where the model was trained so); pad
    fills batches out to one length (None: the runtime pads with eos, which the lengths then exclude; it may be
    bos's or eos's id, as in models trained so); unk stands for tokens the vocabulary lacks (None: such text is
    refused, naming the token)."""

    bos: int
    eos: int
    pad: int | None = None
    unk: int | None = None
    _ids: frozenset[int] = field(init=False, repr=False, compare=False)  # every id given, computed once

    def __post_init__(self) -> None:
        for role in ROLES:
            value = getattr(self, role)
            if value is None and role in ("pad", "unk"):
                continue
            if not is_count(value):
                optional = " or None" if role in ("pad", "unk") else ""
                raise SpecialsError(f"special id {role!r} must be an int >= 0{optional}, got {brief(value)}")
        # pad may share bos's or eos's id (the PyTorch tutorial pads with SOS 0); the others must differ
        given = {role: getattr(self, role) for role in ("bos", "eos", "unk") if getattr(self, role) is not None}
        repeated = sorted(role for role, value in given.items() if list(given.values()).count(value) > 1)
        if self.pad is not None and self.pad == self.unk:
            repeated = sorted({*repeated, "pad", "unk"})
        if repeated:
            raise SpecialsError(f"special ids bos, eos and unk must differ (pad may be bos's or eos's), got "
                                f"{self.to_dict()} ({' and '.join(repeated)} share an id)")
        object.__setattr__(self, "_ids", frozenset(getattr(self, r) for r in ROLES if getattr(self, r) is not None))

    @property
    def ids(self) -> frozenset[int]:
        """Every special id given."""
        return self._ids

    @property
    def filler(self) -> int:
        """What pads a batch: pad, else eos (past each row's length, where the encoder does not read)."""
        return self.eos if self.pad is None else self.pad

    def check_fits(self, size: int, what: str) -> None:
        """Every id given lies inside a vocabulary of `size` ids."""
        outside = {role: getattr(self, role) for role in ROLES if (getattr(self, role) or 0) >= size}
        if outside:
            raise SpecialsError(f"special ids {outside} are outside the {what}, which holds ids 0..{size - 1}")

    def to_dict(self) -> dict[str, int | None]:
        return {role: getattr(self, role) for role in ROLES}

    @classmethod
    def from_dict(cls, data: Any) -> "Specials":
        """Rebuild from `to_dict`'s form, refusing unknown or missing roles by name."""
        if not isinstance(data, dict) or set(data) != set(ROLES):
            got = sorted(data) if isinstance(data, dict) else brief(data)
            raise SpecialsError(f"special ids must be an object with exactly {list(ROLES)}, got {got}")
        return cls(**data)


FIXED = Specials(bos=BOS, eos=EOS, pad=PAD, unk=UNK)  # seq2onnx's own models: <pad> <s> </s> <unk>
