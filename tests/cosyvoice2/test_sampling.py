"""CosyVoice 2's repetition-aware sampling against its written rule (sampling.py's docstring),
row by row in plain Python with the same uniform numbers, and its batch independence."""

from __future__ import annotations

import math

import pytest
import torch

from voxserve.families.cosyvoice2.sampling import RasSampler, ras_pick

V, EOS = 40, 37  # 37 speech tokens, then EOS and two specials above it


def rule(logp: list[float], history: list[int], us, *, min_tokens: int, top_p=0.8, top_k=25, win=10, tau=0.1):
    """The docstring's rule for one row; us: the step's uniform numbers, [trial][0] for the
    nucleus draw and [trial][1] for the redraw."""
    m = max(logp)
    p = [math.exp(x - m) for x in logp]
    z = sum(p)
    p = [x / z for x in p]
    order = sorted(range(len(p)), key=lambda i: -p[i])  # Python's sort is stable

    def draw(cands, u):
        total = sum(p[i] for i in cands)
        target, acc = u * total, 0.0
        for i in cands:
            acc += p[i]
            if acc > target:
                return i
        return cands[-1]

    for trial in range(100):
        kept, mass = [], 0.0
        for i in order[:top_k]:
            if kept and mass >= top_p:
                break
            kept.append(i)
            mass += p[i]
        tok = draw(kept, us[trial][0])
        if sum(1 for t in history[-win:] if t == tok) >= win * tau:
            tok = draw(order, us[trial][1])
        if tok > EOS or (tok == EOS and len(history) < min_tokens):
            continue
        return tok
    return -1


def uniforms(seed: int):
    """A row's uniform numbers, a block of 100 trials x 2 per step."""
    g = torch.Generator().manual_seed(seed)
    while True:
        yield torch.rand(100, 2, generator=g).tolist()


@pytest.mark.parametrize("scale", [0.5, 1.0, 1.5])
def test_ras_follows_the_written_rule_row_by_row(scale):
    rng = torch.Generator().manual_seed(11)
    n, steps = 6, 60
    logits = torch.randn(steps, n, V, generator=rng) * scale
    logits[:, :, EOS] += 1.5  # make EOS (and refusals under the minimum) frequent
    logits[:, :, EOS + 1:] -= 1.0
    samplers = [RasSampler(100 + r, EOS, min_tokens=20 + 5 * r) for r in range(n)]
    streams = [uniforms(100 + r) for r in range(n)]
    hist: list[list[int]] = [[] for _ in range(n)]
    redrawn = 0
    for t in range(steps):
        logp = logits[t].log_softmax(-1)
        got = ras_pick(logp, samplers, hist).tolist()
        for r in range(n):
            want = rule(logp[r].tolist(), hist[r], next(streams[r]), min_tokens=samplers[r].min_tokens)
            assert got[r] == want, (t, r)
            redrawn += got[r] in hist[r][-10:]
            hist[r].append(got[r])
    assert all(max(h[: s.min_tokens]) < EOS for h, s in zip(hist, samplers))
    assert redrawn > 0  # the repetition branch ran
    assert any(EOS in h for h in hist)


def test_a_rows_tokens_do_not_depend_on_the_other_rows():
    rng = torch.Generator().manual_seed(3)
    logits = torch.randn(80, 4, V, generator=rng)
    alone_s, batch_s = RasSampler(9, EOS, 30), [RasSampler(s, EOS, 30) for s in (1, 9, 2, 5)]
    alone_h, batch_h = [], [[] for _ in range(4)]
    for t in range(80):
        (a,) = ras_pick(logits[t, 1:2].log_softmax(-1), [alone_s], [alone_h]).tolist()
        b = ras_pick(logits[t].log_softmax(-1), batch_s, batch_h).tolist()
        assert a == b[1]
        alone_h.append(a)
        for h, x in zip(batch_h, b):
            h.append(x)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="top_p"):
        RasSampler(0, EOS, top_p=0)
    with pytest.raises(ValueError, match="top_k"):
        RasSampler(0, EOS, top_k=0)


def test_a_row_with_no_admissible_token_gets_minus_one_and_the_others_sample():
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(4))
    logits[0, :EOS] = float("-inf")  # only EOS and the specials, under the minimum: nothing admissible
    logits[1, :EOS] = float("-inf")  # the same above its minimum: EOS (most likely of the three)
    logits[1, EOS] = logits[1, EOS:].max() + 1.0
    samplers = [RasSampler(1, EOS, 5), RasSampler(2, EOS, 0), RasSampler(3, EOS, 5)]
    got = ras_pick(logits.log_softmax(-1), samplers, [[], [], []]).tolist()
    assert got[0] == -1 and got[1] == EOS and 0 <= got[2] < EOS


