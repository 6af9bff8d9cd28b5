"""Run by tests/test_distributed.py under torchrun (2 ranks, gloo): train each model kind a few steps with DDP and
record, after every step, every rank's parameters and the rows each rank trained on. Rank 0 saves the record to
argv[1]; the test replays the same rows as one process and compares.

Also importable: `models()` builds the same trainers (dist=None) for the single-process reference."""
from __future__ import annotations

import sys
from typing import Any

import torch

from runtime.vocab import Vocabulary
from training.points.data import SeqData, generate_squares
from training.points.trainer import TrainConfig, Trainer, evaluate, spec_for_data
from training.tokens.builtin import generate_reverse
from training.tokens.evaluate import evaluate_tokens
from training.tokens.trainer import TokenTrainConfig, TokenTrainer, spec_for_text

STEPS = 4  # optimizer steps per model kind
ROWS = 37  # an odd count: DistributedSampler pads the shards, and the last batches are short and uneven in padding
BATCH = 6  # per rank; the single-process reference trains on both ranks' rows at once


def models(dist: Any = None) -> dict[str, Any]:
    """Fresh trainers, one per kind, all seeded alike (dropout 0 and teacher forcing 1: deterministic forwards).
    Build them under float64 as default dtype: in float32, Adam turns the rounding noise of gradients that are zero
    in exact arithmetic (a key projection's bias under softmax) into steps of +-lr, which would hide a real
    difference."""
    pairs, val = generate_reverse(ROWS, seed=5), generate_reverse(7, seed=6)
    source, target = (Vocabulary.build(t, "char") for t in (pairs.sources, pairs.targets))
    config = TokenTrainConfig(epochs=1, batch_size=BATCH, lr=3e-3, label_smoothing=0.1, clip=0.5, warmup=2)

    def tokens(**arch: Any) -> TokenTrainer:
        spec = spec_for_text(pairs, source, target, **arch)
        return TokenTrainer(spec, config, pairs, val, source, target, dist)

    squares = SeqData.from_points(generate_squares(ROWS, seed=3))
    held_out = SeqData.from_points(generate_squares(5, seed=4))

    def points(attention: str, heads: int) -> Trainer:
        trainer = Trainer(spec_for_data(squares, 8, attention, heads),
                          TrainConfig(epochs=1, batch_size=BATCH, lr=0.01, teacher_forcing=1.0), squares, held_out,
                          dist)
        trainer._full, trainer._target = trainer._full.double(), trainer._target.double()  # the data is float32
        return trainer

    return {
        "gru": tokens(hidden_dim=16, embedding_dim=8),
        "lstm-additive": tokens(hidden_dim=16, embedding_dim=8, cell="lstm", attention="additive", layers=2),
        "transformer": tokens(arch="transformer", d_model=16, d_ff=32, layers=1, n_heads=2, positional="learned"),
        "points": points("multihead", 2),
        "points-dot": points("dot", 1),  # its attention's value projection is never used: no gradient
    }


def validate(trainer: Any, dist: Any = None) -> Any:
    """The trainer's validation figures (token models: greedy exact and token accuracy; points: MSE)."""
    if isinstance(trainer, TokenTrainer):
        return evaluate_tokens(trainer.model, trainer.val_data, trainer.source_vocab, trainer.target_vocab, dist)
    return evaluate(trainer.model.float(), trainer.val_data, dist)  # the data is float32 (so: after the steps)


def flat(model: torch.nn.Module) -> torch.Tensor:
    """Every parameter, flattened into one float64 vector."""
    return torch.cat([p.detach().double().flatten() for p in model.parameters()])


def main(path: str) -> None:
    import torch.distributed as torch_dist

    from training.distributed import leave, start

    dist = start()
    torch.set_default_dtype(torch.float64)
    record: dict[str, Any] = {"world_size": dist.world_size}
    for name, trainer in models(dist).items():
        trainer.model.train()
        batches = trainer.epoch_batches()
        steps = []
        for index in batches[:STEPS]:
            loss = trainer.train_step(index)
            params = [torch.empty_like(flat(trainer.model)) for _ in range(dist.world_size)]
            torch_dist.all_gather(params, flat(trainer.model))
            rows: list[Any] = [None] * dist.world_size
            torch_dist.all_gather_object(rows, index.tolist())
            losses: list[Any] = [None] * dist.world_size
            torch_dist.all_gather_object(losses, loss)
            steps.append({"params": params, "rows": rows, "losses": losses})
        record[name] = {"steps": steps, "batches": len(batches), "validation": validate(trainer, dist)}
    if dist.is_main:
        torch.save(record, path)
    leave(dist)  # rank 1 comes at once, rank 0 after its save


if __name__ == "__main__":
    main(sys.argv[1])
