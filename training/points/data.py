"""Sequence data: the book's noisy squares, and user data from .npz files."""
from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.model_files import sha256_file
from training.data import HOLDOUT_FRACTION, SPLIT_SEED, DataError, reload_unchanged

CORNERS = np.array([[-1, -1], [-1, 1], [1, 1], [1, -1]], dtype=np.float32)  # clockwise
SQUARES = "squares"
NOISE = 0.1
SOURCE_POINTS = 2  # the first two corners are the source, the last two the target
TRAIN_SIZE, TRAIN_SEED = 256, 13
TEST_SIZE, TEST_SEED = 128, 19

NPZ_KEYS = ("source", "target")


def generate_squares(n: int, seed: int, noise: float = NOISE) -> np.ndarray:
    """Noisy squares (n, 4, 2): the corners from a random start, clockwise or counter-clockwise at random."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(4, size=n)[:, None]  # (n, 1)
    clockwise = rng.integers(2, size=n).astype(bool)[:, None]  # (n, 1)
    steps = np.arange(4)[None, :]  # (1, 4)
    order = np.where(clockwise, (starts + steps) % 4, (starts - steps) % 4)  # (n, 4)
    points = CORNERS[order] + rng.normal(0.0, noise, size=(n, 4, 2))  # (n, 4, 2)
    return points.astype(np.float32)


@dataclass(frozen=True)
class SeqData:
    """Source (N, Ls, F) and target (N, Lt, F) float32 arrays with matching N and F."""

    source: np.ndarray
    target: np.ndarray
    origin: str = "<arrays>"

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", _checked(self.source, "source", self.origin))
        object.__setattr__(self, "target", _checked(self.target, "target", self.origin))
        (ns, _, fs), (nt, _, ft) = self.source.shape, self.target.shape
        if ns != nt:
            raise DataError(f"{self.origin}: 'source' and 'target' must hold the same number of sequences; "
                            f"got {ns} and {nt}; give one target per source")
        if fs != ft:
            raise DataError(f"{self.origin}: 'source' and 'target' must have the same number of features; "
                            f"got {fs} and {ft}; both must be (N, L, F) with the same F")

    @classmethod
    def from_points(cls, points: np.ndarray, origin: str = "<arrays>") -> "SeqData":
        """Split full sequences (N, L, F) into the first SOURCE_POINTS and the rest."""
        return cls(points[:, :SOURCE_POINTS], points[:, SOURCE_POINTS:], origin)

    @property
    def n(self) -> int:
        """Number of sequences."""
        return int(self.source.shape[0])

    @property
    def input_len(self) -> int:
        """Source length Ls."""
        return int(self.source.shape[1])

    @property
    def target_len(self) -> int:
        """Target length Lt."""
        return int(self.target.shape[1])

    @property
    def n_features(self) -> int:
        """Features per point F."""
        return int(self.source.shape[2])

    def subset(self, index: np.ndarray) -> "SeqData":
        """The sequences at `index`, in that order."""
        return SeqData(self.source[index], self.target[index], self.origin)


def _checked(array: Any, key: str, origin: str) -> np.ndarray:
    """Validate one (N, L, F) float array and return it as contiguous float32."""
    array = np.asarray(array)
    if array.dtype.kind not in "fiu":  # integers are numbers too (JSON and CSV writers drop the ".0")
        raise DataError(f"{origin}: array {key!r} must hold numbers (float or int), got dtype {array.dtype}; "
                        f"convert it, e.g. {key}.astype('float32')")
    if array.ndim != 3:
        raise DataError(f"{origin}: array {key!r} must have rank 3 (N, L, F), got shape {array.shape}; "
                        "reshape single-feature data to (N, L, 1)")
    if 0 in array.shape:
        raise DataError(f"{origin}: array {key!r} is empty (shape {array.shape}); "
                        "it needs at least one sequence of at least one point")
    if not np.isfinite(array).all():
        bad = int(np.size(array) - np.isfinite(array).sum())
        raise DataError(f"{origin}: array {key!r} has {bad} NaN or Inf values; drop or fill those sequences")
    with np.errstate(over="ignore"):  # values beyond float32 become Inf and are reported just below
        cast = np.ascontiguousarray(array, dtype=np.float32)
    if not np.isfinite(cast).all():
        first = array[~np.isfinite(cast)].flat[0]
        raise DataError(f"{origin}: array {key!r} has values beyond the float32 range (+-3.4e38), e.g. {first:g}; "
                        "rescale the data")
    return cast


def load_npz(path: str | Path) -> SeqData:
    """Read an .npz holding float arrays `source` (N, Ls, F) and `target` (N, Lt, F)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {str(path)!r} does not exist; pass 'squares' or a path to an .npz file")
    if not zipfile.is_zipfile(path):
        raise DataError(f"{path}: is not an .npz (zip) archive; save it with np.savez(path, source=..., target=...)")
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in NPZ_KEYS if k not in npz.files]
            if missing:
                raise DataError(f"{path}: missing arrays {missing}; expected keys {list(NPZ_KEYS)}, "
                                f"found {sorted(npz.files)}; save with np.savez(path, source=..., target=...)")
            unknown = sorted(set(npz.files) - set(NPZ_KEYS))
            if unknown:  # a mask or lengths array would not be read: training on its padding without a word
                raise DataError(f"{path}: has arrays {sorted(npz.files)}; expected {list(NPZ_KEYS)} and nothing "
                                f"else ({unknown} would not be read; every position of source and target is "
                                "trained on); save with np.savez(path, source=..., target=...)")
            arrays = {k: npz[k] for k in NPZ_KEYS}
    except DataError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise DataError(f"{path}: cannot be read as an .npz of numeric arrays ({err}); "
                        "save it with np.savez(path, source=..., target=...)") from err
    return SeqData(arrays["source"], arrays["target"], origin=str(path))


