"""The per-request chunk schedule: the first chunk after 25 tokens (+ the prompt's alignment to
the 25-token grid) and 3 of lookahead, hops growing to 100 on the grid, the rest at the end."""

from __future__ import annotations

import pytest

from voxserve.families.cosyvoice2.schedule import ChunkSchedule


def _run(prompt: int, total: int) -> list[tuple[int, int, bool]]:
    """Feed tokens one at a time; the chunks as (made when it ran, end, final)."""
    s = ChunkSchedule(prompt_tokens=prompt)
    out = []
    for made in range(total + 1):
        finished = made == total
        while (r := s.ready(made, finished)) is not None:
            end, final = r
            out.append((made, end, final))
            s.advance(end)
            if final:
                return out
    return out


def test_first_chunk_is_early_and_chunks_stay_on_the_grid():
    chunks = _run(prompt=40, total=400)
    made, end, final = chunks[0]
    assert (end, final) == (35, False) and made == 38  # 40 + 35 = 75: on the 25-token grid; +3 lookahead
    ends = [e for _, e, _ in chunks]
    assert all((40 + e) % 25 == 0 for e in ends[:-1])
    hops = [b - a for a, b in zip([0] + ends, ends)][:-1]
    assert hops == [35, 50, 100, 100, 100]
    assert chunks[-1] == (400, 400, True)


def test_prompt_on_the_grid_needs_no_pad():
    assert _run(prompt=50, total=30)[0][1:] == (25, False)
    assert _run(prompt=0, total=30)[0][1:] == (25, False)


def test_short_sentence_is_one_final_chunk():
    assert _run(prompt=40, total=20) == [(20, 20, True)]


def test_each_request_has_its_own_hop():
    """Upstream kept the hop on the shared model: a second request began at the first one's
    grown hop. Here a new schedule starts at 25 whatever another one did."""
    a = ChunkSchedule(prompt_tokens=50)
    for end in (25, 75, 175):
        a.advance(end)
    assert a.hop == 100
    b = ChunkSchedule(prompt_tokens=50)
    assert b.next_hop() == 25 and b.ready(28, False) == (25, False)


@pytest.mark.parametrize("kw", [dict(chunk=0), dict(lookahead=-1), dict(max_hop=10), dict(growth=0)])
def test_bad_schedule(kw):
    with pytest.raises(ValueError):
        ChunkSchedule(prompt_tokens=0, **kw)
