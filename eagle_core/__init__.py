"""eagle_core: the engine behind eagle-serve (continuous batching + EAGLE speculative decoding).

Public API: Engine and its config classes for serving; LLM for offline batch generation.
"""

from eagle_core.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, SpecConfig
from eagle_core.errors import InvalidRequestError, ModelLoadError
from eagle_core.outputs import RequestOutput, SpecStats
from eagle_core.sampling_params import Grammar, SamplingParams

# Engine and LLM pull in torch and transformers (seconds to import): load them on first use so
# that reading a config (the server's CLI, health endpoint) stays instant. PEP 562.
_LAZY = {"Engine": "eagle_core.engine", "LLM": "eagle_core.llm", "CompletionOutput": "eagle_core.llm"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'eagle_core' has no attribute {name!r}")

__all__ = [
    "LLM",
    "CacheConfig",
    "CompletionOutput",
    "Engine",
    "EngineConfig",
    "Grammar",
    "InvalidRequestError",
    "ModelConfig",
    "ModelLoadError",
    "RequestOutput",
    "SamplingParams",
    "SchedulerConfig",
    "SpecConfig",
    "SpecStats",
]
