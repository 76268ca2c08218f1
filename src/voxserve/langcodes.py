"""Language codes as voices report them: BCP-47 tags (`en-US`, `ja`, `zh`, `yue`).

Every listing of a voice (`voxserve voices`, the HTTP voices routes, Wyoming's `info`, the
playground) shows the codes its family derives from its config (`Voice.language_codes`, and the
`languages` field of `Family.describe` for voices not loaded); families build them with `tag`.
Home Assistant and other clients match voices by these codes, so they must be one shape.
"""

from __future__ import annotations

import re

_TAG = re.compile(r"[a-z]{2,3}(-[A-Z][a-z]{3})?(-([A-Z]{2}|[0-9]{3}))?")
"""language, optional script (Hans), optional region (US, 419): the subset of BCP-47 used here."""


def tag(code: str) -> str:
    """The BCP-47 tag of a config's language code: "en_US" -> "en-US", "en-us" -> "en-US",
    "JA" -> "ja", "zh-hans-cn" -> "zh-Hans-CN". Subtags after the region (espeak's variants, as in
    "en-gb-x-rp") are dropped. Raises ValueError for a code that is not one."""
    parts = [p for p in re.split(r"[-_]", str(code).strip()) if p]
    if not parts:
        raise ValueError(f"not a language code: {code!r}")
    out = [parts[0].lower()]
    rest = parts[1:]
    if rest and len(rest[0]) == 4 and rest[0].isalpha():
        out.append(rest.pop(0).title())
    if rest and (len(rest[0]) == 2 and rest[0].isalpha() or len(rest[0]) == 3 and rest[0].isdigit()):
        out.append(rest[0].upper())
    result = "-".join(out)
    if not is_tag(result):
        raise ValueError(f"not a language code: {code!r}")
    return result


def is_tag(code: str) -> bool:
    """Whether `code` is a tag in the shape `tag` returns."""
    return isinstance(code, str) and _TAG.fullmatch(code) is not None


def unique(codes) -> list[str]:
    """`codes` in order, each once."""
    return list(dict.fromkeys(codes))
