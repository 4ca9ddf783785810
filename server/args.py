"""Command line, config file and environment -> (EngineConfig, ServerSettings).

Every flag maps onto one field of a frozen config dataclass and takes its default and its type
from that field, so defaults are never written twice. Precedence, lowest to highest:
dataclass default < `--config FILE` (YAML) < environment `EAGLE_SERVE_<FLAG>` < command-line flag.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from eagle_core.config import (
    ATTENTION_BACKENDS,
    COMPILE_MODES,
    DRAFT_QUANTIZATIONS,
    WEIGHT_PACKINGS,
    WEIGHT_QUANTIZATIONS,
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    SpecConfig,
)
from server.settings import ServerSettings

ENV_PREFIX = "EAGLE_SERVE_"


def _dest(flag_name: str) -> str:
    """The namespace, config-file and environment name of a flag: "--max-num-seqs" -> "max_num_seqs"."""
    return flag_name.lstrip("-").replace("-", "_")

# The config objects a flag can land in, by section name.
_SECTIONS: dict[str, type] = {
    "server": ServerSettings,
    "model": ModelConfig,
    "cache": CacheConfig,
    "scheduler": SchedulerConfig,
    "spec": SpecConfig,
}


@dataclass(frozen=True)
class Flag:
    name: str  # "--max-num-seqs"
    section: str  # key of _SECTIONS
    field: str  # dataclass field it sets
    help: str
    choices: tuple[str, ...] | None = None

    @property
    def dest(self) -> str:
        return _dest(self.name)


FLAGS: tuple[Flag, ...] = (
    Flag("--host", "server", "host", "interface to listen on"),
    Flag("--port", "server", "port", "TCP port"),
    Flag(
        "--served-model-name",
        "server",
        "served_model_name",
        "model name clients send (default: the engine's model name)",
    ),
    Flag("--api-key", "server", "api_key", "require this bearer token on /v1/*, /tokenize and /debug/*"),
    Flag(
        "--allowed-origins",
        "server",
        "allowed_origins",
        "comma-separated CORS origins allowed to call the API ('*' for any)",
    ),
    Flag("--max-request-bytes", "server", "max_request_bytes", "largest request body (413 above)"),
    Flag(
        "--shutdown-timeout",
        "server",
        "shutdown_timeout_s",
        "seconds running requests may go on after SIGTERM/SIGINT; then they end with a "
        "server_shutdown error (503, or an error event in a stream)",
    ),
    Flag(
        "--log-level",
        "server",
        "log_level",
        "logging level",
        choices=("critical", "error", "warning", "info", "debug"),
    ),
    Flag("--model", "model", "model", "HF directory, hub id, .gguf file, or 'smollm2'"),
    Flag(
        "--tokenizer", "model", "tokenizer", "tokenizer location when it differs from the model's"
    ),
    Flag(
        "--dtype",
        "model",
        "dtype",
        "weight and activation dtype",
        choices=("auto", "float32", "bfloat16", "float16"),
    ),
    Flag("--device", "model", "device", "'auto', 'cpu', 'cuda', 'cuda:1', ..."),
    Flag("--max-model-len", "model", "max_model_len", "longest prompt + completion in tokens"),
    Flag(
        "--weight-packing",
        "model",
        "weight_packing",
        "auto: linears run on weights packed for oneDNN/MKL (compiled forwards on the CPU; eager "
        "bf16 forwards on a CPU with AMX, same numbers, linear weights held twice); none: torch's "
        "linears on the weights as loaded, and a second compiled start loads its graphs from the "
        "compile cache",
        choices=WEIGHT_PACKINGS,
    ),
    Flag(
        "--weight-quantization",
        "model",
        "weight_quantization",
        "int4: the target's decoder linears read 4-bit weights (groups of 32, the GGUF Q4_1 layout) "
        "for steps of few rows, dense bf16 ones beyond; bf16 on the CPU, not with --deterministic; "
        "none: the weights as loaded; auto: int4 when the model is a Q4_1 GGUF (the default model "
        "is), so the 4-bit weights are its own, and int4 can run here; none otherwise",
        choices=WEIGHT_QUANTIZATIONS,
    ),
    Flag(
        "--compile",
        "model",
        "compile",
        "on: compile the target's and the draft head's forwards with torch.compile at start-up; "
        "max-autotune: also choose each CPU GEMM's kernel by timing the candidates (a longer "
        "start); off: run them eagerly; auto: on (as CUDA graphs on a GPU), except with --deterministic",
        choices=COMPILE_MODES,
    ),
    Flag(
        "--attention-backend",
        "model",
        "attention_backend",
        "paged: sdpa over query tiles of the paged cache, one compiled graph for every step; gather: "
        "copy each group's K/V out and run sdpa per group (the reference); auto: paged when "
        "compiling, else gather",
        choices=ATTENTION_BACKENDS,
    ),
    Flag(
        "--deterministic",
        "model",
        "deterministic",
        "true: a seeded request gets the same tokens alone and in any batch, with or without "
        "speculation, in bf16 as in fp32 (batch-invariant linears and attention, run eagerly: "
        "needs --compile auto or off and --attention-backend auto; slower, docs/api.md); false: "
        "the fast kernels, whose results may change in the last bits with the batch",
    ),
    Flag(
        "--control-tokens-in-content",
        "model",
        "control_tokens_in_content",
        "false: chat message content is tokenized as plain text, so a user cannot write the "
        "model's control tokens (e.g. forge a system turn); true: special-token text in content "
        "becomes control tokens, as the tokenizer does by default",
    ),
    Flag("--block-size", "cache", "block_size", "tokens per KV block"),
    Flag("--prefix-caching", "cache", "prefix_caching",
         "reuse the KV of full blocks whose whole token prefix an earlier request computed (multi-turn "
         "chat, shared system prompts); false: compute every prompt in full (also --no-prefix-caching)"),
    Flag(
        "--kv-cache-tokens", "cache", "kv_cache_tokens", "KV budget in tokens across all sequences"
    ),
    Flag(
        "--kv-cache-memory-gb",
        "cache",
        "kv_cache_memory_gb",
        "KV budget in GiB when --kv-cache-tokens is not given",
    ),
    Flag("--max-num-seqs", "scheduler", "max_num_seqs", "most sequences running in one step"),
    Flag(
        "--max-num-batched-tokens",
        "scheduler",
        "max_num_batched_tokens",
        "token budget of one step",
    ),
    Flag("--max-waiting", "scheduler", "max_waiting", "longest waiting queue (429 past it)"),
    Flag("--draft", "spec", "draft", "EAGLE draft head directory; 'auto' = the shipped head of the default model"),
    Flag("--num-draft-tokens", "spec", "num_draft_tokens",
         "draft tree size including the root: pins every head tree to it; None: the speculation "
         "policy chooses each step's size, up to 8"),
    Flag("--draft-depth", "spec", "depth",
         "most draft forwards per step (tree levels; a smaller tree takes fewer); None: 3"),
    Flag("--draft-top-k", "spec", "top_k", "children expanded per tree node (1 = a chain); None: 3"),
    Flag("--lookup-tokens", "spec", "lookup_tokens",
         "most draft tokens copied from earlier in the sequence where its last tokens occurred "
         "before, verified with the tree, from the step's leftover token budget (0 = off); None: 8"),
    Flag("--spec-max-batch", "spec", "max_batch",
         "pin who drafts: the head drafts only while at most this many sequences run (0 = always), "
         "full-size trees; None: the speculation policy chooses each step who drafts and how large "
         "a tree, from measured step costs and acceptance"),
    Flag("--grammar-drafting", "spec", "grammar_drafting",
         "true: for structured outputs, drop draft-tree nodes the grammar forbids before "
         "verification and draft the tokens it forces; false: verify trees as drafted (also "
         "--no-grammar-drafting)"),
    Flag("--lookup-max-batch", "spec", "lookup_max_batch",
         "pin lookup alone: steps without a head tree verify context lookup's chain while at most "
         "this many sequences run (0 = any number); None: the policy chooses (with --spec-max-batch "
         "pinned: up to it)"),
    Flag(
        "--draft-quantization",
        "spec",
        "draft_quantization",
        "draft head weights: int8 (bf16 models on the CPU), none (the model dtype), auto (int8 where it applies)",
        choices=DRAFT_QUANTIZATIONS,
    ),
)
_BY_DEST = {f.dest: f for f in FLAGS}


@dataclass(frozen=True)
class Switch:
    """A flag without a value that, when given (or true in the config file or environment),
    sets one field to `value`; the field's own flag, if any, is overridden."""

    name: str
    section: str
    field: str
    value: Any
    help: str

    @property
    def dest(self) -> str:
        return _dest(self.name)


