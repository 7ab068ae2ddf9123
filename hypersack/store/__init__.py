"""Durable state: studies, trials, node inventory, profile history."""

from hypersack.store.base import Store
from hypersack.store.memory import MemoryStore
from hypersack.store.sqlite import SqliteStore

__all__ = ["MemoryStore", "SqliteStore", "Store"]
