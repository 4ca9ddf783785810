"""eagle_core: the engine behind eagle-serve (continuous batching + EAGLE speculative decoding).

Public API: Engine and its config classes for serving; LLM for offline batch generation.
"""

from eagle_core.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, SpecConfig
from eagle_core.engine import Engine
from eagle_core.errors import InvalidRequestError, ModelLoadError
from eagle_core.llm import LLM, CompletionOutput
from eagle_core.outputs import RequestOutput, SpecStats
from eagle_core.sampling_params import SamplingParams

__all__ = [
    "LLM",
    "CacheConfig",
    "CompletionOutput",
    "Engine",
    "EngineConfig",
    "InvalidRequestError",
    "ModelConfig",
    "ModelLoadError",
    "RequestOutput",
    "SamplingParams",
    "SchedulerConfig",
    "SpecConfig",
    "SpecStats",
]
