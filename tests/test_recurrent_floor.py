"""benchmarks/recurrent_floor.py: a recurrent export's batch-1 call beside onnxruntime's own recurrent kernel."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.models import export_token_model, toy_token_spec

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "recurrent_floor.py"
ROWS = ("call", "runs", "encoder", "loop", "rnn", "rnn loop", "empty loop", "API")
ROW = re.compile(r"^ *(call|runs|encoder|loop|rnn|rnn loop|empty loop|API) +(-?\d+\.\d)(?:  (.+))?$")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--repeats", "2", *args],
                          capture_output=True, text=True, timeout=300)


def rows(stdout: str) -> dict[str, tuple[float, str]]:
    """{row: (microseconds, note)} of the table between the header and the shares line."""
    lines = stdout.strip().splitlines()
    matches = [ROW.match(line) for line in lines[1:-1]]
    assert all(matches), lines
    assert lines[-1].startswith("rnn: ") and "of the encoder's run; rnn loop: " in lines[-1], lines[-1]
    return {m[1]: (float(m[2]), m[3] or "") for m in matches}


LSTM_SPEC = dict(cell="lstm", layers=2, attention="dot", hidden_dim=8, embedding_dim=6)


@pytest.fixture(scope="module")
def lstm_export(tmp_path_factory):
    """Two stacked LSTM layers: two LSTM nodes in the encoder, a (2, batch, 8) decoder state."""
    return export_token_model(toy_token_spec(**LSTM_SPEC), tmp_path_factory.mktemp("lstm") / "model")


def test_a_token_model_is_timed_beside_its_own_encoder_node(recurrent_export):
    done = run(str(recurrent_export.path), "--source-len", "4", "--target-len", "3")
    assert done.returncode == 0, done.stderr
    assert "source 4 (5 encoder positions), target 3" in done.stdout.splitlines()[0]  # the text's </s> is read too
    found = rows(done.stdout)
    assert tuple(found) == ROWS
    assert found["rnn"][1] == "GRU bidirectional, hidden 8, over 5 positions"  # the export's own node
    assert found["rnn loop"][1].startswith("GRU, hidden 8, input 6, 3 steps: ")  # the decoder's sizes
    assert all(us > 0 for name, (us, _) in found.items() if name != "API")


def test_a_point_model_and_a_stacked_lstm_model_get_their_kind_of_kernel(exports, lstm_export):
    done = run(str(exports["dot"].path), "--source-len", "6", "--target-len", "2")
    assert done.returncode == 0, done.stderr
    spec = exports["dot"].spec
    found = rows(done.stdout)
    assert found["rnn"][1] == f"GRU forward, hidden {spec.hidden_dim}, over 6 positions"
    assert found["rnn loop"][1].startswith(f"GRU, hidden {spec.hidden_dim}, input {spec.n_features}, 2 steps")
    # a point model's greedy graph runs its steps in a Scan (export.scan_steps): so do the two built rows
    assert found["rnn loop"][1].endswith(" (a Scan)") and found["empty loop"][1].endswith(" (a Scan)")
    done = run(str(lstm_export.path), "--source-len", "3", "--target-len", "2")
    assert done.returncode == 0, done.stderr
    found = rows(done.stdout)
    assert found["rnn"][1] == "2 x LSTM forward, hidden 8, over 4 positions"  # every layer's node
    assert found["rnn loop"][1].startswith("2 x LSTM, hidden 8, input 6, 2 steps: ")
    assert "Scan" not in found["rnn loop"][1] + found["empty loop"][1]  # a token model's Loop stops at </s>


@pytest.mark.filterwarnings("ignore::export.api.QualityLossWarning")  # accepted: the loss is not what is tested
@pytest.mark.parametrize(("options", "node", "dtype"), [
    (dict(quantize="int8"), "2 x DynamicQuantizeLSTM forward", "float32"),  # timed as quantized as exported
    (dict(dtype="fp16"), "2 x LSTM forward", "float16"),
])
def test_converted_exports_are_timed_in_their_own_kernels(tmp_path, options, node, dtype):
    export = export_token_model(toy_token_spec(**LSTM_SPEC), tmp_path / "model", accept_quality_loss=True,
                                **options)
    done = run(str(export.path), "--source-len", "3", "--target-len", "2")
    assert done.returncode == 0, done.stderr
    assert f"{dtype} recurrences" in done.stdout.splitlines()[0]
    found = rows(done.stdout)
    assert found["rnn"][1] == f"{node}, hidden 8, over 4 positions"
    assert found["rnn loop"][1].startswith("2 x LSTM, hidden 8, input 6, 2 steps: ")


@pytest.mark.parametrize(("args", "says"), [
    ([], "no manifest found"),
    (["transformer"], "a transformer has no recurrent kernel; this measures recurrent models"),
    (["--source-len", "2000"], "'--source-len': 2000 tokens: {tokens} reads at most"),
    (["--threads", "999"], "'--threads': expected 1.."),
    (["--repeats", "0"], "'--repeats': 0 is not in the range"),
])
def test_bad_models_and_options_are_refused_in_one_line(tmp_path, recurrent_export, transformer_export, args, says):
    tokens = recurrent_export.path
    target = tmp_path if not args else transformer_export.path if args == ["transformer"] else tokens
    done = run(str(target), *[a for a in args if a != "transformer"])
    assert done.returncode != 0 and "Traceback" not in done.stderr and not done.stdout
    assert says.format(tokens=tokens) in done.stderr, done.stderr
