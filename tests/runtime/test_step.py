"""runtime/step.py: batched decoding over one left-padded KV cache gives every row what it gets
alone (logits within float tolerance, the same tokens), whatever joins and leaves beside it.
Two tiny random causal LMs: a Qwen2 (rotary positions; what CosyVoice 2's LM is) and Bark's
semantic model (learned absolute positions)."""

from __future__ import annotations

import pytest
import torch

from voxserve.runtime.step import Decoder, KVBatch, LMSequence, StopRule, TokenSampler, hf_forward

V = 48


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


@pytest.fixture(scope="module")
def qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256)
    return Qwen2ForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def bark_lm():
    from transformers import BarkSemanticConfig
    from transformers.models.bark.modeling_bark import BarkSemanticModel

    torch.manual_seed(1)
    cfg = BarkSemanticConfig(input_vocab_size=V, output_vocab_size=V, hidden_size=32, num_layers=2, num_heads=2,
                             block_size=128, dropout=0.0)
    return BarkSemanticModel(cfg).eval()


def _forward(model):
    return hf_forward(model)


def _prompt(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed))


class Recorder:
    """A process hook that keeps each row's raw logits per step (the family's processing slot)."""

    def __init__(self):
        self.logits: dict = {}

    def __call__(self, seqs, logits):
        for s, row in zip(seqs, logits):
            self.logits.setdefault(s.key, []).append(row.clone())
        return logits


def _seq(key, prompt, temperature=0.0, n=8, seed=None):
    return LMSequence(key, prompt, TokenSampler(temperature, seed if seed is not None else hash(key) & 0xFFFF),
                      StopRule(max_new_tokens=n))


def _run(model, plan, temperature=0.0):
    """plan: {step: [("join", key, prompt, n) | ("leave", key)]} -> (tokens, logits) per key."""
    rec = Recorder()
    dec = Decoder(_forward(model), rec)
    done, seqs = {}, {}
    step = 0
    with torch.no_grad():
        while step <= max(plan) or len(dec):
            for ev in plan.get(step, ()):
                if ev[0] == "join":
                    _, key, prompt, n = ev
                    seqs[key] = _seq(key, prompt, temperature, n, seed=len(key) * 7 + 1)
                    dec.add(seqs[key])
                else:
                    dec.remove(ev[1])
            for s in dec.step():
                done[s.key] = s
            # the cache is never wider than its longest row
            assert dec.batch.width == (max(dec.batch.lengths) if dec.batch.lengths else 0)
            step += 1
    return {k: s.tokens for k, s in seqs.items()}, rec.logits


PROMPTS = {"a": _prompt(5, 1), "bb": _prompt(9, 2), "ccc": _prompt(3, 3), "dddd": _prompt(9, 4), "eeeee": _prompt(6, 5)}
# rows of different lengths joining at different steps, one leaving in the middle (the longest
# at that point, so columns are trimmed), one joining after it left
PLAN = {
    0: [("join", "a", PROMPTS["a"], 12), ("join", "bb", PROMPTS["bb"], 6)],
    2: [("join", "ccc", PROMPTS["ccc"], 10), ("join", "dddd", PROMPTS["dddd"], 9)],
    4: [("leave", "bb")],
    5: [("join", "eeeee", PROMPTS["eeeee"], 7)],
}


def _solo(model, key, n, temperature=0.0):
    return _run(model, {0: [("join", key, PROMPTS[key], n)]}, temperature)


