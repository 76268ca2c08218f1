"""Moved to benchmarks/bark_random.py: random-weight Bark models are for tests and benchmarks,
not the product. This name stays, in a source checkout only, for scripts that still import it."""

import sys
from pathlib import Path

_DIR = Path(__file__).resolve().parents[3] / "benchmarks"
if not (_DIR / "bark_random.py").is_file():
    raise ImportError("voxserve.bench.bark_random is benchmarks/bark_random.py of the source repository")
if str(_DIR) not in sys.path:
    sys.path.append(str(_DIR))

from bark_random import *  # noqa: E402,F401,F403
from bark_random import BARK_SIZES, random_bark_model, random_bark_voice  # noqa: E402,F401
