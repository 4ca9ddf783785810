"""The worker: loads the model(s), sizes the KV storage, executes scheduled batches."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

import torch

from eagle_core.batch import ScheduledBatch, StepResult
from eagle_core.config import (
    AUTO_DRAFT,
    DEFAULT_MODEL,
    SPEC_DEFAULTS,
    EngineConfig,
    ModelConfig,
    SpecConfig,
)
from eagle_core.errors import ModelLoadError
from eagle_core.grammar import GrammarCompiler, GrammarMasks
from eagle_core.kv import blocks_needed
from eagle_core.spec.draft_head import load_draft_head
from eagle_core.spec.drafter import Drafter
from eagle_core.spec.int8_linear import ROW_LIMIT as INT8_ROW_LIMIT
from eagle_core.spec.int8_linear import quantize_linears, wants_int8
from eagle_core.spec.lookup import ContextLookup
from eagle_core.worker import attention
from eagle_core.worker.compiled import CompileSettings
from eagle_core.worker.cpu_kernels import int4_linear_available
from eagle_core.worker.int4_linear import INT4_SOURCE_TYPE, measure_row_limit, quantize_decoder
from eagle_core.worker.invariant_linear import wrap_linears
from eagle_core.worker.kv_storage import KVStorage
from eagle_core.worker.loader import cpu_has_amx_bf16, dtype_name, load_model
from eagle_core.worker.model_runner import PlainRunner, TargetModel, kv_shape
from eagle_core.worker.packed_linear import pack_linears, wants_packing
from eagle_core.worker.sampler import Sampler
from eagle_core.worker.spec_runner import SpecRunner
from eagle_core.worker.warm_up import warm_up

logger = logging.getLogger(__name__)

# The most rows the int8 draft kernel takes where packed bf16 weights are there to fall back on
# (beyond, the packed weights are faster; docs/benchmarks.md, "A CPU with AMX").
INT8_ROWS_BESIDE_PACKED = 4

# Without an explicit --max-model-len, very long model contexts are capped so that a default
# KV budget still holds several sequences.
_DEFAULT_MAX_MODEL_LEN_CAP = 8192


class Worker:
    def __init__(self, config: EngineConfig):
        attention.register()
        loaded = load_model(config.model, attn_implementation=attention.ATTN_NAME)
        config = dataclasses.replace(config, spec=dataclasses.replace(config.spec, draft=resolve_draft(config)))
        self.config = derive_config(config, loaded.model.config, loaded.dtype, loaded.device)
        self.tokenizer = loaded.tokenizer
        self.model_name = loaded.name
        self.device = loaded.device
        self.dtype = loaded.dtype
        self.compile_settings = compile_settings(config.model, self.device)
        """How the target's and the draft head's forwards are compiled; None: they run eagerly."""
        self.compiled = self.compile_settings is not None
        self.deterministic = config.model.deterministic
        self.attention_backend = resolve_attention_backend(
            config.model.attention_backend, self.compiled, self.deterministic
        )
        self.weight_quantization = self._quantize_target(loaded, config.model)
        """"int4" when the target's decoder linears hold int4 weights (worker/int4_linear.py),
        else None."""
        self.packed_weights = False
        """Whether the target's (and the draft head's) bf16 linears run on oneDNN-packed weights
        in eager forwards (worker/packed_linear.py)."""
        if not self.compiled and not self.deterministic and wants_packing(config.model.weight_packing, self.device, self.dtype, cpu_has_amx_bf16()):
            packed = pack_linears(loaded.model)
            self.packed_weights = bool(packed)
            if packed:
                logger.info("oneDNN-packed weights for %d target linears", len(packed))
        self.vocab_size = loaded.model.get_output_embeddings().weight.shape[0]
        generation_config = getattr(loaded.model, "generation_config", None)
        self.generation_eos = getattr(generation_config, "eos_token_id", None)
        cache = self.config.cache
        self.draft_head = self._load_draft_head(loaded) if self.config.spec.draft else None
        if self.deterministic:
            # The target's linears only: drafts propose, the target's logits decide every token.
            # A draft head that shares the target's LM head keeps the plain module.
            logger.info("deterministic mode: %d target linears in blocks of rows", len(wrap_linears(loaded.model)))
        self.target = TargetModel(
            loaded,
            cache.kv_cache_tokens,
            cache.block_size,
            self.attention_backend,
            self.compile_settings,
            feature_layers=getattr(self.draft_head, "layer_ids", None),
        )
        self.grammar_compiler, self.grammar_unavailable = self._grammar_compiler()
        """Compiles structured-output grammars; None (with the reason) when this tokenizer has
        no grammar engine."""
        grammars = GrammarMasks(self.grammar_compiler) if self.grammar_compiler is not None else None
        self.sampler = Sampler(self.device, grammars)
        self.num_tree_slots = 0
        """Draft-head tree tokens per decoding sequence per step (tree size minus its root)."""
        self.num_lookup_slots = 0
        """Context-lookup tokens per decoding sequence per step, on top of the tree."""
        self.draft_weights: str | None = None
        """"int8" or the model dtype's name once a draft head is loaded (eagle_model_info)."""
        self.draft_resumes: Callable[[int, bytes, int], bool] | None = None
        """Drafter.resumes with a draft head: whether a cached block's draft entries can be taken
        over (the scheduler's prefix-cache hits ask)."""
        if self.draft_head is not None:
            self.runner = self._spec_runner()
            self.draft_resumes = self.runner.drafter.resumes
        else:
            self.runner = PlainRunner(self.target, self.sampler)
        logger.info(
            "model %s on %s (%s); max_model_len %d; KV %d tokens in %d-token blocks; %s attention%s",
            self.model_name, self.device, dtype_name(self.dtype),
            self.config.model.max_model_len, cache.kv_cache_tokens, cache.block_size,
            self.attention_backend, ", compiled" if self.compiled else "",
        )
        self.warm_up_seconds = warm_up(self.runner) if self.compiled else 0.0
        """Time the start-up spent compiling (or loading compiled graphs from the cache)."""

    @property
    def num_draft_slots(self) -> int:
        """The most draft slots one sequence can hold in a step: tree and lookup."""
        return self.num_tree_slots + self.num_lookup_slots

    def execute(self, batch: ScheduledBatch) -> StepResult:
        return self.runner.execute(batch)

    def _quantize_target(self, loaded, model: ModelConfig) -> str | None:
        mode = model.weight_quantization
        if mode == "none" or (mode == "auto" and loaded.source_linear_type != INT4_SOURCE_TYPE):
            return None  # before _int4_unavailable: it builds the int4 operator on a cold cache
        why_not = self._int4_unavailable()
        if why_not is not None:
            if mode == "auto":
                logger.info("the model's linears are %s, but its weights stay dense: %s", INT4_SOURCE_TYPE, why_not)
                return None
            raise ModelLoadError(f"--weight-quantization {mode}: {why_not}")
        replaced, left = quantize_decoder(loaded.model, pack_dense=model.weight_packing != "none")
        row_limit = measure_row_limit(loaded.model)
        logger.info(
            "int4 weights for %d target linears (%d kept: %s); the int4 kernel serves up to %d rows on this CPU",
            len(replaced), len(left), ", ".join(left) or "none", row_limit,
        )
        return "int4"

    def _int4_unavailable(self) -> str | None:
        """Why int4 weights cannot run here (None: they can). Deterministic mode with an
        explicit int4 never gets here: ModelConfig refuses it."""
        if self.device.type != "cpu" or self.dtype != torch.bfloat16:
            return f"needs a bfloat16 model on the CPU; got {dtype_name(self.dtype)} on {self.device}"
        if self.deterministic:
            return "deterministic mode needs batch-invariant linears"
        if not int4_linear_available():
            return "the int4 linear operator is unavailable (see the log)"
        return None

    def _quantize_draft(self, mode: str) -> bool:
        if not wants_int8(mode, self.device, self.dtype) or (mode == "auto" and self.compiled):
            return False
        if self.device.type != "cpu" or self.dtype != torch.bfloat16:
            raise ModelLoadError(
                f"draft_quantization int8 needs a bfloat16 model on the CPU (torch's vectorised "
                f"int8 kernel); this one is {dtype_name(self.dtype)} on "
                f"{self.device}: use none"
            )
        if self.compiled:
            raise ModelLoadError("draft_quantization int8 runs eagerly only: use --compile off, or none")
        # The fc's input mixes raw target hidden states, outlier channels included: see SpecConfig.
        row_limit = INT8_ROWS_BESIDE_PACKED if self.packed_weights else INT8_ROW_LIMIT
        replaced, left = quantize_linears(self.draft_head, keep=("fc",), row_limit=row_limit)
        if left:
            logger.warning("draft head linears left in %s (shape unsupported by the int8 kernel): %s",
                           self.dtype, ", ".join(left))
        return bool(replaced)

    def _grammar_compiler(self) -> tuple[GrammarCompiler | None, str | None]:
        try:
            return GrammarCompiler(self.tokenizer, self.vocab_size), None
        except Exception as err:  # noqa: BLE001 - any tokenizer llguidance cannot read
            logger.warning("structured outputs unavailable: %s", err)
            return None, f"structured outputs are unavailable for this tokenizer ({err})"

    def _load_draft_head(self, loaded):
        return load_draft_head(
            self.config.spec.draft,
            loaded.model.config,
            loaded.model.get_input_embeddings(),
            loaded.model.get_output_embeddings(),
            self.dtype,
            self.device,
            attn_implementation=attention.ATTN_NAME,
        )

    def _spec_runner(self) -> SpecRunner:
        spec = self.config.spec
        quantized = self._quantize_draft(spec.draft_quantization)
        if self.packed_weights:  # after int8: it packs the bf16 linears int8 falls back on, too
            pack_linears(self.draft_head)
        self.draft_weights = "int8" if quantized else dtype_name(self.dtype)
        cache = self.config.cache
        drafter = Drafter(
            self.draft_head,
            spec,
            num_pool_blocks=cache.kv_cache_tokens // cache.block_size,
            block_size=cache.block_size,
            max_num_seqs=self.config.scheduler.max_num_seqs,
            dtype=self.dtype,
            device=self.device,
            # the invariant backend's cost buys nothing in drafts, which only propose
            attention_backend="gather" if self.deterministic else self.attention_backend,
            compile=self.compile_settings,
        )
        self.num_tree_slots = spec.num_draft_tokens - 1
        self.num_lookup_slots = spec.lookup_tokens
        logger.info(
            "EAGLE draft head %s (%s%s): tree of %d tokens, depth %d, top-k %d, up to %d context "
            "lookup tokens; %s",
            spec.draft, self.draft_head.kind, ", int8 weights" if quantized else "",
            spec.num_draft_tokens, spec.depth, spec.top_k, spec.lookup_tokens, _drafting_rule(spec),
        )
        return SpecRunner(
            self.target, self.sampler, drafter, ContextLookup(spec.lookup_tokens), grammar_drafting=spec.grammar_drafting
        )


