"""Properties: whatever a caller passes, or however manifest.json is damaged, only typed errors come back."""
from __future__ import annotations

import copy
import json
import shutil
import tempfile
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from runtime import Seq2Seq
from runtime.contract import MANIFEST_FILE
from runtime.defaults import MAX_TARGET_LEN
from runtime.errors import InputError, Seq2OnnxError

EXAMPLES = 150  # per property; the whole file stays well under a minute on 2 cores
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---- what callers pass -----------------------------------------------------------------------

OBJECTS = st.one_of(  # arbitrary Python values, as a JSON body or a careless caller gives them
    st.none(), st.booleans(), st.integers(-3, 12), st.integers(min_value=MAX_TARGET_LEN + 1), st.integers(max_value=-1),
    st.floats(), st.complex_numbers(), st.text(max_size=3), st.binary(max_size=3), st.builds(object),
    st.lists(st.integers(-2, 2), max_size=3), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.sampled_from([np.int64(3), np.uint8(2), np.float32(2.0), np.array(2), np.array([2, 3]), Fraction(3, 1),
                     Decimal("3"), np.uint64(2**63), 10**30, -(10**30), float("nan")]),
)
DTYPES = st.one_of(
    hnp.floating_dtypes(sizes=(16, 32, 64)), st.just(np.dtype(np.longdouble)), hnp.integer_dtypes(),
    hnp.unsigned_integer_dtypes(), hnp.boolean_dtypes(), hnp.complex_number_dtypes(),
    hnp.unicode_string_dtypes(max_len=3), hnp.byte_string_dtypes(max_len=3), hnp.datetime64_dtypes(),
    hnp.timedelta64_dtypes(), st.just(np.dtype(object)),
)
SHAPES = st.one_of(  # any rank 0-4 with sides 0-4, and often the right rank and width
    hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4),
    st.tuples(st.integers(0, 3), st.integers(0, 4), st.just(2)),
)
NESTED = st.recursive(  # JSON-like nested lists, ragged or not
    st.one_of(st.floats(), st.integers(), st.booleans(), st.none(), st.text(max_size=2)),
    lambda children: st.lists(children, max_size=3), max_leaves=16,
)
VIEWS = ("as is", "strided", "reversed", "list")


def array_of(dtype: np.dtype, shapes: st.SearchStrategy = SHAPES, binary: bool = False) -> st.SearchStrategy:
    """Arrays of one dtype; `binary` mixes 0/1 into numeric elements (for masks)."""
    elements = OBJECTS if dtype.kind == "O" else None
    if binary and dtype.kind in "biuf":
        elements = st.one_of(st.sampled_from([0, 1]), hnp.from_dtype(dtype))
    return hnp.arrays(dtype, shapes, elements=elements)


def view(arr: np.ndarray, how: str) -> Any:
    """The same values as given in another layout: non-contiguous, negative strides, or nested lists."""
    if arr.ndim == 0 or how == "as is":
        return arr
    if how == "strided":
        return np.repeat(arr, 2, axis=-1)[..., ::2]
    if how == "reversed":
        return arr[::-1]
    return arr.tolist()


SOURCES = st.one_of(
    st.tuples(DTYPES.flatmap(array_of), st.sampled_from(VIEWS)).map(lambda pair: view(*pair)),
    NESTED, OBJECTS,
)
TARGET_LENS = st.one_of(st.none(), st.integers(-2, 12), OBJECTS)
GOOD_SOURCES = hnp.arrays(np.float32, st.tuples(st.integers(0, 3), st.integers(1, 4), st.just(2)),
                          elements=st.floats(-10, 10, width=32))


@pytest.fixture(scope="module")
def dot(exports) -> Seq2Seq:
    return Seq2Seq.load(exports["dot"].path, provider="cpu")


def outputs_or_input_error(model: Seq2Seq, source: Any, target_len: Any = None, source_mask: Any = None) -> None:
    """predict returns finite float32 outputs of the right shape, or raises a one-line InputError."""
    try:
        out, attention = model.predict(source, target_len, source_mask, return_attention=True)
    except InputError as err:
        assert "\n" not in str(err)
        return
    empty = isinstance(source, (list, tuple)) and len(source) == 0  # batch 0 with no inner shape: one place
    n, length = (0, 1) if empty else np.asarray(source).shape[:2]
    steps = model.spec.target_len if target_len is None else int(target_len)
    assert out.dtype == np.float32 and out.shape == (n, steps, model.spec.n_features)
    assert attention.dtype == np.float32 and attention.shape == (n, steps, length)
    assert np.isfinite(out).all() and np.isfinite(attention).all()


