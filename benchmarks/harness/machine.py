"""What the numbers were measured on."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import voxserve


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_total_gb() -> float | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def git_commit() -> str | None:
    """The source tree's commit (+ '-dirty'), when running from a checkout."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        rev = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (rev + ("-dirty" if dirty else "")) or None


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages: how busy the machine was (it may be shared)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def _source_version() -> str | None:
    """voxserve's version when it runs from a source tree that was not installed."""
    return f"{voxserve.__version__} (source)"


def machine_info() -> dict:
    import torch

    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        affinity = os.cpu_count()
    info: dict = {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": affinity,
        "memory_gb": memory_total_gb(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_cuda": torch.version.cuda,
        "onnxruntime": _version("onnxruntime") or _version("onnxruntime-gpu"),
        "onnxruntime_gpu": _version("onnxruntime-gpu"),
        "piper_tts": _version("piper-tts"),
        "numpy": _version("numpy"),
        "voxserve": _version("voxserve") or _source_version(),
        "git_commit": git_commit(),
        "gpu": None,
        "load_average": load_average(),
    }
    try:
        import onnxruntime

        info["onnxruntime_providers"] = onnxruntime.get_available_providers()
    except ImportError:
        info["onnxruntime_providers"] = []
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info["gpu"] = {
            "name": p.name,
            "memory_gb": round(p.total_memory / 1024**3, 1),
            "capability": f"{p.major}.{p.minor}",
            "count": torch.cuda.device_count(),
        }
        try:
            drv = (
                subprocess.run(
                    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    timeout=20,
                )
                .stdout.strip()
                .splitlines()
            )
            info["gpu"]["driver"] = drv[0] if drv else None
        except (OSError, subprocess.SubprocessError):
            info["gpu"]["driver"] = None
    return info
