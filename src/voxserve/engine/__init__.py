"""Serving engine: scheduler (pure Python), engine (worker threads), async engine (asyncio side)."""

from .async_engine import AsyncEngine, SpeechStream
from .engine import Engine, EngineConfig
from .scheduler import Batch, Item, Scheduler, SchedulerConfig

__all__ = ["AsyncEngine", "SpeechStream", "Engine", "EngineConfig", "Batch", "Item", "Scheduler", "SchedulerConfig"]
