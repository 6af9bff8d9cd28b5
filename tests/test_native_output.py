"""What torch.onnx's C++ side writes to the process's descriptors during an export: its shape-inference warnings
about packed sequences are dropped (the export checks what they warn of), everything else comes through in order."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from export.native_output import benign_native_warnings_dropped

from support.models import export_token_model, toy_token_spec

PACKED = b"[W1130 19:31:55.844050427 shape_type_inference.cpp:1994] Warning: The shape inference of prim::PackPadded " \
         b"type is missing, so it may result in wrong shape inference for the exported graph.\n"


def test_a_recurrent_token_export_prints_no_packed_sequence_warnings(tmp_path: Path,
                                                                    capfd: pytest.CaptureFixture[str]) -> None:
    """Every GRU/LSTM token export printed three of them ('... may result in wrong shape inference ...'), which
    read as if the graph could be wrong; parity and the symbolic dims are checked on the saved graph."""
    spec = toy_token_spec(cell="lstm", bidirectional=True, attention="dot", hidden_dim=8, embedding_dim=6)
    export_token_model(spec, tmp_path / "model")
    err = capfd.readouterr().err
    assert "PackPadded" not in err and "PadPacked" not in err, err


ORDER = """
import os, sys
from export.native_output import benign_native_warnings_dropped
print("python before", file=sys.stderr)
with benign_native_warnings_dropped():
    os.write(2, b"native inside\\n")
    os.write(2, PACKED)
    os.write(2, PACKED.replace(b"PackPadded", b"PadPacked"))
    print("python inside", file=sys.stderr)
    os.write(2, b"[W] The shape inference of prim::Other type is missing\\n")
print("python after", file=sys.stderr)
"""


def test_other_output_to_stderr_comes_through_in_its_order() -> None:
    """In a process of its own: Python's sys.stderr and the native side both write to descriptor 2, as in a
    command (pytest's capture would give sys.stderr a file of its own)."""
    code = f"PACKED = {PACKED!r}\n{ORDER}"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parents[1], check=True)
    assert result.stderr == ("python before\nnative inside\npython inside\n"
                             "[W] The shape inference of prim::Other type is missing\npython after\n")


CRASH = """
import os
from export.native_output import benign_native_warnings_dropped
with benign_native_warnings_dropped():
    os.write(2, b"held, and lost with the process\\n")
    os.abort()
"""


def test_a_process_that_dies_in_the_block_still_says_where() -> None:
    """What the block held dies with the process; faulthandler, on the real stderr, still names the crash and
    the Python stack it happened under."""
    result = subprocess.run([sys.executable, "-c", CRASH], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == -6
    assert "Fatal Python error: Aborted" in result.stderr and 'File "<string>", line 6' in result.stderr, \
        result.stderr


def test_stderr_is_restored_even_when_the_block_raises(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RuntimeError, match="boom"), benign_native_warnings_dropped():
        os.write(2, b"said before the failure\n")
        raise RuntimeError("boom")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "said before the failure\nafter\n"


@pytest.mark.parametrize("was_enabled", [False, True])
def test_faulthandler_is_left_as_it_was_found(capsys: pytest.CaptureFixture[str], was_enabled: bool) -> None:
    """On where it was on (capsys's stderr has no descriptor: stderr's own then), off where it was off; never on
    the block's own descriptor, closed when the block ends."""
    import faulthandler

    before = faulthandler.is_enabled()
    try:
        faulthandler.enable(file=sys.__stderr__) if was_enabled else faulthandler.disable()
        with benign_native_warnings_dropped():
            assert faulthandler.is_enabled()
        assert faulthandler.is_enabled() == was_enabled
    finally:
        faulthandler.enable(file=sys.__stderr__) if before else faulthandler.disable()
