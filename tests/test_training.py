"""Data, trainer, checkpoints and the `train` command."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner, Result

from cli.main import main
from runtime.contract import (
    CHECKPOINT_HISTORY_FILE,
    CHECKPOINT_PLOT_FILE,
    CHECKPOINT_SPEC_FILE,
    CHECKPOINT_STATE_FILE,
    CHECKPOINT_WEIGHTS_FILE,
    partial_dir,
)
from runtime.destination import DestinationError
from runtime.spec import ModelSpec
from training.checkpoint import CheckpointError, load_checkpoint, read_data_description, read_meta, save_checkpoint
from training.points.data import (
    CORNERS,
    HOLDOUT_FRACTION,
    TEST_SIZE,
    TRAIN_SIZE,
    DataError,
    SeqData,
    describe_dataset,
    generate_squares,
    load_dataset,
    load_npz,
    reload_dataset,
    squares,
)
from training.points.trainer import ConfigError, TrainConfig, Trainer, evaluate, spec_for_data
from training.train_state import load_train_state, save_train_state

from support.processes import child_process
from support.stop_hooks import AS_A_RESUME_STARTS, BEFORE_THE_FIRST_SAVE, DURING_THE_SECOND_SAVE, hook_path

NOISE_BOUND = 0.6  # 6 sd of the 0.1 noise: no sample of a few thousand points gets there
REPO = Path(__file__).resolve().parents[1]
CHECKPOINT_FILES = {CHECKPOINT_SPEC_FILE, CHECKPOINT_WEIGHTS_FILE, CHECKPOINT_HISTORY_FILE,
                    CHECKPOINT_STATE_FILE, CHECKPOINT_PLOT_FILE}


# --- shared helpers ---

@pytest.fixture(scope="module")
def squares_data() -> tuple[SeqData, SeqData]:
    return squares()


def small_data(n: int = 48) -> tuple[SeqData, SeqData]:
    """A small slice of squares, so trainer tests take a fraction of a second."""
    train, test = squares()
    return train.subset(np.arange(n)), test.subset(np.arange(n // 2))


def fit(spec: ModelSpec, config: TrainConfig, data: tuple[SeqData, SeqData]) -> Trainer:
    trainer = Trainer(spec, config, *data)
    trainer.fit(progress=False)
    return trainer


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert list(a) == list(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def direction(points: np.ndarray) -> np.ndarray:
    """Sign of the turn from the first to the second edge: -1 clockwise, +1 counter-clockwise."""
    corners = np.sign(points)
    d1, d2 = corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 1]  # (n, 2)
    return np.sign(d1[:, 0] * d2[:, 1] - d1[:, 1] * d2[:, 0])


# --- the squares generator ---

def test_squares_shapes_and_dtype(squares_data: tuple[SeqData, SeqData]) -> None:
    points = generate_squares(10, seed=1)
    assert points.shape == (10, 4, 2) and points.dtype == np.float32
    train, test = squares_data
    assert (train.n, test.n) == (TRAIN_SIZE, TEST_SIZE) == (256, 128)
    assert train.source.shape == (256, 2, 2) and train.target.shape == (256, 2, 2)
    assert train.source.dtype == train.target.dtype == np.float32


def test_squares_are_noisy_corners_walked_around_the_square() -> None:
    points = generate_squares(1000, seed=3)
    corners = np.sign(points)  # (n, 4, 2)
    assert np.abs(points - corners).max() < NOISE_BOUND
    assert 0.08 < (points - corners).std() < 0.12
    assert set(map(tuple, corners.reshape(-1, 2).astype(int))) == set(map(tuple, CORNERS.astype(int)))
    steps = np.abs(np.diff(corners, axis=1)).sum(axis=-1)  # (n, 3): 2 = one coordinate flipped
    assert (steps == 2).all()
    assert len({tuple(row) for row in corners.reshape(1000, -1)}) == 8  # 4 starts x 2 directions


def test_squares_go_both_ways_and_keep_their_direction() -> None:
    points = generate_squares(400, seed=5)
    first, second = direction(points[:, :3]), direction(points[:, 1:])
    assert np.array_equal(first, second)
    assert 150 < (first == -1).sum() < 250  # about half clockwise


def test_squares_are_deterministic_by_seed() -> None:
    assert np.array_equal(generate_squares(32, seed=7), generate_squares(32, seed=7))
    assert not np.array_equal(generate_squares(32, seed=7), generate_squares(32, seed=8))
    exact = generate_squares(16, seed=7, noise=0.0)
    assert np.array_equal(exact, np.sign(exact))


# --- .npz user data ---

def write_npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def good_arrays(n: int = 10) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"source": rng.normal(size=(n, 3, 2)), "target": rng.normal(size=(n, 2, 2))}


def test_npz_loads_as_float32_and_splits_deterministically(tmp_path: Path) -> None:
    arrays = good_arrays(10)
    path = write_npz(tmp_path / "mine.npz", **arrays)
    data = load_npz(path)
    assert data.source.dtype == np.float32 and data.source.shape == (10, 3, 2) and data.target.shape == (10, 2, 2)
    train, test = load_dataset(path)
    assert (train.n, test.n) == (10 - round(10 * HOLDOUT_FRACTION), round(10 * HOLDOUT_FRACTION))
    rows = {tuple(r) for r in np.concatenate([train.source, test.source]).reshape(10, -1)}
    assert rows == {tuple(r) for r in data.source.reshape(10, -1)}
    again, _ = load_dataset(str(path))
    assert np.array_equal(train.source, again.source)


BAD_NPZ = {
    "missing target": ({"source": np.zeros((4, 2, 2))}, "missing arrays \\['target'\\]"),
    "rank 2": ({"source": np.zeros((4, 2)), "target": np.zeros((4, 2, 2))}, "rank 3"),
    "N mismatch": ({"source": np.zeros((4, 2, 2)), "target": np.zeros((3, 2, 2))}, "same number of sequences"),
    "F mismatch": ({"source": np.zeros((4, 2, 2)), "target": np.zeros((4, 2, 3))}, "same number of features"),
    "NaN": ({"source": np.full((4, 2, 2), np.nan), "target": np.zeros((4, 2, 2))}, "NaN or Inf"),
    "Inf": ({"source": np.zeros((4, 2, 2)), "target": np.full((4, 2, 2), np.inf)}, "NaN or Inf"),
    "float32 overflow": ({"source": np.full((4, 2, 2), 1e300), "target": np.zeros((4, 2, 2))},
                         "beyond the float32 range"),
    "empty": ({"source": np.zeros((0, 2, 2)), "target": np.zeros((0, 2, 2))}, "empty"),
    "bool dtype": ({"source": np.zeros((4, 2, 2), dtype=bool), "target": np.zeros((4, 2, 2))}, "numbers"),
    "str dtype": ({"source": np.full((4, 2, 2), "1"), "target": np.zeros((4, 2, 2))}, "numbers"),
    "an extra array": ({"source": np.zeros((4, 2, 2)), "target": np.zeros((4, 2, 2)),
                        "source_mask": np.ones((4, 2), bool)}, "\\['source_mask'\\] would not be read"),
}


def test_integer_npz_arrays_are_numbers(tmp_path: Path) -> None:
    ints = np.arange(40).reshape(10, 2, 2)
    path = write_npz(tmp_path / "ints.npz", source=ints, target=-ints.astype(np.uint8).astype(np.int16))
    train, test = load_dataset(path)
    assert train.source.dtype == np.float32 and train.n + test.n == 10


@pytest.mark.parametrize("case", list(BAD_NPZ))
def test_bad_npz_is_refused_naming_file_and_problem(tmp_path: Path, case: str) -> None:
    arrays, problem = BAD_NPZ[case]
    path = write_npz(tmp_path / "bad.npz", **arrays)
    with pytest.raises(DataError, match=problem) as err:
        load_dataset(path)
    assert str(path) in str(err.value)


def test_unreadable_npz_files_are_refused(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.npz"
    garbage.write_text("not an archive")
    with pytest.raises(DataError, match="not an .npz"):
        load_npz(garbage)
    single = tmp_path / "single.npz"
    with open(single, "wb") as f:
        np.save(f, np.zeros((2, 2, 2)))
    with pytest.raises(DataError, match="not an .npz"):
        load_npz(single)
    pickled = write_npz(tmp_path / "pickled.npz", source=np.array([{"a": 1}], dtype=object),
                        target=np.zeros((1, 2, 2)))
    with pytest.raises(DataError, match="cannot be read"):
        load_npz(pickled)
    with pytest.raises(DataError, match="does not exist"):
        load_npz(tmp_path / "absent.npz")
    with pytest.raises(DataError, match="neither 'squares' nor an .npz"):
        load_dataset(tmp_path / "data.csv")
    one = write_npz(tmp_path / "one.npz", source=np.zeros((1, 2, 2)), target=np.zeros((1, 2, 2)))
    with pytest.raises(DataError, match="at least 2"):
        load_dataset(one)


def test_reload_refuses_a_changed_file(tmp_path: Path) -> None:
    path = write_npz(tmp_path / "mine.npz", **good_arrays(10))
    description = describe_dataset(path, *load_dataset(path))
    train, _ = reload_dataset(description)
    assert train.n == 8
    write_npz(path, **good_arrays(12))
    with pytest.raises(DataError, match="changed since") as err:
        reload_dataset(description)
    now = describe_dataset(path, *load_dataset(path))
    # only what changed, a hash by its first digits: not the two descriptions whole
    assert f"sha256 {description['sha256'][:12]}... then, {now['sha256'][:12]}... now" in str(err.value)
    assert "n_train 8 then, 10 now" in str(err.value) and "holdout_fraction" not in str(err.value)


# --- the trainer ---

def test_same_seed_same_losses_and_weights() -> None:
    data = small_data()
    spec, config = spec_for_data(data[0]), TrainConfig(epochs=3, seed=4)
    a, b = fit(spec, config, data), fit(spec, config, data)
    assert a.history == b.history and len(a.history["train"]) == 3
    assert_same_weights(a.model.state_dict(), b.model.state_dict())
    c = fit(spec, TrainConfig(epochs=3, seed=5), data)
    assert c.history != a.history


def test_training_reduces_the_loss_and_validation_is_the_eval_mse() -> None:
    data = small_data(96)
    trainer = fit(spec_for_data(data[0]), TrainConfig(epochs=8), data)
    assert trainer.history["train"][-1] < 0.75 * trainer.history["train"][0]
    assert trainer.history["val"][-1] == evaluate(trainer.model, data[1])
    assert not trainer.model.training


@pytest.mark.parametrize(("attention", "heads"), [("none", 1), ("dot", 1), ("multihead", 2)])
def test_resume_from_saved_state_repeats_the_uninterrupted_run(tmp_path: Path, attention: str, heads: int) -> None:
    data = small_data()
    spec = spec_for_data(data[0], attention=attention, n_heads=heads)
    straight = fit(spec, TrainConfig(epochs=6), data)

    first = fit(spec, TrainConfig(epochs=3), data)
    state_file = tmp_path / CHECKPOINT_STATE_FILE
    save_train_state(state_file, first.state_dict(), {"name": "squares"})
    torch.manual_seed(12345)  # whatever ran in between must not matter
    resumed = Trainer(spec, TrainConfig(epochs=6), *data)
    resumed.load_state_dict(load_train_state(state_file))
    resumed.fit(progress=False)

    assert resumed.history == straight.history
    assert_same_weights(resumed.model.state_dict(), straight.model.state_dict())


@pytest.mark.parametrize("batch_size", [1 << 63, 10**21])
def test_a_batch_past_the_data_is_all_of_it_however_large(batch_size: int) -> None:
    """--batch-size 1e21 overflowed torch's int64 split: a traceback."""
    train, test = small_data(8)
    trainer = fit(spec_for_data(train), TrainConfig(epochs=1, batch_size=batch_size), (train, test))
    (batch,) = trainer.epoch_batches()
    assert sorted(batch.tolist()) == list(range(8)) and len(trainer.history["train"]) == 1


