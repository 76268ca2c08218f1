"""CosyVoice 2 voices (an LLM-based TTS): a Qwen2 language model making speech tokens, a
flow-matching decoder making mel frames from them, and the HiFT vocoder (issue 21)."""