def test_the_same_seed_gives_the_same_tokens():
    logits = torch.randn(40, 3, V, generator=torch.Generator().manual_seed(8))

    def run():
        ss, hs = [RasSampler(s, EOS, 10) for s in (4, 5, 6)], [[], [], []]
        for t in range(40):
            for h, x in zip(hs, ras_pick(logits[t].log_softmax(-1), ss, hs).tolist()):
                h.append(x)
        return hs

    assert run() == run()


@pytest.mark.parametrize("history", [[], [0, 0, 1]])
def test_draw_frequencies_follow_the_ras_distribution(history):
    """Many rows (seeds) of one distribution, one step: each token's frequency is within 4.5
    sigma of its RAS probability (the nucleus's, plus the mass of repeated nucleus tokens
    redrawn from the whole distribution)."""
    n = 6000
    logits = torch.linspace(2.0, -2.0, V)
    logits[EOS:] = -30.0  # the specials practically never drawn (no refusals)
    logp = logits.log_softmax(-1)
    got = torch.bincount(ras_pick(logp.expand(n, V), [RasSampler(s, EOS) for s in range(n)],
                                  [history] * n), minlength=V).double() / n
    p = logp.double().exp()
    kept, mass = [], 0.0
    for i in range(25):  # the rule's nucleus (logits are already in descending order)
        if kept and mass >= 0.8:
            break
        kept.append(i)
        mass += float(p[i])
    nucleus = torch.zeros(V, dtype=torch.float64)
    nucleus[kept] = p[kept] / p[kept].sum()
    repeated = sorted(set(history) & set(kept))
    want = nucleus.clone()
    want[repeated] = 0.0
    want += nucleus[repeated].sum() * p
    sigma = (want * (1 - want) / n).sqrt()
    assert ((got - want).abs() <= 4.5 * sigma + 1e-12).all()
    assert got[len(kept):EOS].sum() > 0 if repeated else got[len(kept):].sum() == 0


# ---------------------------------------------------------------------- host reads
@pytest.fixture(scope="module")
def chunked_voice(tmp_path_factory):
    import cv2_fixtures as fx

    import voxserve

    d = fx.write_model_folder(tmp_path_factory.mktemp("cv2c") / "tiny-chunked", speakers={"spk": fx.prompt_entry()},
                              encoder_chunk=25)
    return voxserve.load_voice(f"cosyvoice2:{d}", device="cpu")


@pytest.mark.parametrize("which", ["cv2_voice", "chunked_voice"])
def test_decode_steps_read_once_and_token2wav_once_per_batch(which, request, monkeypatch):
    """The language model's decode steps read back once (the tokens), RAS's trials included;
    token2wav reads once per batch (its chunks' audio, in one copy): the lengths it works
    with are the host's own (tests/host_syncs.py counts what reaches the host)."""
    from host_syncs import count_calls

    from voxserve import SynthesisOptions
    from voxserve.runtime.step import Decoder

    voice = request.getfixturevalue(which)
    steps = count_calls(Decoder, "step", monkeypatch)
    batches = count_calls(voice.model, "token2wav", monkeypatch)
    texts = ["Hello there, how are you today?", "A second sentence, somewhat longer than the first one."]
    for k, text in enumerate(texts):
        assert voice.synthesize(text, SynthesisOptions(seed=11 + k)).samples.size > 0
    assert len(steps) > 20 and len(batches) >= 2
    assert all(calls == ["cpu"] for calls in steps), [c for c in steps if c != ["cpu"]][:3]
    assert all(calls == ["cpu"] for calls in batches), batches


@pytest.mark.cuda
def test_cuda_ras_and_decode_steps_synchronise_once(cv2_dir):
    """On the device: a CosyVoice 2 decode step (prefills done) makes one synchronising call."""
    from host_syncs import cuda_syncs

    import voxserve
    from voxserve import SynthesisOptions
    from voxserve.families.cosyvoice2.runner import CosyStepRunner

    voice = voxserve.load_voice(f"cosyvoice2:{cv2_dir}", device="cuda")
    runner = CosyStepRunner(voice.model, streaming=False)  # no token2wav until a sentence ends
    for k, text in enumerate(["Hello there, how are you today?", "A second sentence."]):
        runner.join(k, next(iter(voice.units(text, SynthesisOptions(seed=k)))))
    runner.step()
    checked = 0
    while runner.active and checked < 30:
        n = len(runner.decoder.running)
        out, syncs = cuda_syncs(runner.step)
        if not out and len(runner.decoder.running) == n:
            assert len(syncs) <= 1, [str(w.message) for w in syncs]
            checked += 1
    assert checked > 5