@PROPERTY
@given(source=SOURCES, target_len=TARGET_LENS)
def test_any_source_and_target_len_give_outputs_or_an_input_error(dot, source, target_len):
    outputs_or_input_error(dot, source, target_len)


@PROPERTY
@given(data=st.data(), source=GOOD_SOURCES)
def test_any_mask_gives_outputs_or_an_input_error(dot, data, source):
    n, length = source.shape[:2]
    shapes = st.sampled_from([(n, 1, length), (n, length), (n, 1, length + 1), (length,)]) | SHAPES
    masks = st.tuples(DTYPES.flatmap(lambda d: array_of(d, shapes, binary=True)), st.sampled_from(VIEWS))
    mask = data.draw(st.one_of(masks.map(lambda pair: view(*pair)), NESTED, OBJECTS), label="source_mask")
    outputs_or_input_error(dot, source, None, mask)


# ---- what a damaged manifest holds -----------------------------------------------------------

JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=4)),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=8,
)
Where = tuple[Any, ...]  # keys and indices from the manifest's root to one value


def paths(node: Any, prefix: Where = ()) -> list[Where]:
    """Every position in a JSON document, the root excluded."""
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    out = []
    for key, child in children:
        out += [(*prefix, key), *paths(child, (*prefix, key))]
    return out


def edited(doc: Any, where: Where, replacement: Any, delete: bool) -> Any:
    """A copy of doc with the value at `where` deleted or replaced."""
    doc = copy.deepcopy(doc)
    parent = doc
    for key in where[:-1]:
        parent = parent[key]
    if delete:
        del parent[where[-1]]
    else:
        parent[where[-1]] = replacement
    return doc


def loads_or_typed_error(export: Path, manifest: bytes, expected: Any) -> None:
    """Load a copy of the export with this manifest: the same model, or a one-line Seq2OnnxError."""
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(shutil.copytree(export, Path(tmp) / "model"))
        (model_dir / MANIFEST_FILE).write_bytes(manifest)
        try:
            model = Seq2Seq.load(model_dir, provider="cpu")
        except Seq2OnnxError as err:
            assert "\n" not in str(err)
            return
        assert model.spec == expected


@pytest.fixture(scope="module")
def manifest(exports) -> tuple[Path, bytes, Any]:
    """The dot export's directory, manifest bytes and spec."""
    return exports["dot"].path, (exports["dot"].path / MANIFEST_FILE).read_bytes(), exports["dot"].spec


@PROPERTY
@given(data=st.data(), delete=st.booleans(), replacement=JSON)
def test_any_json_edit_of_the_manifest_loads_or_raises_a_typed_error(manifest, data, delete, replacement):
    export, raw, spec = manifest
    doc = json.loads(raw)
    everywhere = paths(doc)
    checked = [p for p in everywhere if p[0] not in ("parity", "producer", "created", "source")]
    where = data.draw(st.sampled_from(checked) | st.sampled_from(everywhere), label="where")
    loads_or_typed_error(export, json.dumps(edited(doc, where, replacement, delete)).encode(), spec)


@PROPERTY
@given(data=st.data(), how=st.sampled_from(["flip", "insert", "delete", "truncate"]))
def test_any_byte_edit_of_the_manifest_loads_or_raises_a_typed_error(manifest, data, how):
    export, raw, spec = manifest
    at = data.draw(st.integers(0, len(raw) - 1), label="at")
    if how == "flip":
        damaged = raw[:at] + bytes([raw[at] ^ data.draw(st.integers(1, 255), label="mask")]) + raw[at + 1:]
    elif how == "insert":
        damaged = raw[:at] + data.draw(st.binary(min_size=1, max_size=4), label="bytes") + raw[at:]
    elif how == "delete":
        damaged = raw[:at] + raw[at + data.draw(st.integers(1, 4), label="count"):]
    else:
        damaged = raw[:at]
    loads_or_typed_error(export, damaged, spec)
