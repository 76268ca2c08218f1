"""The benchmark harness on the command line (benchmarks/harness: arms, suites, the report of
docs/benchmarks.md): `python benchmarks/bench.py --help`; `--suites sbv2` and the like import
benchmarks/bench_<name>.py. What a user runs to size a machine is `voxserve bench`."""

from __future__ import annotations

import sys

import harness

if __name__ == "__main__":
    sys.exit(harness.main())
