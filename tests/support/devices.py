"""The execution devices the tests run on: CPU, and CUDA where a session really gets it."""
from __future__ import annotations

import onnxruntime as ort


def cuda_really_works() -> bool:
    """True only when a session asked for CUDA reports it in get_providers()."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return False
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
    except Exception:
        return False
    return "CUDAExecutionProvider" in session.get_providers()


DEVICES = ["cpu"] + (["cuda"] if cuda_really_works() else [])
