"""Context mechanisms of one member: budget, offload, clip, compaction, todos, memory."""

from .config import ContextConfig
from .manager import ContextManager

__all__ = ["ContextConfig", "ContextManager"]