def squares() -> tuple[SeqData, SeqData]:
    """The book's train (256, seed 13) and test (128, seed 19) noisy squares."""
    train = generate_squares(TRAIN_SIZE, TRAIN_SEED)
    test = generate_squares(TEST_SIZE, TEST_SEED)
    return SeqData.from_points(train, "squares/train"), SeqData.from_points(test, "squares/test")


def holdout_split(data: SeqData) -> tuple[SeqData, SeqData]:
    """Deterministic split: a SPLIT_SEED permutation, HOLDOUT_FRACTION (at least one) held out as test."""
    if data.n < 2:
        raise DataError(f"{data.origin}: holds {data.n} sequence; at least 2 are needed "
                        f"to hold out {HOLDOUT_FRACTION:.0%} as a test set")
    n_test = max(1, round(data.n * HOLDOUT_FRACTION))
    order = np.random.default_rng(SPLIT_SEED).permutation(data.n)
    return data.subset(np.sort(order[n_test:])), data.subset(np.sort(order[:n_test]))


def is_point_data(name: str) -> bool:
    """A --data value names point data ('squares', PATH.npz) rather than text data."""
    return name == SQUARES or name.lower().endswith(".npz")  # any case, as infer reads .NPZ


def _is_squares(name_or_path: str | Path) -> bool:
    return isinstance(name_or_path, str) and name_or_path == SQUARES


def load_dataset(name_or_path: str | Path) -> tuple[SeqData, SeqData]:
    """`"squares"` -> the built-in pair; a path to an .npz -> (train, held-out test)."""
    if _is_squares(name_or_path):
        return squares()
    path = Path(name_or_path)
    if path.suffix.lower() != ".npz":
        raise DataError(f"data {str(name_or_path)!r} is neither 'squares' nor an .npz file; "
                        "pass 'squares' or a path ending in .npz")
    return holdout_split(load_npz(path))


def describe_dataset(name_or_path: str | Path, train: SeqData, test: SeqData) -> dict[str, Any]:
    """Plain-JSON description of where the data came from, enough to reload and verify it."""
    sizes = {"n_train": train.n, "n_test": test.n}
    if _is_squares(name_or_path):
        return {"name": SQUARES, "noise": NOISE, "train_seed": TRAIN_SEED, "test_seed": TEST_SEED, **sizes}
    path = Path(name_or_path).resolve()
    return {"name": "npz", "path": str(path), "sha256": sha256_file(path),
            "holdout_fraction": HOLDOUT_FRACTION, "split_seed": SPLIT_SEED, **sizes}


def reload_dataset(description: dict[str, Any]) -> tuple[SeqData, SeqData]:
    """Load the data a description names, refusing a file that changed since it was described."""
    source = SQUARES if description.get("name") == SQUARES else description.get("path")
    if not isinstance(source, str):
        raise DataError(f"data description {description!r} names neither 'squares' nor a file path")
    return reload_unchanged(source, description, load_dataset, describe_dataset)