@pytest.mark.parametrize("lm", ["qwen2", "bark_lm"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batched_rows_equal_solo_with_joins_and_leaves(lm, temperature, request):
    model = request.getfixturevalue(lm)
    tokens, logits = _run(model, PLAN, temperature)
    for key, n in [("a", 12), ("ccc", 10), ("dddd", 9), ("eeeee", 7)]:
        solo_tokens, solo_logits = _solo(model, key, n, temperature)
        assert tokens[key] == solo_tokens[key], key  # exact, greedy or seeded sampling
        assert len(logits[key]) == n
        for got, want in zip(logits[key], solo_logits[key]):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert len(tokens["bb"]) == 4  # it left after 4 steps
    assert tokens["bb"] == _solo(model, "bb", 6, temperature)[0]["bb"][:4]


@pytest.mark.parametrize("lm", ["qwen2", "bark_lm"])
def test_solo_equals_full_recompute(lm, request):
    # the cache itself is right: each step's logits are those of the whole sequence run at once
    model = request.getfixturevalue(lm)
    tokens, logits = _solo(model, "dddd", 6)
    seq = torch.cat([PROMPTS["dddd"], torch.tensor(tokens["dddd"])])
    with torch.no_grad():
        full = model(input_ids=seq[None], use_cache=False).logits[0]  # [T, V]
    p = len(PROMPTS["dddd"])
    for k, got in enumerate(logits["dddd"]):
        torch.testing.assert_close(got, full[p - 1 + k], atol=1e-5, rtol=1e-5)


def test_embedding_prompts_and_inputs(qwen2):
    # a prompt given as embeddings (CosyVoice's text + speaker prefix) and next inputs as
    # embeddings: the same as the ids they embed
    emb = qwen2.get_input_embeddings()
    with torch.no_grad():
        by_ids = Decoder(_forward(qwen2))
        by_emb = Decoder(_forward(qwen2), next_input=lambda s, t: emb(torch.tensor(t)))
        for k, dec in enumerate((by_ids, by_emb)):
            for key in ("a", "bb"):
                prompt = PROMPTS[key] if k == 0 else emb(PROMPTS[key])
                dec.add(_seq(key, prompt, n=5))
        a = {s.key: s.tokens for _ in range(5) for s in by_ids.step()}
        b = {s.key: s.tokens for _ in range(5) for s in by_emb.step()}
    assert a == b and len(a) == 2


def test_stop_rules():
    rule = StopRule(eos=frozenset({7}), max_new_tokens=4, predicate=lambda t: t[-1] == 3)
    assert rule.stops([1, 7]) and rule.stops([1, 2, 5, 6]) and rule.stops([3])
    assert not rule.stops([1, 2])
    s = LMSequence("k", torch.tensor([1]), TokenSampler(), rule, tokens=[1, 2, 7])
    assert s.output == [1, 2]


def test_eos_stops_a_row_and_the_rest_go_on(qwen2):
    # a row stops at its EOS (the greedy argmax of its first step) while the other continues
    with torch.no_grad():
        probe = Decoder(_forward(qwen2))
        probe.add(_seq("a", PROMPTS["a"], n=1))
        first = probe.step()[0].tokens[0]
        dec = Decoder(_forward(qwen2))
        dec.add(LMSequence("a", PROMPTS["a"], TokenSampler(), StopRule(eos=frozenset({first}), max_new_tokens=9)))
        dec.add(_seq("bb", PROMPTS["bb"], n=3))
        stopped = dec.step()
    assert [s.key for s in stopped] == ["a"] and stopped[0].output == []
    assert len(dec) == 1 and len(dec.batch) == 1 and dec.batch.width == len(PROMPTS["bb"])


def test_token_sampler():
    scores = torch.tensor([0.1, 2.0, -1.0, 1.9])
    assert TokenSampler().pick(scores) == 1
    a = [TokenSampler(1.0, seed=5).pick(scores) for _ in range(3)]
    assert len(set(a)) == 1  # a fresh sampler with one seed: one stream
    s = TokenSampler(5.0, seed=1, top_k=2)
    assert {s.pick(scores) for _ in range(200)} == {1, 3}
    s = TokenSampler(5.0, seed=1)
    assert len({s.pick(scores) for _ in range(200)}) == 4
    assert TokenSampler(1.0, seed=2).pick(torch.tensor([float("-inf"), 0.0])) == 1
    with pytest.raises(ValueError, match="seed"):
        TokenSampler(0.5)
    with pytest.raises(ValueError, match="temperature"):
        TokenSampler(-1.0)


def test_decode_takes_one_input_per_row(bark_lm):
    b = KVBatch(_forward(bark_lm))
    with torch.no_grad():
        b.prefill(["x", "y"], torch.stack([PROMPTS["bb"], PROMPTS["dddd"]]))
        with pytest.raises(ValueError, match="one input per row"):
            b.decode(torch.tensor([1]))
    with pytest.raises(ValueError, match="already"):
        dec = Decoder(_forward(bark_lm))
        dec.add(_seq("a", PROMPTS["a"]))
        dec.add(_seq("a", PROMPTS["a"]))


# ---------------------------------------------------------------------- host reads
def _old_pick(sampler: TokenSampler, scores: torch.Tensor) -> int:
    """TokenSampler.pick as it was, row by row on the host (the reference for pick_rows)."""
    if sampler.generator is None:
        return int(scores.argmax())
    out = scores.float().clone()
    if sampler.top_k is not None and sampler.top_k < out.numel():
        kth = out.topk(sampler.top_k).values[-1]
        out.masked_fill_(out < kth, float("-inf"))
    u = torch.rand(out.shape, dtype=torch.float32, device=out.device, generator=sampler.generator)
    out.div_(sampler.temperature).sub_(u.log_().neg_().log_())
    return int(out.argmax())


def test_pick_rows_equals_each_rows_old_pick():
    from voxserve.runtime.step import pick_rows

    specs = [(0.0, None), (1.0, None), (0.7, 5), (1.3, V), (0.0, 3), (0.9, 1), (2.5, 12)]

    def samplers():
        return [TokenSampler(t, seed=40 + i if t else None, top_k=k) for i, (t, k) in enumerate(specs)]

    new, old = samplers(), samplers()
    g = torch.Generator().manual_seed(6)
    for _ in range(50):
        scores = torch.randn(len(specs), V, generator=g) * 3
        scores[2, :7] = float("-inf")  # suppressed tokens stay suppressed
        got = pick_rows(new, scores).tolist()
        assert got == [_old_pick(s, row) for s, row in zip(old, scores)]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_decode_step_reads_the_host_once(qwen2, bark_lm, temperature, monkeypatch):
    """Each Decoder.step, with joins, leaves, greedy and sampled rows: one read back (the
    tokens, for the stop rules), counted both by what reaches the host and by runtime.sync."""
    from host_syncs import count_calls

    from voxserve.runtime.sync import count_host_reads

    plan = {0: [("join", "a", PROMPTS["a"], 9), ("join", "bb", PROMPTS["bb"], 12)], 2: [("join", "ccc", PROMPTS["ccc"], 6)],
            4: [("leave", "bb")], 5: [("join", "dddd", PROMPTS["dddd"], 7), ("join", "eeeee", PROMPTS["eeeee"], 5)]}
    for model in (qwen2, bark_lm):
        per_step = count_calls(Decoder, "step", monkeypatch)
        with count_host_reads() as reasons:
            _run(model, plan, temperature)
        monkeypatch.undo()
        assert len(per_step) > 10
        assert all(calls == ["cpu"] for calls in per_step), per_step
        assert len(reasons) == len(per_step) and all(r.startswith("decode step") for r in reasons)


@pytest.mark.cuda
def test_cuda_decode_steps_synchronise_once(qwen2):
    """On the device: a decode step (no joins) makes one synchronising call, the read of its
    tokens (torch.cuda.set_sync_debug_mode counts blocking copies both ways)."""
    import copy
    import warnings

    model = copy.deepcopy(qwen2).cuda()
    dec = Decoder(_forward(model), device="cuda")
    for k, key in enumerate(PROMPTS):
        dec.add(LMSequence(key, PROMPTS[key].cuda(), TokenSampler(0.8 * (k % 2), seed=k, top_k=5 if k == 3 else None,
                                                                  device="cuda"), StopRule(max_new_tokens=30)))
    with torch.no_grad():
        dec.step()  # the prefills
        for _ in range(5):
            torch.cuda.synchronize()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    dec.step()
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            syncs = [w for w in caught if "synchroniz" in str(w.message)]
            assert len(syncs) <= 1, [str(w.message) for w in syncs]
