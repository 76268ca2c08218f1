"""The benchmark's texts: the repository's corpus/en_bench.jsonl, or a user file.

A corpus is JSON lines with "text" and optionally "id" and "category" (short / medium / long /
...), or plain text with one text per line (categories then come from the length).
"""

from __future__ import annotations

import json
from pathlib import Path

DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "corpus" / "en_bench.jsonl"
SENTENCE_CATEGORIES = ("short", "medium")
"""Categories whose sentences make the batching pool (in corpus order)."""


def category_for_length(n_chars: int) -> str:
    """For texts without a category; the thresholds of en_bench.jsonl's own categories."""
    if n_chars < 100:
        return "short"
    if n_chars < 500:
        return "medium"
    return "long"


def load_corpus(path: str | Path | None = None) -> list[dict]:
    """[{id, category, text}] in file order; blank texts are dropped."""
    p = Path(path) if path else DEFAULT_CORPUS
    if not p.exists():
        hint = "" if path else " (the default corpus is in the source tree; give --corpus FILE)"
        raise FileNotFoundError(f"corpus not found: {p}{hint}")
    lines = p.read_text(encoding="utf-8").splitlines()
    items: list[dict] = []
    is_jsonl = p.suffix == ".jsonl" or (lines and lines[0].lstrip().startswith("{"))
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if is_jsonl:
            try:
                d = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{p}:{n}: not JSON ({e})") from None
            if not isinstance(d, dict) or not isinstance(d.get("text"), str):
                raise ValueError(f'{p}:{n}: each line needs a "text" string')
            text = d["text"]
            item = {"id": str(d.get("id", f"line-{n}")), "category": d.get("category"), "text": text}
        else:
            text = line
            item = {"id": f"line-{n}", "category": None, "text": text}
        if not text.strip():
            continue
        item["category"] = item["category"] or category_for_length(len(text))
        items.append(item)
    if not items:
        raise ValueError(f"corpus {p} has no texts")
    return items


def stream_selection(corpus: list[dict], categories: tuple[str, ...], per_category: int) -> list[int]:
    """`per_category` texts of each category, spread over its lengths: sorted by length, the
    texts at the (k + 1/2)/n quantiles (one text: the median length; two: the quartiles)."""
    out: list[int] = []
    for cat in categories:
        idx = sorted(
            (i for i, d in enumerate(corpus) if d["category"] == cat),
            key=lambda i: (len(corpus[i]["text"]), i),
        )
        if not idx:
            continue
        n = min(per_category, len(idx))
        picks = sorted(
            {idx[min(int((k + 0.5) * len(idx) / n), len(idx) - 1)] for k in range(n)},
            key=lambda i: (len(corpus[i]["text"]), i),
        )
        out.extend(picks)
    return out


def pool_texts(corpus: list[dict]) -> list[int]:
    """Indices of the texts whose sentences fill the batching pool: short then medium texts;
    a corpus without those categories uses all its texts."""
    idx = [i for cat in SENTENCE_CATEGORIES for i, d in enumerate(corpus) if d["category"] == cat]
    return idx or list(range(len(corpus)))
