"""Read a Piper voice's ONNX graph into VITS weights and dims.

Piper exports its generator with `torch.onnx.export`, which keeps most parameter names
(`enc_p.encoder.attn_layers.0.conv_q.weight`) but folds some into generated constants:

* weight-normed convolutions (the flow's WaveNet layers) become `onnx::Conv_NNNN`; the Conv node
  that consumes each one is still named after its module (`/flow/flows.0/enc/in_layers.0/Conv`),
* an embedding table may carry an unrelated name (`sid` for `enc_p.emb.weight`); its Gather node
  is `/enc_p/emb/Gather`,
* `exp(-logs)` of the duration predictor's first affine flow is folded, to
  `/dp/flows.0/Exp_output_0` or to the input of the `/dp/flows.0/Exp` node.

So each parameter is found through the graph node that uses it, and every size of the model is
read from tensor shapes and node attributes (strides, dilations), never from the file name.
Anything that does not fit raises `VoiceLoadError` naming the tensor.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np

from ...errors import VoiceLoadError
from ...models.vits import VitsDims, VitsModel

_PARAM_NAME = re.compile(r"^(enc_p|dp|flow|dec|emb_g)\.[\w.]+$")
_MODULE_ROOTS = ("enc_p", "dp", "flow", "dec", "emb_g")


class OnnxVits:
    """The parts of a Piper ONNX export that describe the generator."""

    def __init__(self, path: str | Path):
        import onnx
        from onnx import numpy_helper

        try:
            model = onnx.load(str(path))
        except Exception as e:  # onnx raises DecodeError, OSError, ...
            raise VoiceLoadError(f"cannot read ONNX model {path}: {e}") from e
        graph = model.graph
        self.path = Path(path)
        self.inputs = [i.name for i in graph.input]
        self.initializers: dict[str, np.ndarray] = {
            t.name: numpy_helper.to_array(t) for t in graph.initializer
        }
        self.nodes = list(graph.node)
        self.nodes_by_name = {n.name: n for n in self.nodes}

    def attribute(self, node_name: str, attr: str) -> list[int] | None:
        import onnx

        node = self.nodes_by_name.get(node_name)
        if node is None:
            return None
        for a in node.attribute:
            if a.name == attr:
                return list(onnx.helper.get_attribute_value(a))
        return None


def _module_path(node_name: str) -> str | None:
    """'/flow/flows.0/enc/in_layers.0/Conv' -> 'flow.flows.0.enc.in_layers.0'."""
    parts = [p for p in node_name.split("/") if p]
    if len(parts) < 2 or parts[0] not in _MODULE_ROOTS:
        return None
    return ".".join(parts[:-1])


def extract_state_dict(src: OnnxVits) -> dict[str, np.ndarray]:
    """Map the graph's initializers to VITS parameter names."""
    inits = src.initializers
    sd: dict[str, np.ndarray] = {name: arr for name, arr in inits.items() if _PARAM_NAME.match(name)}

    for node in src.nodes:
        path = _module_path(node.name)
        if path is None:
            continue
        if node.op_type in ("Conv", "ConvTranspose"):
            roles = {1: "weight", 2: "bias"}
        elif node.op_type == "Gather" and len(node.input) == 2 and node.input[1] in src.inputs:
            roles = {0: "weight"}  # embedding lookup of a graph input (ids or speaker id)
        else:
            continue
        for pos, role in roles.items():
            if pos >= len(node.input) or node.input[pos] not in inits:
                continue
            tensor_name = node.input[pos]
            if _PARAM_NAME.match(tensor_name):
                continue  # already named
            key = f"{path}.{role}"
            if key in sd and not np.array_equal(sd[key], inits[tensor_name]):
                raise VoiceLoadError(
                    f"{src.path}: parameter {key} is given twice with different values "
                    f"({tensor_name})"
                )
            sd[key] = inits[tensor_name]

    # ElementwiseAffine's logs enters as exp(-logs): the exporter folds either the negation
    # (an Exp node reading -logs) or the whole exp (an initializer named .../Exp_output_0)
    for node in src.nodes:
        path = _module_path(node.name)
        if (node.op_type == "Exp" and path and path.startswith("dp.") and node.input[0] in inits
                and not _PARAM_NAME.match(node.input[0]) and f"{path}.m" in sd):
            sd[f"{path}.logs"] = -inits[node.input[0]]
    for name, arr in inits.items():
        m = re.fullmatch(r"/(dp(?:/[\w.]+)*)/Exp_output_0", name)
        if m and f"{m.group(1).replace('/', '.')}.m" in sd:
            if np.any(arr <= 0):
                raise VoiceLoadError(f"{src.path}: tensor {name} should be exp(-logs) > 0")
            sd[f"{m.group(1).replace('/', '.')}.logs"] = (-np.log(arr.astype(np.float64))).astype(arr.dtype)
    return sd