def compile_settings(model: ModelConfig, device: torch.device) -> CompileSettings | None:
    """--compile: "on" and "max-autotune" compile ("max-autotune" also times each CPU GEMM's
    candidate kernels), "off" does not; "auto" compiles, except in deterministic mode, which
    runs eagerly (ModelConfig.deterministic). On CUDA compiled forwards replay CUDA graphs."""
    mode = model.compile
    if mode == "off" or (mode == "auto" and model.deterministic):
        return None
    return CompileSettings(pack_weights=model.weight_packing != "none", autotune=mode == "max-autotune")


def resolve_attention_backend(name: str, compiled: bool, deterministic: bool = False) -> str:
    """--attention-backend auto: the batch-invariant backend in deterministic mode, else the
    in-place backend when compiling and the reference otherwise."""
    if deterministic:
        return "invariant"
    if name == "auto":
        return "paged" if compiled else "gather"
    return name


def _drafting_rule(spec: SpecConfig) -> str:
    """The log's words on who drafts."""
    if spec.max_batch is None:
        return "the speculation policy chooses who drafts each step"
    words = f"speculating while at most {spec.max_batch} sequences run" if spec.max_batch else "speculating always"
    if spec.max_batch and spec.lookup_tokens and spec.lookup_max_batch != spec.max_batch:
        limit = spec.lookup_max_batch if spec.lookup_max_batch is not None else spec.max_batch
        words += f", context lookup alone up to {limit}" if limit else ", context lookup alone above"
    return words


