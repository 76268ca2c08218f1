"""cosyvoice2.yaml, read as data: the model folder's configuration, without running it.

Upstream's file is HyperPyYAML: `!new:module.Class` builds an object, `!name:f` binds a
function, `!apply:f` calls one at load time, `!ref <key>` refers to another entry (with
arithmetic: `!ref <a> * <b>`). Loading it as upstream does would import and call whatever the
file names, so here every tag becomes a `Tagged` node (tag, target, arguments), nothing is
imported or called, `!ref` is resolved against the top-level keys, and the classes named are
checked against what a CosyVoice 2 model is.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ...errors import VoiceLoadError

MAX_CONFIG_BYTES = 1 << 20

LLM_CLASS = "cosyvoice.llm.llm.Qwen2LM"
FLOW_CLASS = "cosyvoice.flow.flow.CausalMaskedDiffWithXvec"
HIFT_CLASS = "cosyvoice.hifigan.generator.HiFTGenerator"


@dataclass(frozen=True)
class Tagged:
    """A tagged node: `!new:cosyvoice.flow.flow.CausalMaskedDiffWithXvec {...}` ->
    Tagged("new", "cosyvoice.flow.flow.CausalMaskedDiffWithXvec", {...})."""

    tag: str
    target: str
    value: Any


class _Loader(yaml.SafeLoader):
    """SafeLoader that turns HyperPyYAML's tags into data."""


def _construct(loader: _Loader, suffix: str, node: yaml.Node) -> Tagged:
    tag, _, target = suffix.partition(":")
    if isinstance(node, yaml.MappingNode):
        value: Any = loader.construct_mapping(node, deep=True)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_scalar(node)
    return Tagged(tag, target, value)


_Loader.add_multi_constructor("!", _construct)

_REF = re.compile(r"<([A-Za-z_][A-Za-z0-9_.]*)>")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv}


def _arith(expr: str, where: str) -> Any:
    """Numbers and + - * / // only (a `!ref` expression once its references are numbers)."""

    def ev(n: ast.AST) -> Any:
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, float, str)):
            return n.value
        if isinstance(n, ast.BinOp) and type(n.op) in _OPS:
            return _OPS[type(n.op)](ev(n.left), ev(n.right))
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return -ev(n.operand)
        raise VoiceLoadError(f"cosyvoice2.yaml: {where}: unsupported !ref expression {expr!r}")

    try:
        return ev(ast.parse(expr, mode="eval"))
    except SyntaxError:
        raise VoiceLoadError(f"cosyvoice2.yaml: {where}: unsupported !ref expression {expr!r}") from None


def _resolve(node: Any, top: dict, where: str, depth: int = 0) -> Any:
    if depth > 32:
        raise VoiceLoadError(f"cosyvoice2.yaml: {where}: !ref nested too deeply (a cycle?)")
    if isinstance(node, Tagged):
        if node.tag == "ref":
            text = str(node.value).strip()
            refs = _REF.findall(text)
            if not refs:
                raise VoiceLoadError(f"cosyvoice2.yaml: {where}: !ref without a <key>: {text!r}")
            values = {}
            for r in refs:
                head = r.split(".")[0]
                if head not in top:
                    raise VoiceLoadError(f"cosyvoice2.yaml: {where}: !ref <{r}>: no top-level key {head!r}")
                values[r] = _resolve(top[head], top, head, depth + 1)
            if text == f"<{refs[0]}>":
                return values[refs[0]]
            return _arith(_REF.sub(lambda m: repr(values[m.group(1)]), text), where)
        return Tagged(node.tag, node.target, _resolve(node.value, top, where, depth + 1))
    if isinstance(node, dict):
        return {k: _resolve(v, top, f"{where}.{k}" if where else str(k), depth + 1) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, top, f"{where}[{i}]", depth + 1) for i, v in enumerate(node)]
    return node


def parse_config(text: str) -> dict:
    """The YAML text -> plain data (dicts, lists, scalars, Tagged), `!ref`s resolved."""
    try:
        raw = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass: no object is built
    except yaml.YAMLError as e:
        raise VoiceLoadError(f"cosyvoice2.yaml is not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise VoiceLoadError("cosyvoice2.yaml: the top level is not a mapping")
    return _resolve(raw, raw, "")


@dataclass(frozen=True)
class CosyConfig:
    """What voxserve reads of cosyvoice2.yaml (the three models' constructor arguments)."""

    sample_rate: int
    token_frame_rate: int
    """Speech tokens per second (25)."""
    token_mel_ratio: int
    """Mel frames per speech token (2)."""
    llm: dict
    flow: dict
    hift: dict
    sampling: dict
    """Upstream's sampling arguments (top_p, top_k, win_size, tau_r)."""

    @property
    def samples_per_token(self) -> int:
        return self.sample_rate // (self.token_frame_rate * self.token_mel_ratio) * self.token_mel_ratio


def _section(cfg: dict, key: str, cls: str) -> Tagged:
    node = cfg.get(key)
    if not isinstance(node, Tagged) or node.tag != "new":
        raise VoiceLoadError(f"cosyvoice2.yaml: `{key}` is missing or is not a `!new:` model entry")
    if node.target != cls:
        raise VoiceLoadError(f"cosyvoice2.yaml: `{key}` is {node.target}, not {cls}: not a CosyVoice 2 model "
                             "(CosyVoice 1 and 3 folders are not supported)")
    if not isinstance(node.value, dict):
        raise VoiceLoadError(f"cosyvoice2.yaml: `{key}` has no arguments")
    return node


def _plain(node: Any) -> Any:
    """Tagged sub-objects -> {"class": target, **arguments} (an omegaconf DictConfig: its content)."""
    if isinstance(node, Tagged):
        val = _plain(node.value)
        if node.target == "omegaconf.DictConfig" and isinstance(val, dict) and "content" in val:
            return val["content"]
        return {"class": node.target, **val} if isinstance(val, dict) else {"class": node.target, "args": val}
    if isinstance(node, dict):
        return {k: _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node


def _int(cfg: dict, key: str) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v <= 0:
        raise VoiceLoadError(f"cosyvoice2.yaml: `{key}` must be a positive integer, not {v!r}")
    return int(v)


def load_config(path: Path) -> CosyConfig:
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise VoiceLoadError(f"{path}: {size} bytes, over the {MAX_CONFIG_BYTES} a config may have")
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise VoiceLoadError(f"cannot read {path}: {e}") from None
    except UnicodeDecodeError:
        raise VoiceLoadError(f"{path} is not UTF-8 text") from None
    cfg = parse_config(text)
    llm = _plain(_section(cfg, "llm", LLM_CLASS).value)
    flow = _plain(_section(cfg, "flow", FLOW_CLASS).value)
    hift = _plain(_section(cfg, "hift", HIFT_CLASS).value)
    sampling = llm.pop("sampling", None)
    sampling = {k: v for k, v in sampling.items() if k != "class"} if isinstance(sampling, dict) else {}
    return CosyConfig(sample_rate=_int(cfg, "sample_rate"), token_frame_rate=_int(cfg, "token_frame_rate"),
                      token_mel_ratio=_int(cfg, "token_mel_ratio"), llm=llm, flow=flow, hift=hift,
                      sampling=sampling)