def _indices(sd: dict[str, np.ndarray], pattern: str) -> list[int]:
    rx = re.compile(pattern)
    found = sorted({int(m.group(1)) for k in sd if (m := rx.fullmatch(k))})
    return found


def _need(sd: dict[str, np.ndarray], key: str, where: Path) -> np.ndarray:
    if key not in sd:
        raise VoiceLoadError(f"{where}: tensor {key} not found in the ONNX graph")
    return sd[key]


def infer_dims(src: OnnxVits, sd: dict[str, np.ndarray]) -> VitsDims:
    """Every size from tensor shapes and node attributes."""
    p = src.path
    emb = _need(sd, "enc_p.emb.weight", p)
    n_vocab, hidden = emb.shape
    layers = _indices(sd, r"enc_p\.encoder\.attn_layers\.(\d+)\.conv_q\.weight")
    if not layers or layers != list(range(len(layers))):
        raise VoiceLoadError(f"{p}: text encoder layers not found (enc_p.encoder.attn_layers.N)")
    rel_k = _need(sd, "enc_p.encoder.attn_layers.0.emb_rel_k", p)
    if rel_k.ndim != 3 or rel_k.shape[0] != 1:
        raise VoiceLoadError(
            f"{p}: tensor enc_p.encoder.attn_layers.0.emb_rel_k has shape {rel_k.shape}; "
            "expected [1, 2w+1, k_channels] (heads sharing relative embeddings)"
        )
    k_channels = rel_k.shape[2]
    if hidden % k_channels:
        raise VoiceLoadError(f"{p}: emb_rel_k width {k_channels} does not divide hidden {hidden}")
    ffn1 = _need(sd, "enc_p.encoder.ffn_layers.0.conv_1.weight", p)
    inter2 = _need(sd, "enc_p.proj.weight", p).shape[0]

    use_sdp = "dp.flows.0.m" in sd
    if use_sdp:
        dp_pre = _need(sd, "dp.pre.weight", p)
        dp_filter, dp_kernel = dp_pre.shape[0], _need(sd, "dp.convs.convs_sep.0.weight", p).shape[2]
        conv_flows = _indices(sd, r"dp\.flows\.(\d+)\.proj\.weight")
        if not conv_flows:
            raise VoiceLoadError(f"{p}: stochastic duration predictor flows (dp.flows.N.proj) not found")
        dp_n_flows = (max(conv_flows) + 1) // 2
        proj_out = sd[f"dp.flows.{conv_flows[0]}.proj.weight"].shape[0]
        if (proj_out + 1) % 3:
            raise VoiceLoadError(f"{p}: tensor dp.flows.{conv_flows[0]}.proj.weight has {proj_out} outputs; expected 3K-1")
        dp_bins = (proj_out + 1) // 3
    else:
        c1 = _need(sd, "dp.conv_1.weight", p)
        dp_filter, dp_kernel, dp_n_flows, dp_bins = c1.shape[0], c1.shape[2], 0, 10

    flows = _indices(sd, r"flow\.flows\.(\d+)\.pre\.weight")
    if not flows:
        raise VoiceLoadError(f"{p}: residual coupling flows (flow.flows.N.pre) not found")
    f0 = flows[0]
    wn_layers = _indices(sd, rf"flow\.flows\.{f0}\.enc\.in_layers\.(\d+)\.weight")
    if not wn_layers:
        raise VoiceLoadError(
            f"{p}: flow.flows.{f0}.enc.in_layers.0.weight not found; its Conv node should be named "
            f"/flow/flows.{f0}/enc/in_layers.0/Conv"
        )
    in0 = sd[f"flow.flows.{f0}.enc.in_layers.0.weight"]
    dil_rate = 1
    if len(wn_layers) > 1:
        d = src.attribute(f"/flow/flows.{f0}/enc/in_layers.1/Conv", "dilations")
        dil_rate = d[0] if d else 1

    ups = _indices(sd, r"dec\.ups\.(\d+)\.weight")
    if not ups:
        raise VoiceLoadError(f"{p}: decoder upsampling layers (dec.ups.N.weight) not found")
    up_kernels, up_rates = [], []
    for i in ups:
        w = sd[f"dec.ups.{i}.weight"]
        up_kernels.append(w.shape[2])
        strides = src.attribute(f"/dec/ups.{i}/ConvTranspose", "strides")
        if not strides:
            raise VoiceLoadError(f"{p}: ConvTranspose node /dec/ups.{i}/ConvTranspose (for its stride) not found")
        up_rates.append(strides[0])
    resblock = "1" if "dec.resblocks.0.convs1.0.weight" in sd else "2"
    n_res = len(_indices(sd, r"dec\.resblocks\.(\d+)\.convs1?\.0\.weight"))
    if n_res == 0 or n_res % len(ups):
        raise VoiceLoadError(f"{p}: found {n_res} decoder resblocks for {len(ups)} upsampling layers")
    per_up = n_res // len(ups)
    rk, rd = [], []
    conv_name = "convs1" if resblock == "1" else "convs"
    for j in range(per_up):
        rk.append(sd[f"dec.resblocks.{j}.{conv_name}.0.weight"].shape[2])
        n_convs = len(_indices(sd, rf"dec\.resblocks\.{j}\.{conv_name}\.(\d+)\.weight"))
        dil = []
        for c in range(n_convs):
            d = src.attribute(f"/dec/resblocks.{j}/{conv_name}.{c}/Conv", "dilations")
            if not d:
                raise VoiceLoadError(f"{p}: Conv node /dec/resblocks.{j}/{conv_name}.{c}/Conv (for its dilation) not found")
            dil.append(d[0])
        rd.append(tuple(dil))

    n_speakers, gin = 1, 0
    if "emb_g.weight" in sd:
        n_speakers, gin = sd["emb_g.weight"].shape

    return VitsDims(
        n_vocab=int(n_vocab),
        hidden_channels=int(hidden),
        filter_channels=int(ffn1.shape[0]),
        n_heads=int(hidden // k_channels),
        n_layers=len(layers),
        kernel_size=int(ffn1.shape[2]),
        window_size=int((rel_k.shape[1] - 1) // 2),
        inter_channels=int(inter2 // 2),
        use_sdp=use_sdp,
        dp_filter_channels=int(dp_filter),
        dp_kernel_size=int(dp_kernel),
        dp_n_flows=int(dp_n_flows),
        dp_num_bins=int(dp_bins),
        flow_n_flows=len(flows),
        flow_hidden_channels=int(sd[f"flow.flows.{f0}.pre.weight"].shape[0]),
        flow_kernel_size=int(in0.shape[2]),
        flow_dilation_rate=int(dil_rate),
        flow_n_layers=len(wn_layers),
        resblock=resblock,
        resblock_kernel_sizes=tuple(int(k) for k in rk),
        resblock_dilation_sizes=tuple(tuple(int(x) for x in d) for d in rd),
        upsample_rates=tuple(int(r) for r in up_rates),
        upsample_initial_channel=int(_need(sd, "dec.conv_pre.weight", p).shape[0]),
        upsample_kernel_sizes=tuple(int(k) for k in up_kernels),
        n_speakers=int(n_speakers),
        gin_channels=int(gin),
    )


def check_state_dict(expected: dict[str, tuple[int, ...]], sd: dict[str, np.ndarray], where: Path) -> None:
    """Every model parameter present with its shape; nothing of the generator left over."""
    missing = [k for k in expected if k not in sd]
    if missing:
        raise VoiceLoadError(
            f"{where}: {len(missing)} parameter(s) not found in the ONNX graph, first: {missing[0]}"
            + (f" (also {', '.join(missing[1:4])}{'...' if len(missing) > 4 else ''})" if len(missing) > 1 else "")
        )
    for k, shape in expected.items():
        if tuple(sd[k].shape) != tuple(shape):
            raise VoiceLoadError(
                f"{where}: tensor {k} has shape {list(sd[k].shape)}, the model expects {list(shape)}"
            )
    # dp.flows.1 and the posterior flows are training-only: an export never has them, and a
    # checkpoint that does has nothing we would run. Anything else unknown is a structure we
    # do not understand.
    extra = [k for k in sd if k not in expected and not re.match(r"dp\.(flows\.1\.|post_)", k)]
    if extra:
        counts = Counter(k.split(".")[0] for k in extra)
        raise VoiceLoadError(
            f"{where}: tensor {extra[0]} does not belong to any VITS inference module "
            f"({len(extra)} such tensors: {dict(counts)})"
        )


def read_piper_onnx(path: str | Path) -> tuple[VitsDims, dict[str, np.ndarray]]:
    """Piper ONNX file -> (dims, state dict of float32 numpy arrays), checked."""
    src = OnnxVits(path)
    sd = extract_state_dict(src)
    dims = infer_dims(src, sd)
    import torch

    with torch.device("meta"):
        model = VitsModel(dims)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    check_state_dict(expected, sd, src.path)
    return dims, {k: np.ascontiguousarray(sd[k], dtype=np.float32) for k in expected}
