"""SBV2's work bounds (issue 49, item 7): the flow attends over frames, so its full [F, F]
scores grew with frames squared (`"日" * 100` on the tiny model: ~12k frames, 8.6 GB). Attention
now runs in query chunks against all keys (equal to the plain path), and a sentence's frames are
capped, so no sentence a voice accepts can take more than a bounded amount of memory and time."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import voxserve  # noqa: E402
from voxserve import AudioTooLongError  # noqa: E402
from voxserve.families.sbv2 import Sbv2Options
from voxserve.families.sbv2 import model as sbv2_model  # noqa: E402
from voxserve.families.sbv2.model import ConditionedEncoder, Sbv2Dims, TransformerCouplingBlock  # noqa: E402
from voxserve.models import vits as piper_model  # noqa: E402

DET = Sbv2Options(noise_scale=0.0, noise_w=0.0, sdp_ratio=0.0)
SCORES_MAX = 1 << 22  # the score elements one attention step may hold (model.SCORE_BLOCK)


def _random_encoder(seed: int = 0) -> ConditionedEncoder:
    torch.manual_seed(seed)
    dims = Sbv2Dims(jp_extra=True, hidden_channels=24, filter_channels=48, n_layers=3, window_size=4)
    enc = ConditionedEncoder(dims.vits(), 16, 2).eval()
    for p in enc.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return enc


@pytest.mark.parametrize("rows_block", [1, 2 * 2 * 300 * 7, 2 * 2 * 300 * 64])
def test_attention_in_query_chunks_equals_the_full_attention(rows_block, monkeypatch):
    enc = _random_encoder()
    x = torch.randn(2, 24, 300)
    mask = (torch.arange(300)[None] < torch.tensor([300, 217])[:, None]).float().unsqueeze(1)
    g = torch.randn(2, 16, 1)
    with torch.no_grad():
        want = enc(x, mask, g)  # 2 x 2 x 300 x 300 scores: under the block, the plain path
        monkeypatch.setattr(enc, "score_block", rows_block)  # 1 row, 7 rows, 64 rows per step
        got = enc(x, mask, g)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
    assert float((got[1, :, 217:]).abs().max()) == 0.0  # padding stays zero


def test_the_flow_never_holds_frames_squared_scores(monkeypatch):
    seen: list[int] = []

    def recording(scores):
        seen.append(scores.numel())
        return torch.softmax(scores.float(), dim=-1).to(scores.dtype)

    monkeypatch.setattr(piper_model, "_softmax32", recording)
    monkeypatch.setattr(sbv2_model, "_softmax32", recording, raising=False)
    dims = Sbv2Dims(jp_extra=True, hidden_channels=24, filter_channels=32, n_layers=3, inter_channels=16,
                    gin_channels=16, flow_n_layers=3, flow_n_flows=1)
    flow = TransformerCouplingBlock(dims).eval()
    f = 2100  # 2 heads x 2100^2 = 8.8M scores in one [F, F] step
    with torch.no_grad():
        flow.reverse(torch.randn(1, 16, f), torch.ones(1, 1, f), torch.randn(1, 16, 1))
    assert seen and max(seen) <= SCORES_MAX, max(seen)


def test_a_sentence_past_the_frame_cap_is_refused_before_the_flow(sbv2_folders, sbv2_bert_root, monkeypatch):
    """The issue's repro: 300 bytes that the tiny model (hop 32) says in ~12k frames."""
    v = voxserve.load_voice(f"sbv2:{sbv2_folders['jp_extra']}", device="cpu", bert_dir=sbv2_bert_root)
    ran: list[int] = []
    real = v.model.flow_reverse
    monkeypatch.setattr(v.model, "flow_reverse", lambda m, *a, **k: ran.append(m.shape[-1]) or real(m, *a, **k))
    with pytest.raises(AudioTooLongError, match="frames per sentence"):
        v.synthesize("日" * 100, DET)
    assert max(ran, default=0) <= 1  # the over-cap row got one frame, never its ~12k
    assert len(v.synthesize("日本", DET).samples) > 0  # a short sentence still speaks
