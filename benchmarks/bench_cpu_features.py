"""A developer's A/B for the bench harness (benchmarks/harness): the Piper family's CPU speed features
switched off one at a time, and all of them at once, next to the defaults and Piper.

    python benchmarks/bench.py --suites cpu_features                    # from a source checkout, CPU only
    python benchmarks/bench.py --suites configs,cpu_features --batches 1,8

Each row is voxserve's Piper voice with one RuntimeOptions field changed, measured as the
configurations suite measures its rows (one `run_units` batch of the same sentences at every
--batches size, peak memory from a child process), in the same run as `vox-cpu` (the defaults)
and `piper-cpu` (the reference every ratio is to). What each feature is and why it is on by
default: docs/benchmarks.md and docs/precision.md.
"""

from __future__ import annotations

import sys

from harness.arms import ArmSpec
from harness.report import _configs, check_batch_row
from harness.suites import ConfigsSuite, register_suite

NAME = "cpu_features"
ALL_OFF = {"cpu_channels_last": False, "cpu_gemm_convs": False, "decode_layout": "padded", "fold_average": False,
           "attention": "skew"}
FEATURES: tuple[ArmSpec, ...] = (
    ArmSpec("vox-cpu-nocl", "voxserve, cpu_channels_last off", runtime={"cpu_channels_last": False}, suite=NAME),
    ArmSpec("vox-cpu-padded", "voxserve, decode_layout padded", runtime={"decode_layout": "padded"}, suite=NAME),
    ArmSpec("vox-cpu-nogemm", "voxserve, cpu_gemm_convs off", runtime={"cpu_gemm_convs": False}, suite=NAME),
    ArmSpec("vox-cpu-nofold", "voxserve, fold_average off", runtime={"fold_average": False}, suite=NAME),
    ArmSpec("vox-cpu-skew", "voxserve, attention skew (VITS reference)", runtime={"attention": "skew"}, suite=NAME),
    ArmSpec("vox-cpu-plain", "voxserve, all CPU features off", runtime=ALL_OFF, suite=NAME),
)
BASELINES = ("vox-cpu", "piper-cpu")
"""Rows of the product's table this suite runs too, so that every feature row has them beside it."""


@register_suite
class CpuFeaturesSuite(ConfigsSuite):
    name = NAME
    title = "voxserve's CPU speed features, each switched off"

    def extra_arms(self, ctx):
        return list(FEATURES) if ctx.device == "cpu" else []

    def tasks(self, ctx, spec):
        if spec.suite == self.name or (spec.suite is None and spec.device == "cpu" and spec.name in BASELINES):
            return super().tasks(ctx, spec)
        return []

    def markdown(self, result: dict, section: dict) -> str:
        text = _configs(result, section)
        head, _, rest = text.partition("\n")  # the configurations table's heading, numbered for the product report
        return f"### {section['title']}\n{rest}"

    def check(self, result: dict, section: dict, problems: list[str]) -> None:
        arms = {a.get("name") for a in result.get("arms", []) if isinstance(a, dict)}
        for i, row in enumerate(section.get("rows", [])):
            check_batch_row(row, f"suites.{NAME}.rows[{i}]", arms, ("audio_s", "rtf", "throughput"), problems)


if __name__ == "__main__":
    import argparse

    from harness import add_parser, cmd_bench

    import bench_cpu_features  # noqa: F401  registered under its module name, which the memory probe's child imports

    top = argparse.ArgumentParser(prog="bench_cpu_features.py")
    add_parser(top.add_subparsers(dest="command"))
    argv = sys.argv[1:]
    sys.exit(cmd_bench(top.parse_args(argv if argv[:1] == ["bench"] else ["bench", "--suites", NAME, *argv])))
