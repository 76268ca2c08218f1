"""When a CosyVoice 2 sequence's speech tokens become audio: the chunk schedule of one request.

The flow is trained with a chunk mask of `chunk` tokens (25: 50 mel frames) counted from the
start of the prompt's tokens, so chunk boundaries are kept on that grid: the first hop is 25
tokens plus what aligns the prompt to the grid, later hops grow (x2) up to `max_hop` (100),
always whole chunks. A chunk is ready when its tokens and `lookahead` (3) more are made (the
flow's pre-lookahead layer reads them); the last chunk takes whatever remains once the language
model has stopped. Each request has its own `ChunkSchedule`: nothing of it lives on the shared
model (upstream keeps its hop length on the model object, so a second request inherited the
first one's grown hop and lost its fast first chunk).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ChunkSchedule:
    prompt_tokens: int
    """Speech tokens of the voice's prompt (they precede the generated ones in the flow)."""
    chunk: int = 25
    lookahead: int = 3
    max_hop: int = 100
    growth: int = 2
    offset: int = 0
    """Generated tokens already turned into audio."""
    hop: int = field(init=False)
    chunks_done: int = 0

    def __post_init__(self) -> None:
        if self.chunk < 1 or self.lookahead < 0 or self.max_hop < self.chunk or self.growth < 1:
            raise ValueError(f"bad chunk schedule: chunk {self.chunk}, lookahead {self.lookahead}, "
                             f"max_hop {self.max_hop}, growth {self.growth}")
        self.hop = self.chunk

    @property
    def first(self) -> bool:
        return self.chunks_done == 0

    def next_hop(self) -> int:
        """Tokens the next (non-final) chunk turns into audio."""
        if self.first:
            pad = -self.prompt_tokens % self.chunk  # to the next grid line
            return self.hop + pad
        return self.hop

    def ready(self, made: int, finished: bool) -> tuple[int, bool] | None:
        """(end, final) of the next chunk if it can run now: tokens [offset, end) become audio,
        and the flow may read up to end + lookahead (a final chunk reads to the end). None:
        wait for more tokens. `made`: tokens generated so far (EOS excluded)."""
        hop = self.next_hop()
        if made - self.offset >= hop + self.lookahead:
            return self.offset + hop, False
        if finished:
            return made, True
        return None

    def advance(self, end: int) -> None:
        """The chunk ending at `end` ran."""
        self.offset = end
        self.chunks_done += 1
        self.hop = min(self.max_hop, self.hop * self.growth)
