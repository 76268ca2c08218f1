"""Phonemes -> ids with Piper's interleaving: BOS PAD (p PAD)* EOS."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

log = logging.getLogger(__name__)

PAD, BOS, EOS = "_", "^", "$"


class PhonemeIdMapper:
    """Maps phonemes with one voice's `phoneme_id_map`.

    A phoneme with no id is dropped, with one warning per distinct phoneme for this voice;
    never an exception (a stray symbol must not fail a whole request).
    """

    def __init__(self, id_map: Mapping[str, Sequence[int]]):
        for sym in (PAD, BOS, EOS):
            if sym not in id_map:
                raise ValueError(f"phoneme_id_map has no id for {sym!r}")
        self.id_map = {k: tuple(v) for k, v in id_map.items()}
        self._warned: set[str] = set()

    def __call__(self, phonemes: Sequence[str]) -> list[int]:
        m = self.id_map
        pad = m[PAD]
        ids = [*m[BOS], *pad]
        for p in phonemes:
            got = m.get(p)
            if got is None:
                if p not in self._warned:
                    self._warned.add(p)
                    log.warning("phoneme %r (U+%04X) has no id in this voice; dropped", p, ord(p[0]) if p else 0)
                continue
            ids.extend(got)
            ids.extend(pad)
        ids.extend(m[EOS])
        return ids

    @property
    def missing(self) -> frozenset[str]:
        """Phonemes dropped so far."""
        return frozenset(self._warned)


def phonemes_to_ids(phonemes: Sequence[str], id_map: Mapping[str, Sequence[int]]) -> list[int]:
    """Functional form (warns on every call for a missing phoneme)."""
    return PhonemeIdMapper(id_map)(phonemes)
