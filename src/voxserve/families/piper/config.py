"""A Piper voice's `.onnx.json`, as a frozen dataclass."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from ...errors import VoiceLoadError
from ...langcodes import tag


def config_language(d: Mapping[str, Any]) -> str:
    """The `language.code` of an `.onnx.json` ("en_US"; older configs give a bare string)."""
    lang = d.get("language", {}) or {}
    return str(lang.get("code", "") if isinstance(lang, Mapping) else lang)


def language_codes(language: str, espeak_voice: str) -> list[str]:
    """A Piper voice's BCP-47 tags (one): its config's `language.code` ("en_US" -> "en-US"),
    else its espeak-ng voice ("en-us" -> "en-US"); none if neither is a language code."""
    for code in (language, espeak_voice):
        try:
            return [tag(code)]
        except ValueError:
            continue
    return []


# Bounds of a config's integers, far outside any real voice (16-48 kHz, hop 256, a few hundred
# symbols and up to ~900 speakers) and far inside what would break the process.
SAMPLE_RATES = (1000, 384_000)
MAX_SYMBOLS = 1 << 16
MAX_SPEAKERS = 1 << 16
MAX_HOP = 1 << 16


@dataclass(frozen=True)
class VoiceConfig:
    """Everything about a voice that is not a weight. Frozen: shared by every request."""

    name: str
    sample_rate: int
    espeak_voice: str
    phoneme_id_map: Mapping[str, tuple[int, ...]]
    num_symbols: int
    num_speakers: int = 1
    speaker_id_map: Mapping[str, int] = field(default_factory=dict)
    phoneme_type: str = "espeak"
    phoneme_map: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    vowel_clusters: frozenset[tuple[str, ...]] | None = None
    # inference defaults (SynthesisOptions fields left None take these)
    noise_scale: float = 0.667
    length_scale: float = 1.0
    noise_w: float = 0.8
    hop_length: int = 256
    default_speaker_id: int = 0
    language: str = ""
    quality: str = ""

    @property
    def language_codes(self) -> list[str]:
        return language_codes(self.language, self.espeak_voice)

    @property
    def speakers(self) -> list[str]:
        """Speaker names ordered by id (empty for a single-speaker voice)."""
        return [k for k, _ in sorted(self.speaker_id_map.items(), key=lambda kv: kv[1])]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], name: str, source: str = "voice config") -> "VoiceConfig":
        def need(*keys: str) -> Any:
            cur: Any = d
            for k in keys:
                if not isinstance(cur, Mapping) or k not in cur:
                    raise VoiceLoadError(f"{source}: missing key {'.'.join(keys)!r}")
                cur = cur[k]
            return cur

        phoneme_type = str(d.get("phoneme_type", "espeak"))
        if phoneme_type != "espeak":
            raise VoiceLoadError(
                f"{source}: phoneme_type {phoneme_type!r} is not supported (only 'espeak' voices)"
            )
        id_map_raw = need("phoneme_id_map")
        if not isinstance(id_map_raw, Mapping) or not id_map_raw:
            raise VoiceLoadError(f"{source}: 'phoneme_id_map' must be a non-empty object")
        id_map: dict[str, tuple[int, ...]] = {}
        for k, v in id_map_raw.items():
            ids = (v,) if isinstance(v, int) else tuple(v)
            if not all(isinstance(i, int) for i in ids):
                raise VoiceLoadError(f"{source}: phoneme_id_map[{k!r}] must be a list of ints")
            id_map[k] = ids
        inference = d.get("inference", {}) or {}
        speaker_map = {str(k): int(v) for k, v in (d.get("speaker_id_map") or {}).items()}
        pmap = {str(k): tuple(v) for k, v in (d.get("phoneme_map") or {}).items()}
        clusters = d.get("vowel_clusters")
        def bounded(key: str, value: Any, lo: int, hi: int) -> int:
            """An integer setting within lo..hi (a number, or its digits as a string): a hostile
            or broken config fails here, naming the key, not later as a division by zero or an
            allocation of 2^40 samples."""
            v = value
            if isinstance(value, str):
                try:
                    v = int(value.strip())
                except ValueError:
                    pass
            elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
                v = int(value)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise VoiceLoadError(f"{source}: {key} must be an integer in {lo}..{hi}, not {value!r}")
            return v

        num_symbols = bounded("num_symbols", d.get("num_symbols", max(i for ids in id_map.values() for i in ids) + 1),
                              1, MAX_SYMBOLS)
        sample_rate = bounded("audio.sample_rate", need("audio", "sample_rate"), *SAMPLE_RATES)
        return cls(
            name=name,
            sample_rate=sample_rate,
            espeak_voice=str(need("espeak", "voice")),
            phoneme_id_map=MappingProxyType(id_map),
            num_symbols=num_symbols,
            num_speakers=bounded("num_speakers", d.get("num_speakers", 1), 1, MAX_SPEAKERS),
            speaker_id_map=MappingProxyType(speaker_map),
            phoneme_type=phoneme_type,
            phoneme_map=MappingProxyType(pmap),
            vowel_clusters=frozenset(tuple(c) for c in clusters) if clusters else None,
            noise_scale=float(inference.get("noise_scale", 0.667)),
            length_scale=float(inference.get("length_scale", 1.0)),
            noise_w=float(inference.get("noise_w", 0.8)),
            hop_length=bounded("hop_length", d.get("hop_length", 256), 1, MAX_HOP),
            default_speaker_id=int(d.get("default_speaker_id", 0)),
            language=config_language(d),
            quality=str((d.get("audio") or {}).get("quality", "")),
        )

    @classmethod
    def from_json(cls, path: str | Path, name: str | None = None) -> "VoiceConfig":
        path = Path(path)
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
        except FileNotFoundError as e:
            raise VoiceLoadError(f"voice config not found: {path}") from e
        except (OSError, json.JSONDecodeError) as e:
            raise VoiceLoadError(f"cannot read voice config {path}: {e}") from e
        if not isinstance(d, dict):
            raise VoiceLoadError(f"{path}: expected a JSON object")
        default_name = path.name.removesuffix(".json").removesuffix(".onnx")
        return cls.from_dict(d, name=name or default_name, source=str(path))
