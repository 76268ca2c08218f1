"""Serving engine: scheduler (pure Python), engine (worker threads), async engine (asyncio side)."""

from .async_engine import AsyncEngine, SpeechStream
from .engine import BatchObserver, Engine, EngineConfig, Sink
from .scheduler import Batch, Item, Scheduler, SchedulerConfig

__all__ = ["AsyncEngine", "SpeechStream", "Engine", "EngineConfig", "Sink", "BatchObserver", "Batch", "Item", "Scheduler", "SchedulerConfig"]
