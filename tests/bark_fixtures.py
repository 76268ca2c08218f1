"""A tiny random-weight Bark checkpoint, written the way a user's snapshot looks.

`write_tiny_bark(dir)` builds transformers' BarkModel with small hidden sizes and vocabularies,
a tiny EnCodec (24 kHz, hop 320, 8 codebooks of 16 codes) and a tiny BERT word-piece vocabulary,
and saves it with `save_pretrained` (model and BarkProcessor), plus Bark's nested
generation_config.json and two speaker presets in the speaker_embeddings/ layout of a
suno/bark snapshot, and one .npz preset under presets/. Nothing is downloaded.

The generation windows are shrunk with the vocabularies (semantic prompt 32 tokens, coarse
windows of 24, fine windows of 32 frames with 16 of history) so that a few seconds of output already
runs several coarse windows and fine loops. With random weights the semantic model would hardly
ever pick EOS; its EOS row is scaled up so that greedy decoding stops after a prompt-dependent
number of tokens. The weight seed and scale were picked (by trying a few) so that greedy runs
of the test sentences end at several different lengths, some over one fine window.
"""

from __future__ import annotations

import json
from pathlib import Path

# the Bark tests' sentences (here, not in tests/bark/conftest.py: a `from conftest import` resolves to
# whichever conftest pytest imported last when one run collects several test folders)
TEXTS = [
    "hello world.", "i like pizza but also reading.", "the cat is on the mat.", "one two three four five six.",
    "a dog.", "this is a long sentence and i like it", "seven eight", "short",
]

S = 40  # semantic vocabulary (EOS / semantic pad = S)
C = 16  # EnCodec codebook size
WORDS = ("hello world the a cat dog is on mat and i like pizza but also have other interests such as "
         "reading this one two three four five six seven eight nine ten sentence long short").split()


def tiny_vocab() -> list[str]:
    return (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list("abcdefghijklmnopqrstuvwxyz0123456789.,!?';:-[]")
            + ["##" + ch for ch in "abcdefghijklmnopqrstuvwxyz0123456789"] + WORDS)


def generation_config(vt: int, max_new_tokens: int = 48) -> dict:
    text_offset = S + 8
    text_pad = text_offset + vt
    coarse_pad = S + 2 * C
    return {
        "semantic_config": {
            "eos_token_id": S, "text_encoding_offset": text_offset, "text_pad_token": text_pad,
            "semantic_infer_token": text_pad + 4, "semantic_vocab_size": S, "max_input_semantic_length": 32,
            "semantic_rate_hz": 49.9, "max_new_tokens": max_new_tokens, "renormalize_logits": True,
        },
        "coarse_acoustics_config": {
            "coarse_semantic_pad_token": coarse_pad, "coarse_infer_token": coarse_pad + 2, "coarse_rate_hz": 75,
            "n_coarse_codebooks": 2, "max_coarse_input_length": 32, "max_coarse_history": 60,
            "sliding_window_len": 24, "renormalize_logits": True,
        },
        "fine_acoustics_config": {"max_fine_history_length": 16, "max_fine_input_length": 32, "n_fine_codebooks": 8},
        "sample_rate": 24000,
        "codebook_size": C,
    }


def write_tiny_bark(out_dir: Path, hidden: int = 32, eos_scale: float = 2.4, seed: int = 4) -> Path:
    import numpy as np
    import torch
    from transformers import (
        BarkCoarseConfig,
        BarkConfig,
        BarkFineConfig,
        BarkModel,
        BarkProcessor,
        BarkSemanticConfig,
        BertTokenizer,
        EncodecConfig,
    )

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = tiny_vocab()
    gen = generation_config(len(vocab))
    sem_gc = gen["semantic_config"]
    common = dict(hidden_size=hidden, num_layers=2, num_heads=2, block_size=128, dropout=0.0)
    coarse_in = S + 2 * C + 8
    config = BarkConfig(
        semantic_config=BarkSemanticConfig(input_vocab_size=sem_gc["semantic_infer_token"] + 1,
                                           output_vocab_size=S + 8, **common).to_dict(),
        coarse_acoustics_config=BarkCoarseConfig(input_vocab_size=coarse_in, output_vocab_size=coarse_in,
                                                 **common).to_dict(),
        fine_acoustics_config=BarkFineConfig(input_vocab_size=C + 8, output_vocab_size=C + 8, n_codes_total=8,
                                             n_codes_given=1, **common).to_dict(),
        codec_config=EncodecConfig(target_bandwidths=[1.5, 3.0, 6.0], hidden_size=8, num_filters=2,
                                   num_residual_layers=1, codebook_size=C, num_lstm_layers=1,
                                   upsampling_ratios=[8, 5, 4, 2], sampling_rate=24000).to_dict(),
    )
    torch.manual_seed(seed)
    model = BarkModel(config).eval()
    with torch.no_grad():
        model.semantic.lm_head.weight[S] *= eos_scale
    model.save_pretrained(out_dir)
    # Bark's nested generation settings, as in a suno/bark snapshot
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=1), encoding="utf-8")

    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(vocab)}, do_lower_case=True)
    BarkProcessor(tokenizer=tokenizer).save_pretrained(out_dir)

    rng = np.random.default_rng(seed)
    index = {"repo_or_path": "tiny/bark"}
    emb = out_dir / "speaker_embeddings" / "v2"
    emb.mkdir(parents=True, exist_ok=True)
    for k in range(2):
        name = f"v2/en_speaker_{k}"
        arrays = tiny_preset(rng, 20 + 6 * k)
        index[name] = {}
        for key, a in arrays.items():
            rel = f"speaker_embeddings/{name}_{key}.npy"
            np.save(out_dir / rel, a)
            index[name][key] = rel
    (out_dir / "speaker_embeddings_path.json").write_text(json.dumps(index), encoding="utf-8")
    (out_dir / "presets").mkdir(exist_ok=True)
    np.savez(out_dir / "presets" / "announcer.npz", **tiny_preset(rng, 24))
    return out_dir


def tiny_preset(rng, n_semantic: int) -> dict:
    """A history prompt of n_semantic semantic tokens and the matching coarse/fine frames."""
    import numpy as np

    frames = round(n_semantic * 75 / 49.9)
    return {
        "semantic_prompt": rng.integers(0, S, n_semantic, dtype=np.int64),
        "coarse_prompt": rng.integers(0, C, (2, frames), dtype=np.int64),
        "fine_prompt": rng.integers(0, C, (8, frames), dtype=np.int64),
    }