# The EAGLE head this project trains for its default model ships inside the package.
SHIPPED_DRAFT_DIR = Path(__file__).resolve().parents[1] / "heads" / "smollm2-135m-eagle"


def resolve_draft(config: EngineConfig) -> str | None:
    """The draft head path to load, or None for plain decoding."""
    if config.spec.draft != AUTO_DRAFT:
        return config.spec.draft
    if config.model.model == DEFAULT_MODEL and (SHIPPED_DRAFT_DIR / "config.json").exists():
        return str(SHIPPED_DRAFT_DIR)
    return None


def derive_config(config: EngineConfig, model_config, dtype, device) -> EngineConfig:
    """Fill in max_model_len, the KV size in tokens and the draft tree (a new config; the input
    is frozen)."""
    spec = config.spec.with_defaults(SPEC_DEFAULTS)
    model_max = getattr(model_config, "max_position_embeddings", None) or _DEFAULT_MAX_MODEL_LEN_CAP
    max_model_len = config.model.max_model_len or min(model_max, _DEFAULT_MAX_MODEL_LEN_CAP)
    if max_model_len > model_max:
        raise ValueError(f"max_model_len {max_model_len} exceeds the model's context of {model_max} tokens")
    window = getattr(model_config, "sliding_window", None)
    if window is not None and window < max_model_len:
        raise ValueError(
            f"the model uses sliding-window attention ({window} tokens), which eagle-serve does not "
            f"implement; pass --max-model-len {window} or less"
        )
    cache = config.cache
    tokens = cache.kv_cache_tokens
    if tokens is None:
        per_token = KVStorage.bytes_per_token(*kv_shape(model_config), dtype)
        tokens = int(cache.kv_cache_memory_gb * 2**30) // per_token
    tokens = blocks_needed(tokens, cache.block_size) * cache.block_size
    # A decoding sequence also holds its draft slots (tree + lookup), with a draft head only.
    needed = max_model_len + (spec.num_draft_tokens + spec.lookup_tokens if spec.draft else 0)
    if tokens < needed:
        raise ValueError(
            f"KV budget of {tokens} tokens cannot hold one full-length sequence ({needed} tokens); "
            "raise the KV budget or lower max_model_len"
        )
    return dataclasses.replace(
        config,
        model=dataclasses.replace(config.model, max_model_len=max_model_len),
        cache=dataclasses.replace(cache, kv_cache_tokens=tokens),
        spec=spec,
    )
