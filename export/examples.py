"""What the graphs are traced on: example sizes of batch >= 2 and length >= 2, so no exporter can mistake a dim for a
constant, and what one model kind hands the exporter (`Traced`)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.contract import BATCH, PAST_LEN, PRESENT_LEN, ROWS, SOURCE_LEN

EXAMPLE_BATCH, EXAMPLE_SOURCE_LEN = 3, 5
EXAMPLE_BEAM = 2  # a beam step is traced on EXAMPLE_BATCH inputs of this many rows each
EXAMPLE_LENGTHS = (5, 2, 4)  # token models: right-padded rows of unequal length
# Token models: the step is traced on the state after this many steps, so a transformer's cache is not empty (0)
# and does not grow to 1 in the example either.
EXAMPLE_PAST_LEN = 2
EXAMPLE_SIZES = {BATCH: EXAMPLE_BATCH, SOURCE_LEN: EXAMPLE_SOURCE_LEN, PAST_LEN: EXAMPLE_PAST_LEN,
                 PRESENT_LEN: EXAMPLE_PAST_LEN + 1, ROWS: EXAMPLE_BATCH * EXAMPLE_BEAM}
# A transformer's position table must hold the examples' positions: every source token, and the traced step's.
MIN_EXPORT_POSITIONS = max(EXAMPLE_SOURCE_LEN, EXAMPLE_PAST_LEN + 1)


@dataclass(frozen=True)
class Traced:
    """One model's export modules and their example inputs: the encoder's arguments, the step inputs the encoder
    does not make, and how many steps the example state advances before the step is traced."""

    encoder: torch.nn.Module
    step: torch.nn.Module
    encoder_args: tuple[torch.Tensor, ...]
    step_inputs: dict[str, torch.Tensor]
    steps: int = 0
