"""Random-weight Bark models with the layer sizes of suno/bark-small or suno/bark, built in
memory (no download): what the benchmarks time. Speed and memory depend on the sizes, not on
the weights; with random weights the semantic model never picks EOS, so every sentence runs to
`max_semantic_tokens` (a fixed, known amount of work per row).
"""

from __future__ import annotations

from voxserve.voice import Voice

# From the published config.json files (model sizes; vocabularies are Bark's own).
BARK_SIZES = {
    "small": {"hidden_size": 768, "num_layers": 12, "num_heads": 12},  # suno/bark-small
    "large": {"hidden_size": 1024, "num_layers": 24, "num_heads": 16},  # suno/bark
    "tiny": {"hidden_size": 32, "num_layers": 2, "num_heads": 2},  # for tests of the harness
}

_WORDS = ("hello my name is suno and uh i like pizza laughs but also have other interests such as reading "
          "the a cat dog on mat this one two three").split()


def random_bark_model(size: str = "small", max_semantic_tokens: int = 256, seed: int = 0,
                      attn_implementation: str = "eager"):
    """(BarkModel, BarkProcessor) with random weights, float32 on the CPU."""
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
    from transformers.generation import GenerationConfig
    from transformers.models.bark.generation_configuration_bark import (
        BarkCoarseGenerationConfig,
        BarkFineGenerationConfig,
        BarkSemanticGenerationConfig,
    )

    if size not in BARK_SIZES:
        raise ValueError(f"size must be one of {', '.join(BARK_SIZES)}, not {size!r}")
    dims = {**BARK_SIZES[size], "block_size": 1024, "bias": False, "dropout": 0.0}
    config = BarkConfig(
        semantic_config=BarkSemanticConfig(input_vocab_size=129_600, output_vocab_size=10_048, **dims).to_dict(),
        coarse_acoustics_config=BarkCoarseConfig(input_vocab_size=12_096, output_vocab_size=12_096, **dims).to_dict(),
        fine_acoustics_config=BarkFineConfig(input_vocab_size=1056, output_vocab_size=1056, n_codes_total=8,
                                             n_codes_given=1, **dims).to_dict(),
        codec_config=EncodecConfig().to_dict(),  # facebook/encodec_24khz's architecture
    )
    torch.manual_seed(seed)
    model = BarkModel._from_config(config, attn_implementation=attn_implementation)
    semantic = BarkSemanticGenerationConfig(max_new_tokens=max_semantic_tokens)
    # Bark's nested generation settings (transformers' defaults are suno/bark's values)
    model.generation_config = GenerationConfig(
        semantic_config=semantic.to_dict(), coarse_acoustics_config=BarkCoarseGenerationConfig().to_dict(),
        fine_acoustics_config=BarkFineGenerationConfig().to_dict(), sample_rate=24_000, codebook_size=1024)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list("abcdefghijklmnopqrstuvwxyz.,!?'-[]") + _WORDS
    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(vocab)}, do_lower_case=True)
    return model, BarkProcessor(tokenizer=tokenizer)


def random_bark_voice(size: str = "small", max_semantic_tokens: int = 256, device: str = "auto",
                      dtype: str | None = None, runtime=None, config=None, seed: int = 0) -> Voice:
    """A BarkVoice over random_bark_model(...), through the same code as a loaded checkpoint."""
    from voxserve.families.bark.voice import BarkRuntimeOptions, bark_voice_from_model

    runtime = (runtime or BarkRuntimeOptions()).validate()
    attn = "flash_attention_2" if runtime.attention == "flash_attention_2" else "eager"
    model, processor = random_bark_model(size, max_semantic_tokens, seed, attn)
    return bark_voice_from_model(model, processor, f"random-bark-{size}", device=device, dtype=dtype,
                                 runtime=runtime, config=config)
