"""Serving engine: scheduler (pure Python), admission, device workers (the step) and their
executors, the output path, the async engine (asyncio side)."""

from .async_engine import AsyncEngine, SpeechStream
from .engine import Engine, EngineConfig, Sink
from .worker import BatchObserver
from .executors import CpuLanes
from .scheduler import Batch, Item, Scheduler, SchedulerConfig

__all__ = ["AsyncEngine", "SpeechStream", "Engine", "EngineConfig", "Sink", "BatchObserver", "CpuLanes", "Batch", "Item", "Scheduler", "SchedulerConfig"]
