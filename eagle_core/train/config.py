"""Training configuration: one frozen dataclass per stage, read from a YAML file."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import yaml

OBJECTIVES = ("soft_ce", "lk")


@dataclass(frozen=True)
class PromptsConfig:
    num_prompts: int = 6000
    seed: int = 0
    num_heldout: int = 64
    """The last `num_heldout` prompts are never generated for training: they are the held-out set."""
    style: str = "basic"
    """"basic" (short single requests, prompts.py), "rich" (long-form, multi-part and constrained
    requests, rich_prompts.py) or "self" (requests written by the target model itself,
    self_prompts.py). Each style has its own prompt file in the work dir."""
    self_temperature: float = 1.0
    """"self" style: sampling temperature of the model-written requests."""
    self_max_tokens: int = 128
    """"self" style: longest request; requests cut at this length are dropped."""


@dataclass(frozen=True)
class GenerateConfig:
    enabled: bool = True
    max_prompts: int | None = None
    """Generate responses for the first max_prompts training prompts (None: all). Raise it and rerun
    to add data: finished parts are kept."""
    part_size: int = 128
    """Prompts per output part (the unit of resumption)."""
    max_tokens: int = 256
    temperatures: tuple[float, ...] = (0.0, 0.0, 0.0, 0.7)
    """Part p uses temperatures[p % len]: mostly greedy (what T=0 serving sees), some sampled."""
    max_num_seqs: int = 64
    first_part: int = 0
    """Part p of this prompt style is written as part number first_part + p, so that the parts
    of several styles share one responses directory (all of them are trained on)."""
    draft: str | None = None
    """None: the target alone writes the answers. An EAGLE head ("auto": the shipped one): the
    answers are written with it drafting at every step (on-policy data; the text is distributed
    as the target's all the same), and each row records which tokens the head supplied, so
    that features.missed_weight can weigh the positions where its drafts were rejected."""
    system_prompt: str | None = None
    committed_dir: str | None = None
    """Directory of committed, gzipped response parts (part-NNNNN.jsonl.gz): parts found there are
    unpacked into the work dir instead of being generated again."""


@dataclass(frozen=True)
class CorpusConfig:
    enabled: bool = True
    max_tokens: int = 200_000
    """Tokens of fixed text to collect (read teacher-forced: ~5x cheaper per token than generating)."""
    chunk_tokens: int = 384
    licenses: tuple[str, ...] = ("MIT", "BSD", "Apache", "PSF", "Python Software Foundation", "ISC")
    """Package licences accepted (substring match on the package's License metadata)."""


@dataclass(frozen=True)
class FeaturesConfig:
    shard_tokens: int = 16384
    """Tokens per feature shard (the unit of resumption)."""
    batch_tokens: int = 2048
    max_seq_len: int = 512
    top_k: int = 8
    """Target next-token distribution kept per position (top-k ids and probabilities)."""
    prompt_loss_weight: float = 0.2
    """Loss weight of prompt (user/system) positions; assistant and fixed text weigh 1."""
    missed_weight: float = 1.0
    """Loss weight of the answer tokens of on-policy answers (generate.draft) that the head did
    not supply (its drafts there were rejected, or the step's tree ended); other positions
    weigh as above."""


@dataclass(frozen=True)
class TrainerConfig:
    kind: str = "eagle3"
    """"eagle3" (multi-step training-time test, reduced draft vocabulary) or "eagle1"."""
    draft_vocab_size: int = 8192
    """Tokens the head can draft (the most frequent target top-1 tokens of the data). With a warm
    start the head keeps its own vocabulary, grown to this size if it is smaller."""
    num_layers: int = 1
    """Decoder layers of the head (EAGLE-3's own first, then plain Llama layers). A warm start
    from a head with fewer layers grows it: the new layers start as identities."""
    ttt_steps: int = 3
    """Unrolled draft steps per position (EAGLE-3 training-time test); 1 = single step."""
    step_decay: float = 0.8
    """Loss weight of unrolled step k is step_decay ** k."""
    objective: str = "soft_ce"
    """Loss per position (trainer.py's docstring): "soft_ce", cross-entropy against the target's
    top-k distribution; "lk", the negative log of the rate at which the head's sampled token is
    accepted under the target at T=1, plus lk_ce_weight x soft_ce."""
    lk_ce_weight: float = 0.1
    """"lk" only: weight of the soft_ce term added to it."""
    epochs: float = 4.0
    batch_tokens: int = 4096
    max_seq_len: int = 512
    lr: float = 1e-3
    warmup_steps: int = 50
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    feature_loss_weight: float = 1.0
    """EAGLE-1 only: weight of the smooth-L1 feature loss (CE weight is 0.1 as in EAGLE-1)."""
    bf16_autocast: bool = True
    num_threads: int = 2
    seed: int = 0
    save_every_steps: int = 100
    exclude_sources: tuple[str, ...] = ("pypi:tqdm==",)
    """Fixed-text chunks whose source starts with one of these are left out of training (tqdm's
    README is MPL-2.0 AND MIT; the corpus filter now rejects MPL, but older captures hold it)."""
    response_repeat: int = 1
    """Self-distilled sequences appear this many times per epoch (fixed text once): they match
    what the head drafts at serving time."""
    prompt_styles: tuple[str, ...] | None = None
    """Train only on responses to prompts of these styles (fixed text always); None: all. Lets
    one work dir serve a run on older data, e.g. the warm start's first phase."""
    max_train_tokens: int | None = None
    """Use only the first N captured tokens (for acceptance-versus-data-size runs)."""
    output: str | None = None
    """Head directory (default: <work_dir>/head)."""
    init_from: str | None = None
    """Warm start: an EAGLE-3 head directory whose weights and draft vocabulary this run starts
    from (e.g. a head trained on earlier data, continued on new data); None trains from scratch."""
    snapshot_fractions: tuple[float, ...] = ()
    """Also save the head (with validation accuracy) after these fractions of the run, e.g.
    (0.25, 0.5): in a one-epoch run, heads that have seen 25% and 50% of the data."""

    def __post_init__(self) -> None:
        if self.num_layers < 1:
            raise ValueError(f"trainer.num_layers must be >= 1, got {self.num_layers}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"trainer.objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if self.lk_ce_weight < 0:
            raise ValueError(f"trainer.lk_ce_weight must be >= 0, got {self.lk_ce_weight}")


@dataclass(frozen=True)
class EvalConfig:
    max_tokens: int = 256
    temperatures: tuple[float, ...] = (0.0, 1.0)
    num_mtbench: int = 80
    num_heldout: int = 64
    speed_prompts: int = 10
    """MT-bench questions timed one at a time (batch 1), speculation on and off interleaved."""
    speed_max_tokens: int = 128
    seed: int = 0
    draft_quantization: str = "auto"
    """As the server's --draft-quantization; "none" measures the head in the model dtype."""
    tree: tuple[int, ...] | None = None
    """(num_draft_tokens, depth, top_k) to measure with; None: the server's largest tree
    (config.SPEC_DEFAULTS), at that fixed size."""
    lookup_tokens: int | None = None
    """Context-lookup draft tokens on top of the tree (--lookup-tokens; 0: the head's drafts
    alone); None: the server's default."""

    def __post_init__(self) -> None:
        if self.tree is not None and (len(self.tree) != 3 or min(self.tree) < 1):
            raise ValueError(f"eval.tree must be [num_draft_tokens, depth, top_k], each >= 1; got {list(self.tree)}")
        if self.lookup_tokens is not None and self.lookup_tokens < 0:
            raise ValueError(f"eval.lookup_tokens must be >= 0, got {self.lookup_tokens}")


@dataclass(frozen=True)
class TrainConfig:
    model: str = "smollm2"
    dtype: str = "bfloat16"
    work_dir: str = ".cache/train/smollm2"
    num_threads: int = 2
    prompts: PromptsConfig = field(default_factory=PromptsConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


def _build(cls, raw: dict[str, Any] | None):
    raw = dict(raw or {})
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in raw:
            continue
        value = raw.pop(f.name)
        sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if sub is not None and dataclasses.is_dataclass(sub):
            value = _build(sub, value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[f.name] = value
    if raw:
        raise ValueError(f"unknown {cls.__name__} keys: {sorted(raw)}")
    return cls(**kwargs)


def load_config(path: str, overrides: list[str] | None = None) -> TrainConfig:
    """Read a YAML config; `overrides` are "section.key=value" strings (YAML-parsed values)."""
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    for item in overrides or []:
        key, _, value = item.partition("=")
        node = raw
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = yaml.safe_load(value)
    return _build(TrainConfig, raw)
