"""What an SBV2 model folder is, read without torch: its config's variant (JP-Extra speaks
Japanese only), the languages voxserve has front ends for, and where its BERTs are found."""

from __future__ import annotations

from ...langcodes import tag

BERT_DIR_ENV = "VOXSERVE_SBV2_BERT_DIR"
FRONTEND_LANGUAGES = ("JP", "EN")  # the front ends voxserve has (no ZH: docs/sbv2.md)


def is_jp_extra(cfg: dict) -> bool:
    """Whether a model's config.json is a JP-Extra model's (Japanese only)."""
    return bool((cfg.get("data") or {}).get("use_jp_extra", str(cfg.get("version", "")).endswith("JP-Extra")))


def language_codes(languages) -> list[str]:
    """SBV2's language names ("JP", "EN", "ZH": `Sbv2Voice.languages`) as BCP-47 tags ("ja",
    "en", "zh"), in order."""
    return [tag({"JP": "ja"}.get(lang, lang)) for lang in languages]