def test_a_diverged_run_blames_the_data_scale_only_where_it_is_large() -> None:
    """The hint of a diverged run: the learning rate for data of ordinary scale, the data's scale past SCALE_LIMIT
    (a squared error of 1e20 leaves float32's range whatever the rate)."""
    train, test = small_data(8)
    plain = Trainer(spec_for_data(train), TrainConfig(epochs=1, lr=0.02), train, test)
    assert plain._divergence_hint() == "lower the learning rate (lr=0.02) and start again"
    big = SeqData(train.source * 1e7, train.target, "big")
    hint = Trainer(spec_for_data(big), TrainConfig(epochs=1), big, test)._divergence_hint()
    assert "scale the data" in hint and "learning rate" not in hint and f"{1e7 * np.abs(train.source).max():.3g}" in hint


def test_resume_refuses_a_different_config_or_spec() -> None:
    data = small_data()
    spec = spec_for_data(data[0])
    state = fit(spec, TrainConfig(epochs=2), data).state_dict()
    with pytest.raises(ConfigError, match="lr"):
        Trainer(spec, TrainConfig(epochs=4, lr=0.02), *data).load_state_dict(state)
    with pytest.raises(ConfigError, match="saved for a model of hidden_dim 2, this run 3; resume with the original "
                                          "model options"):  # the keys that differ, not two whole specs
        Trainer(spec_for_data(data[0], hidden_dim=3), TrainConfig(epochs=4), *data).load_state_dict(state)
    with pytest.raises(ConfigError, match="epochs >= 2"):
        Trainer(spec, TrainConfig(epochs=1), *data).load_state_dict(state)


