"""Tiny ONNX stand-ins for CosyVoice 2's `speech_tokenizer_v2.onnx` and `campplus.onnx`, with
their input/output layout, dtypes and shape behaviour, and seeded weights (weights.py), built with
onnx.helper so the project venv and the reference venv (make_frontend.py) write the same graphs.

speech tokenizer: feats [1, 128, T] float32, feats_length [1] int32 -> tokens [1, T'] int64,
  frames at or past feats_length masked; two stride-2 convolutions (k 3, pad 1) as the real
  encoder's, so T' = ceil(ceil(T / 2) / 2): 100 Hz mel -> 25 Hz tokens; argmax over 6561 codes.
campplus: fbank [1, T, 80] float32 -> embedding [1, 192] float32 (time mean, then linear).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from fixtures.cosyvoice2.tiny import SEED
from fixtures.cosyvoice2.weights import make_state_dict, tensors_sha256
from onnx import TensorProto, helper, numpy_helper

TOKENIZER_SHAPES: dict[str, list[int]] = {
    "conv1.weight": [8, 128, 3],
    "conv1.bias": [8],
    "conv2.weight": [6561, 8, 3],
    "conv2.bias": [6561],
}
CAMPPLUS_SHAPES: dict[str, list[int]] = {"head.weight": [80, 192], "head.bias": [192]}
OPSET = 17


def _model(graph) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8  # readable by older onnxruntime builds too
    onnx.checker.check_model(model)
    return model


def tokenizer_model(seed: int = SEED) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    w = make_state_dict(seed, TOKENIZER_SHAPES)
    inits = [numpy_helper.from_array(v, name=k) for k, v in w.items()]
    inits += [
        numpy_helper.from_array(np.array([2], dtype=np.int64), "i2"),
        numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
        numpy_helper.from_array(np.array(1, dtype=np.int64), "one"),
        numpy_helper.from_array(np.array([0, 1], dtype=np.int64), "axes01"),
    ]
    nodes = [
        helper.make_node("Shape", ["feats"], ["shape"]),
        helper.make_node("Gather", ["shape", "i2"], ["t1"], axis=0),
        helper.make_node("Squeeze", ["t1"], ["t"]),
        helper.make_node("Range", ["zero", "t", "one"], ["frames"]),
        helper.make_node("Cast", ["feats_length"], ["len64"], to=TensorProto.INT64),
        helper.make_node("Less", ["frames", "len64"], ["valid"]),
        helper.make_node("Cast", ["valid"], ["validf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["validf", "axes01"], ["mask"]),  # [1, 1, T]
        helper.make_node("Mul", ["feats", "mask"], ["masked"]),
        helper.make_node(
            "Conv",
            ["masked", "conv1.weight", "conv1.bias"],
            ["h1"],
            strides=[2],
            pads=[1, 1],
            kernel_shape=[3],
        ),
        helper.make_node("Relu", ["h1"], ["a1"]),
        helper.make_node(
            "Conv",
            ["a1", "conv2.weight", "conv2.bias"],
            ["logits"],
            strides=[2],
            pads=[1, 1],
            kernel_shape=[3],
        ),
        helper.make_node("ArgMax", ["logits"], ["indices"], axis=1, keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "speech_tokenizer_standin",
        [
            helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, 128, "T"]),
            helper.make_tensor_value_info("feats_length", TensorProto.INT32, [1]),
        ],
        [helper.make_tensor_value_info("indices", TensorProto.INT64, [1, "T_tokens"])],
        inits,
    )
    return _model(graph), w


def campplus_model(seed: int = SEED) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    w = make_state_dict(seed, CAMPPLUS_SHAPES)
    inits = [numpy_helper.from_array(v, name=k) for k, v in w.items()]
    nodes = [
        helper.make_node("ReduceMean", ["input"], ["pooled"], axes=[1], keepdims=0),  # [1, 80]
        helper.make_node("MatMul", ["pooled", "head.weight"], ["proj"]),
        helper.make_node("Add", ["proj", "head.bias"], ["output"]),
    ]
    graph = helper.make_graph(
        nodes,
        "campplus_standin",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, "T", 80])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 192])],
        inits,
    )
    return _model(graph), w


def write_standins(folder: Path, seed: int = SEED) -> tuple[Path, Path, dict]:
    """Writes speech_tokenizer_v2.onnx and campplus.onnx into folder; returns their paths and
    the weights' record (names, shapes, tensors_sha256) as the fixture json stores it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok, tok_w = tokenizer_model(seed)
    cam, cam_w = campplus_model(seed)
    tok_path, cam_path = folder / "speech_tokenizer_v2.onnx", folder / "campplus.onnx"
    onnx.save(tok, str(tok_path))
    onnx.save(cam, str(cam_path))
    record = {
        "seed": seed,
        "speech_tokenizer": {"shapes": TOKENIZER_SHAPES, "tensors_sha256": tensors_sha256(tok_w)},
        "campplus": {"shapes": CAMPPLUS_SHAPES, "tensors_sha256": tensors_sha256(cam_w)},
    }
    return tok_path, cam_path, record