SWITCHES: tuple[Switch, ...] = (
    Switch("--no-speculation", "spec", "draft", None,
           "decode without a draft head even if --draft is set (the speedup baseline)"),
    Switch("--no-prefix-caching", "cache", "prefix_caching", False,
           "compute every prompt in full instead of reusing the KV of earlier requests' equal prefixes"),
    Switch("--no-grammar-drafting", "spec", "grammar_drafting", False,
           "verify structured-output requests' draft trees as drafted (no grammar pruning or forced tokens)"),
)
_SWITCH_BY_DEST = {s.dest: s for s in SWITCHES}


class ConfigError(ValueError):
    """A bad config file entry or environment value; the message names the key."""


def _field_type(flag: Flag) -> Any:
    return typing.get_type_hints(_SECTIONS[flag.section])[flag.field]


def _field_default(flag: Flag) -> Any:
    cls = _SECTIONS[flag.section]
    for f in dataclasses.fields(cls):
        if f.name == flag.field:
            if f.default is not dataclasses.MISSING:
                return f.default
            return f.default_factory()  # type: ignore[misc]
    raise KeyError(flag.field)


def _convert(flag: Flag, value: Any) -> Any:
    """Turn a string (flag, env) or YAML value into the field's type."""
    tp = _field_type(flag)
    args = typing.get_args(tp)
    optional = type(None) in args
    if optional:
        tp = next(a for a in args if a is not type(None))
    if value is None or (optional and isinstance(value, str) and value.lower() in ("", "none")):
        if optional:
            return None
        raise ConfigError(f"{flag.dest} cannot be empty")
    origin = typing.get_origin(tp)
    if origin is tuple:  # tuple[str, ...]: comma-separated string or a YAML list
        items = value.split(",") if isinstance(value, str) else list(value)
        return tuple(str(i).strip() for i in items if str(i).strip())
    if tp is bool:
        return _to_bool(flag.dest, value)
    try:
        converted = tp(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{flag.dest}: expected {tp.__name__}, got {value!r}") from exc
    if flag.choices and converted not in flag.choices:
        raise ConfigError(f"{flag.dest}: must be one of {', '.join(flag.choices)}, got {value!r}")
    return converted


def _to_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{key}: expected a boolean, got {value!r}")


def _type_name(flag: Flag) -> str:
    tp = _field_type(flag)
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    if typing.get_origin(tp) is tuple:
        return "A,B,..."
    return getattr(tp, "__name__", "str").upper()


def build_parser() -> argparse.ArgumentParser:
    # SUPPRESS keeps absent flags out of the namespace, so we can tell "given" from "default"
    # and let the config file and the environment fill the gaps.
    parser = argparse.ArgumentParser(
        prog="eagle-serve",
        description="OpenAI-compatible server with EAGLE speculative decoding.",
        argument_default=argparse.SUPPRESS,
        epilog=f"Every flag can also come from the environment as {ENV_PREFIX}<FLAG> "
        f"(e.g. {ENV_PREFIX}API_KEY) or from the --config YAML file (keys like max_num_seqs).",
    )
    parser.add_argument("--config", metavar="FILE", help="YAML file of flag values (flags win)")
    for flag in FLAGS:
        parser.add_argument(
            flag.name,
            metavar=_type_name(flag),
            choices=flag.choices,
            help=f"{flag.help} (default: {_field_default(flag)!r})",
        )
    for switch in SWITCHES:
        parser.add_argument(switch.name, action="store_true", help=switch.help)
    return parser


def _load_yaml(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"config file not found: {path}")
    data = yaml.safe_load(file.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of flag names to values")
    out = {}
    for key, value in data.items():
        dest = _dest(str(key))
        if dest not in _BY_DEST and dest not in _SWITCH_BY_DEST:
            raise ConfigError(f"{path}: unknown key {key!r}")
        out[dest] = value
    return out


def _from_env(environ: typing.Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dest in [*_BY_DEST, *_SWITCH_BY_DEST]:
        key = ENV_PREFIX + dest.upper()
        if key in environ:
            out[dest] = environ[key]
    return out


def parse_args(
    argv: Sequence[str] | None = None, environ: typing.Mapping[str, str] | None = None
) -> tuple[EngineConfig, ServerSettings]:
    """Parse the command line (plus config file and environment) into the two config objects.

    Raises SystemExit (via argparse) for unknown flags and ConfigError for bad values.
    """
    environ = os.environ if environ is None else environ
    given = vars(build_parser().parse_args(argv))
    for dest in _SWITCH_BY_DEST:
        if not given.get(dest):
            given.pop(dest, None)  # store_true always sets it; only True is "given"
    config_file = given.pop("config", None) or environ.get(ENV_PREFIX + "CONFIG")
    merged: dict[str, Any] = {}
    if config_file:
        merged.update(_load_yaml(config_file))
    merged.update(_from_env(environ))
    merged.update(given)

    values: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
    for dest, raw in merged.items():
        if dest in _SWITCH_BY_DEST:
            continue
        flag = _BY_DEST[dest]
        values[flag.section][flag.field] = _convert(flag, raw)
    for switch in SWITCHES:
        if _to_bool(switch.dest, merged.get(switch.dest, False)):
            values[switch.section][switch.field] = switch.value

    try:  # values that conflict (--deterministic with --compile on) or are out of range
        engine_config = EngineConfig(
            model=ModelConfig(**values["model"]),
            cache=CacheConfig(**values["cache"]),
            scheduler=SchedulerConfig(**values["scheduler"]),
            spec=SpecConfig(**values["spec"]),
        )
        settings = ServerSettings(**values["server"])
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return engine_config, settings