def test_config_and_data_fit_are_checked() -> None:
    with pytest.raises(ConfigError, match="teacher_forcing"):
        TrainConfig(teacher_forcing=1.5)
    with pytest.raises(ConfigError, match="batch_size"):
        TrainConfig(batch_size=0)
    data = small_data()
    with pytest.raises(ConfigError, match="source_len"):
        Trainer(ModelSpec(input_len=3), TrainConfig(), *data)


# --- checkpoint directories ---

@pytest.fixture(scope="module")
def trained() -> Trainer:
    data = small_data()
    return fit(spec_for_data(data[0]), TrainConfig(epochs=2), data)


def save(trainer: Trainer, out: Path, **kwargs: Any) -> Path:
    return save_checkpoint(out, trainer.model, trainer.spec, trainer.config, trainer.history,
                           kwargs.pop("data", {"name": "squares"}), trainer.state_dict(), **kwargs)


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_checkpoint_round_trip(tmp_path: Path, trained: Trainer) -> None:
    out = save(trained, tmp_path / "ck")
    assert {p.name for p in out.iterdir()} == CHECKPOINT_FILES
    assert list(tmp_path.iterdir()) == [out]  # no temp dirs left beside it
    model, spec, history = load_checkpoint(out)
    assert spec == trained.spec and history == trained.history and not model.training
    assert_same_weights(model.state_dict(), trained.model.state_dict())
    meta = json.loads((out / CHECKPOINT_SPEC_FILE).read_text())
    assert meta["spec"] == spec.to_dict() and meta["train"] == trained.config.to_dict()
    assert read_data_description(out) == {"name": "squares"}
    assert load_train_state(out / CHECKPOINT_STATE_FILE)["epoch"] == 2
    assert (out / CHECKPOINT_PLOT_FILE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    probe = tmp_path / "probe"
    probe.mkdir()
    assert out.stat().st_mode == probe.stat().st_mode  # the umask's permissions, not a temp dir's private 0700


def test_loading_keeps_the_callers_rng(tmp_path: Path, trained: Trainer) -> None:
    out = save(trained, tmp_path / "ck")
    before = torch.get_rng_state()
    load_checkpoint(out)
    assert torch.equal(before, torch.get_rng_state())


def test_existing_checkpoint_is_not_replaced_without_force(tmp_path: Path, trained: Trainer) -> None:
    out = save(trained, tmp_path / "ck")
    before = snapshot(out)
    other = fit(trained.spec, TrainConfig(epochs=1, seed=1), small_data())
    with pytest.raises(DestinationError, match=r"pass --force \(force=True in Python\) to replace it") as err:
        save(other, out)
    assert str(out) in str(err.value) and isinstance(err.value, FileExistsError)
    assert snapshot(out) == before
    save(other, out, force=True)
    assert snapshot(out) != before
    assert_same_weights(load_checkpoint(out)[0].state_dict(), other.model.state_dict())
    assert list(tmp_path.iterdir()) == [out]


def test_failure_mid_write_leaves_nothing_behind(tmp_path: Path, trained: Trainer) -> None:
    unserialisable = {"name": "squares", "opened": object()}  # json.dump fails after the weights are written
    with pytest.raises(TypeError):
        save(trained, tmp_path / "ck", data=unserialisable)
    assert list(tmp_path.iterdir()) == []
    out = save(trained, tmp_path / "ck")
    before = snapshot(out)
    with pytest.raises(TypeError):
        save(trained, out, data=unserialisable, force=True)
    assert snapshot(out) == before and list(tmp_path.iterdir()) == [out]


class Sneaky(OrderedDict):
    """A dict subclass: valid content, but unpickling it imports this module, which weights_only refuses."""


def test_weights_are_loaded_with_weights_only(tmp_path: Path, trained: Trainer) -> None:
    out = save(trained, tmp_path / "ck")
    weights, state = out / CHECKPOINT_WEIGHTS_FILE, out / CHECKPOINT_STATE_FILE
    torch.save(Sneaky(trained.model.state_dict()), weights)
    torch.save(Sneaky(load_train_state(state)), state)
    # Control: full unpickling would accept both files as they are.
    trained.model.load_state_dict(torch.load(weights, weights_only=False))
    assert torch.load(state, weights_only=False)["epoch"] == 2
    with pytest.raises(CheckpointError, match=CHECKPOINT_WEIGHTS_FILE):
        load_checkpoint(out)
    with pytest.raises(CheckpointError, match=CHECKPOINT_STATE_FILE):
        load_train_state(state)


def test_a_checkpoint_without_its_history_still_loads(tmp_path: Path, trained: Trainer) -> None:
    """history.json is a record (export, verify and bench never read it): its loss does not refuse the model; a
    damaged one still names itself."""
    out = save(trained, tmp_path / "ck")
    (out / CHECKPOINT_HISTORY_FILE).unlink()
    model, spec, history = load_checkpoint(out)
    assert history == {} and spec == trained.spec
    assert_same_weights(model.state_dict(), trained.model.state_dict())
    (out / CHECKPOINT_HISTORY_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match=f"{CHECKPOINT_HISTORY_FILE}.* is not readable JSON .*; or delete it "
                       r"\(a record of the losses: export, verify and bench do not need it\)"):  # not 'do not read'
        load_checkpoint(out)  # it said they 'do not read it' while refusing for it
    (out / CHECKPOINT_HISTORY_FILE).unlink()
    (out / CHECKPOINT_HISTORY_FILE).mkdir()  # it said 'is missing'
    with pytest.raises(CheckpointError, match=f"{CHECKPOINT_HISTORY_FILE}' is not a file .*; or delete it"):
        load_checkpoint(out)


@pytest.mark.parametrize("damage", ["no dir", "no weights", "bad json", "truncated weights", "wrong spec"])
def test_missing_or_corrupt_checkpoint_names_the_file(tmp_path: Path, trained: Trainer, damage: str) -> None:
    out = save(trained, tmp_path / "ck")
    culprit = {"no dir": out, "no weights": out / CHECKPOINT_WEIGHTS_FILE, "bad json": out / CHECKPOINT_SPEC_FILE,
               "truncated weights": out / CHECKPOINT_WEIGHTS_FILE, "wrong spec": out / CHECKPOINT_WEIGHTS_FILE}[damage]
    if damage == "no dir":
        culprit = tmp_path / "absent"
    elif damage == "no weights":
        culprit.unlink()
    elif damage == "bad json":
        culprit.write_text("{not json")
    elif damage == "truncated weights":
        culprit.write_bytes(culprit.read_bytes()[:100])
    else:
        meta = json.loads((out / CHECKPOINT_SPEC_FILE).read_text())
        meta["spec"]["hidden_dim"] = 3
        (out / CHECKPOINT_SPEC_FILE).write_text(json.dumps(meta))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(culprit if damage == "no dir" else out)
    assert str(culprit) in str(err.value)
    assert isinstance(err.value, OSError)


# --- the `train` command ---

def run_cli(*args: str) -> Result:
    return CliRunner().invoke(main, ["train", "--quiet", *args], catch_exceptions=False)


def test_train_help() -> None:
    result = CliRunner().invoke(main, ["train", "--help"])
    assert result.exit_code == 0
    for option in ("--data", "--attention", "--heads", "--hidden-dim", "--epochs", "--batch-size", "--lr",
                   "--teacher-forcing", "--seed", "--out", "--resume", "--force"):
        assert option in result.output


def test_cli_resume_continues_a_finished_and_an_interrupted_run(tmp_path: Path) -> None:
    straight, extended, interrupted = tmp_path / "straight", tmp_path / "extended", tmp_path / "interrupted"
    assert run_cli("--epochs", "6", "--out", str(straight)).exit_code == 0
    assert run_cli("--epochs", "3", "--out", str(extended)).exit_code == 0
    assert run_cli("--resume", "--epochs", "6", "--out", str(extended)).exit_code == 0

    # An interrupted run: saved each epoch into <out>.partial as the command does, stopped by Ctrl-C after epoch 3.
    train, test = squares()
    trainer = Trainer(spec_for_data(train), TrainConfig(epochs=6), train, test)

    def save_then_interrupt(t: Trainer) -> None:
        save_train_state(partial_dir(interrupted) / CHECKPOINT_STATE_FILE, t.state_dict(),
                         describe_dataset("squares", train, test))
        if t.epoch == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        trainer.fit(save_then_interrupt, progress=False)
    result = run_cli("--resume", "--out", str(interrupted))  # --epochs 6 comes from the saved state
    assert result.exit_code == 0, result.output
    assert not partial_dir(interrupted).exists()

    reference, _, history = load_checkpoint(straight)
    for out in (extended, interrupted):
        model, _, resumed_history = load_checkpoint(out)
        assert resumed_history == history and len(history["train"]) == 6
        assert_same_weights(model.state_dict(), reference.state_dict())


def test_cli_refuses_to_overwrite_and_checks_resume_options(tmp_path: Path) -> None:
    out = tmp_path / "ck"
    assert run_cli("--epochs", "1", "--out", str(out)).exit_code == 0
    before = snapshot(out)
    result = CliRunner().invoke(main, ["train", "--quiet", "--epochs", "1", "--out", str(out)])
    assert result.exit_code == 1 and "pass --force (force=True in Python) to replace it" in result.output
    assert snapshot(out) == before
    result = CliRunner().invoke(main, ["train", "--quiet", "--resume", "--lr", "0.02", "--epochs", "2",
                                       "--out", str(out)])
    assert result.exit_code == 2 and "--lr" in result.output and "0.01" in result.output
    result = CliRunner().invoke(main, ["train", "--quiet", "--resume", "--out", str(out)])
    assert result.exit_code == 2 and "already trained for 1 epochs; pass --epochs 2 or more" in result.output
    result = CliRunner().invoke(main, ["train", "--quiet", "--resume", "--out", str(tmp_path / "none")])
    assert result.exit_code == 2 and "nothing to resume" in result.output

    fresh = tmp_path / "fresh"
    save_train_state(partial_dir(fresh) / CHECKPOINT_STATE_FILE, load_train_state(out / CHECKPOINT_STATE_FILE),
                     read_data_description(out))
    result = CliRunner().invoke(main, ["train", "--quiet", "--epochs", "1", "--out", str(fresh)])
    assert result.exit_code == 1 and "pass --resume to continue it or --force" in result.output
    result = CliRunner().invoke(main, ["train", "--quiet", "--force", "--epochs", "1", "--out", str(fresh)])
    assert result.exit_code == 0 and fresh.is_dir() and not partial_dir(fresh).exists()


def test_resume_refuses_the_state_of_another_model_and_keeps_the_checkpoint(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    assert run_cli("--epochs", "1", "--out", str(ours)).exit_code == 0
    assert run_cli("--epochs", "1", "--hidden-dim", "3", "--out", str(theirs)).exit_code == 0
    shutil.copy(theirs / CHECKPOINT_STATE_FILE, ours / CHECKPOINT_STATE_FILE)  # swapped in by hand
    before = snapshot(ours)
    result = CliRunner().invoke(main, ["train", "--quiet", "--resume", "--epochs", "2", "--out", str(ours)])
    assert result.exit_code == 1, result.output
    assert "is of another model than" in result.output and "hidden_dim" in result.output, result.output
    assert snapshot(ours) == before and not partial_dir(ours).exists()
    # a state that is the checkpoint's own still resumes (its spec.json holds the same spec)
    assert run_cli("--resume", "--epochs", "2", "--out", str(theirs)).exit_code == 0
    # an interrupted --force run that trains another model in place of ours resumes too (its state is in .partial)
    save_train_state(partial_dir(ours) / CHECKPOINT_STATE_FILE, load_train_state(theirs / CHECKPOINT_STATE_FILE),
                     read_data_description(theirs))
    assert run_cli("--resume", "--epochs", "3", "--out", str(ours)).exit_code == 0
    assert load_checkpoint(ours)[1].hidden_dim == 3 and not partial_dir(ours).exists()


def test_resume_to_fewer_epochs_than_saved_is_a_usage_error(tmp_path: Path) -> None:
    done, interrupted = tmp_path / "done", tmp_path / "interrupted"
    assert run_cli("--epochs", "2", "--out", str(done)).exit_code == 0
    save_train_state(partial_dir(interrupted) / CHECKPOINT_STATE_FILE,
                     load_train_state(done / CHECKPOINT_STATE_FILE), read_data_description(done))
    result = CliRunner().invoke(main, ["train", "--quiet", "--resume", "--epochs", "1", "--out", str(interrupted)])
    assert result.exit_code == 2 and "at epoch 2, past --epochs 1" in result.output, result.output
    assert not interrupted.exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--attention", "dot", "--heads", "3"], "need --attention multihead"),
    (["--teacher-forcing", "1.5"], "--teacher-forcing"),
    (["--attention", "bahdanau"], "--attention"),
])
def test_cli_option_mistakes(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["train", "--quiet", "--out", str(tmp_path / "ck"), *args])
    assert result.exit_code == 2 and message in result.output
    assert not (tmp_path / "ck").exists()


def test_cli_refuses_a_bad_npz(tmp_path: Path) -> None:
    bad = write_npz(tmp_path / "bad.npz", source=np.zeros((4, 2, 2)))
    result = CliRunner().invoke(main, ["train", "--quiet", "--data", str(bad), "--out", str(tmp_path / "ck")])
    # The file exists, so this is bad data (exit 1, one line), not bad usage (exit 2 with a usage block).
    assert result.exit_code == 1 and "missing arrays ['target']" in result.output
    assert "Usage:" not in result.output


def cli_command() -> list[str]:
    """The installed console script, or the same entry point through the interpreter."""
    script = Path(sys.executable).with_name("seq2onnx")
    return [str(script)] if script.exists() else [sys.executable, "-c", "from cli.main import main; main()"]


def test_cli_end_to_end_in_a_subprocess(tmp_path: Path) -> None:
    out = tmp_path / "ck"
    proc = subprocess.run([*cli_command(), "train", "--epochs", "3", "--attention", "multihead", "--out", str(out)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    mse = float(re.search(r"test MSE: ([0-9.]+)", proc.stdout).group(1))
    model, spec, history = load_checkpoint(out)
    assert spec.attention == "multihead" and spec.n_heads == 2 and len(history["val"]) == 3
    assert mse == pytest.approx(history["val"][-1], abs=1e-5)
    assert "epoch" in proc.stderr  # the progress bar
    assert not partial_dir(out).exists()


def _stop_once_saved(tmp_path: Path, sig: int) -> tuple[Path, Path, int, str]:
    """A long `train` to tmp_path/ck, sent `sig` once it saved a state: --out, the state, exit code, stderr."""
    out = tmp_path / "ck"
    state = partial_dir(out) / CHECKPOINT_STATE_FILE
    with child_process([*cli_command(), "train", "--quiet", "--epochs", "100000", "--out", str(out)],
                       cwd=tmp_path) as proc:
        deadline = time.monotonic() + 120
        while not state.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=120)
    return out, state, proc.returncode, stderr


def test_ctrl_c_then_resume_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    out, state, code, stderr = _stop_once_saved(tmp_path, signal.SIGINT)
    assert code == 130, stderr
    assert "rerun with --resume to continue" in stderr and "Traceback" not in stderr
    assert not out.exists()
    # which epoch the state holds is said (with --save-every, the epochs after it are lost)
    assert f"the last saved state (of epoch {load_train_state(state)['epoch']}) is in" in stderr, stderr
    epochs = str(load_train_state(state)["epoch"] + 2)
    assert run_cli("--resume", "--epochs", epochs, "--out", str(out)).exit_code == 0
    assert run_cli("--epochs", epochs, "--out", str(tmp_path / "straight")).exit_code == 0
    resumed, straight = load_checkpoint(out), load_checkpoint(tmp_path / "straight")
    assert resumed[2] == straight[2]
    assert_same_weights(resumed[0].state_dict(), straight[0].state_dict())


def test_sigterm_stops_training_as_ctrl_c_does_and_exits_143(tmp_path: Path) -> None:
    """SIGTERM (a service manager's stop) once a state was saved: the run stops, says where, keeps the state; it
    killed the process at once before, with no word of what was kept."""
    out, state, code, stderr = _stop_once_saved(tmp_path, signal.SIGTERM)
    assert code == 143, stderr
    assert "Error: train: stopped by SIGTERM during epoch" in stderr, stderr  # named, as every command's stop
    assert "rerun with --resume to continue" in stderr, stderr
    assert "Traceback" not in stderr and not out.exists() and load_train_state(state)["epoch"] >= 0


def test_a_run_stopped_says_what_was_kept_in_the_launchers_words(tmp_path: Path) -> None:
    """One process (and rank 0 under torchrun) and the launcher (cli.launch._kept) name what was kept alike, with
    the same punctuation, whether or not a state was saved."""
    from cli.launch import _kept
    from training.distributed import Terminated
    from training.ranks import stopped_early

    out = tmp_path / "ckpt"
    missing = tmp_path / "ckpt.partial" / "train_state.pt"
    for err, why in ((KeyboardInterrupt(), "interrupted"), (Terminated(), "stopped by SIGTERM")):
        said = str(stopped_early(err, 0, missing, None))
        assert said == f"{why} during epoch 0; no training state was saved yet; rerun to start again", said
    assert said.endswith(f"; {_kept(out, None, missing)}"), (said, _kept(out, None, missing))
    # a --resume extending the finished `out`, stopped before it saved a state: `out` is what was kept
    said = str(stopped_early(KeyboardInterrupt(), 2, missing, None, extending=out))
    assert said == f"interrupted during epoch 2; {str(out)!r} is as it was; rerun with --resume to extend it", said
    assert said.endswith(f"; {_kept(out, None, missing, extending=True)}")
    saved = tmp_path / "train_state.pt"
    saved.write_bytes(b"")
    kept, said = _kept(out, None, saved), str(stopped_early(KeyboardInterrupt(), 0, saved, None))
    assert kept.startswith(said.split("; ", 1)[1]), (said, kept)  # the launcher adds "(with any number of processes)"
    # stopped once the last epoch was done (while the checkpoint was being made): not "during epoch 31" of 30
    assert str(stopped_early(KeyboardInterrupt(), 31, saved, None, 30)).startswith("interrupted after the last "
                                                                                   "epoch (30); the last saved")
    assert str(stopped_early(KeyboardInterrupt(), 30, saved, None, 30)).startswith("interrupted during epoch 30;")
    assert str(stopped_early(KeyboardInterrupt(), 53, saved, None, 400, 50)) == (
        f"interrupted during epoch 53; the last saved state (of epoch 50) is in {str(saved)!r}; rerun with --resume "
        "to continue")


def test_a_resume_that_extends_a_finished_run_stopped_before_a_save_says_out_is_as_it_was(tmp_path: Path) -> None:
    """It said "no training state was saved yet; rerun to start again", though the finished checkpoint was kept
    and a rerun without --resume refuses to replace it (found by a fresh walk)."""
    out = tmp_path / "ck"
    assert run_cli("--epochs", "1", "--quiet", "--out", str(out)).exit_code == 0
    before = (out / "weights.pt").read_bytes()
    env = {**os.environ, "PYTHONPATH": hook_path(tmp_path, BEFORE_THE_FIRST_SAVE)}
    with child_process([*cli_command(), "train", "--resume", "--epochs", "3", "--quiet", "--out", str(out)],
                       cwd=tmp_path, env=env) as proc:
        _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 143, stderr
    last = stderr.strip().splitlines()[-1]  # (the hook stops it as epoch 2 ends: "during epoch 3")
    assert last.startswith("Error: train: stopped by SIGTERM during epoch "), stderr
    assert last.endswith(f"; {str(out)!r} is as it was; rerun with --resume to extend it"), stderr
    assert (out / "weights.pt").read_bytes() == before and not partial_dir(out).exists()
    assert run_cli("--resume", "--epochs", "2", "--quiet", "--out", str(out)).exit_code == 0  # as it says


def test_a_stop_during_a_state_save_lands_once_the_state_is_written(tmp_path: Path) -> None:
    """SIGTERM inside the save of epoch 2's state: the save completes, then the run stops keeping epoch 2 (the save
    was cut, and the line said 'during epoch 3 ... (of epoch 1)': an epoch trained, lost; found by a fresh walk)."""
    out = tmp_path / "ck"
    state = partial_dir(out) / CHECKPOINT_STATE_FILE
    env = {**os.environ, "PYTHONPATH": hook_path(tmp_path, DURING_THE_SECOND_SAVE)}
    with child_process([*cli_command(), "train", "--epochs", "4", "--quiet", "--out", str(out)], cwd=tmp_path,
                       env=env) as proc:
        _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 143, stderr
    assert load_train_state(state)["epoch"] == 2
    assert stderr.strip().splitlines()[-1] == (f"Error: train: stopped by SIGTERM during epoch 3; the last saved "
                                               f"state (of epoch 2) is in {str(state)!r}; rerun with --resume to "
                                               "continue"), stderr


@pytest.mark.parametrize("resumed", ["interrupted", "finished"])
def test_a_resume_stopped_as_it_starts_says_what_it_resumes_is_as_it_was(tmp_path: Path, resumed: str) -> None:
    """It said only "nothing was written", not that the state it was to resume is still there."""
    if resumed == "interrupted":
        out, state, code, _ = _stop_once_saved(tmp_path, signal.SIGTERM)
        assert code == 143
        said = f"the saved state in {str(state)!r} is as it was; rerun with --resume to continue"
    else:
        out, state = tmp_path / "ck", tmp_path / "ck" / CHECKPOINT_STATE_FILE
        assert run_cli("--epochs", "1", "--out", str(out)).exit_code == 0
        said = f"{str(out)!r} is as it was; rerun with --resume to extend it"
    before, epochs = state.read_bytes(), str(load_train_state(state)["epoch"] + 1)  # (unstopped: a short run)
    with child_process([sys.executable, "-c", AS_A_RESUME_STARTS, "train", "--resume", "--epochs", epochs,
                        "--quiet", "--out", str(out)], cwd=tmp_path) as proc:
        _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 143, stderr
    assert stderr.strip().splitlines() == [f"Error: train: stopped by SIGTERM; nothing was written (outputs are "
                                           f"published whole or not at all); {said}"], stderr
    assert state.read_bytes() == before


def test_cli_bad_data_path_is_one_line_without_traceback(tmp_path: Path) -> None:
    proc = subprocess.run([*cli_command(), "train", "--data", str(tmp_path / "nope.npz")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "nope.npz" in errors[0] and "does not exist" in errors[0]
    assert not (tmp_path / "artifacts").exists()


NO_TORCH = """
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):  # as Python says a module it cannot find
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoTorch())
from cli.main import main
main(sys.argv[1:], prog_name="seq2onnx")
"""


@pytest.mark.parametrize(("args", "code", "expected"), [
    (["--help"], 0, "train"),
    (["train", "--help"], 0, "--teacher-forcing"),
    (["train", "--epochs", "1"], 1, "install the 'train' extra"),
])
def test_train_command_without_torch(args: list[str], code: int, expected: str) -> None:
    proc = subprocess.run([sys.executable, "-c", NO_TORCH, *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert proc.returncode == code, proc.stderr
    assert expected in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(("meta", "says"), [({}, "has no format_version;"),
                                           ({"format_version": 7}, "has format_version 7;"),
                                           ({"format_version": True}, "has format_version True;"),
                                           ({"format_version": 1.0}, "has format_version 1.0;")])
def test_a_checkpoint_of_no_or_another_format_version_says_which(tmp_path: Path, meta: dict, says: str) -> None:
    (tmp_path / "spec.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=re.escape(says) + ".*reads checkpoints of format_version 1"):
        read_meta(tmp_path)


def test_a_torchrun_restart_count_that_is_not_a_number_is_one_line(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """TORCHELASTIC_RESTART_COUNT (torchrun's) set by hand to something else: one line naming it, nothing written
    (a ValueError traceback before)."""
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "x")
    result = CliRunner().invoke(main, ["train", "--quiet", "--epochs", "1", "--out", str(tmp_path / "ck")])
    assert result.exit_code == 1, result.output
    assert "Error: TORCHELASTIC_RESTART_COUNT='x' in the environment: expected a whole number 0 or more" in \
        result.output, result.output
    assert sorted(tmp_path.iterdir()) == []


def test_point_data_of_any_suffix_case_trains(tmp_path: Path) -> None:
    """`--data DATA.NPZ` trains as `.npz` does (infer reads .NPZ; train said only .tsv marks a TSV file)."""
    rng = np.random.default_rng(0)
    source = rng.normal(size=(40, 3, 2)).astype(np.float32)
    np.savez(tmp_path / "data.npz", source=source, target=source[:, :2])
    (tmp_path / "data.npz").rename(tmp_path / "DATA.NPZ")
    proc = subprocess.run([*cli_command(), "train", "--data", "DATA.NPZ", "--epochs", "1", "--hidden-dim", "4",
                           "--quiet", "--threads", "1", "--out", "ckpt"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "ckpt" / "spec.json").is_file()


@pytest.mark.parametrize("history", [
    {"train": [1.07], "val": [1.1]},  # one epoch: was an empty plot (a line of one point, no marker)
    {"train": [2.1, 2.07, 2.05, 2.04], "val": [2.2, 2.1, 2.08, 2.06]},  # narrow: minor ticks read 2.07x10^0
    {"train_loss": [1.2, 0.8, 0.5], "val_exact": [0.1, 0.4, 0.6], "val_token": [0.5, 0.7, 0.8]},
], ids=["points, 1 epoch", "points, 4 epochs", "tokens, 3 epochs"])
def test_loss_plots_show_every_epoch_whole_epochs_and_plain_numbers_inside_the_picture(history: dict) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from training.plots import point_history_figure, token_history_figure

    figure = (token_history_figure if "train_loss" in history else point_history_figure)(history)
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    ax = figure.axes[0]
    assert all(line.get_marker() == "o" for line in ax.get_lines())
    epochs = len(next(iter(history.values())))
    shown = [tick for tick in ax.get_xticks() if ax.get_xlim()[0] <= tick <= ax.get_xlim()[1]]
    assert shown and all(float(tick).is_integer() and 1 <= tick <= epochs for tick in shown), shown
    labels = [t.get_text() for t in ax.get_yticklabels(minor=True) + ax.get_yticklabels()]
    assert any(labels) and not any("10^" in text or "times" in text for text in labels), labels
    renderer = canvas.get_renderer()
    box = ax.yaxis.label.get_window_extent(renderer)  # the point plot's y label was cut off at the left edge
    assert box.x0 >= 0 and ax.yaxis.label.get_text(), box
