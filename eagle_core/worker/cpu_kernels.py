"""The project's own CPU kernels (worker/csrc/), built on first use and cached per machine.

`paged_attention_available()` builds and loads `csrc/paged_attention.cpp` once per process: a
torch operator, `torch.ops.eagle_serve.paged_attention`, that attends query tiles over keys and
values of the paged cache, read in place for tiles of few query slots (its contract is in the
source). `int4_linear_available()` does the same for `csrc/int4_linear.cpp`,
`torch.ops.eagle_serve.int4_linear` (worker/int4_linear.py). torch.compile calls both as opaque
operators (their shapes come from the `_fake_*` functions).

The build uses torch's C++ extension tooling (ninja, the system's C++ compiler, the same one
inductor needs) with the vector ISA inductor picks for this CPU, so the library is specific to
the machine: it lives under `$EAGLE_SERVE_CACHE/kernels/<key>`, keyed by the source, torch's
version and the ISA, and a second start loads it without compiling. Where it cannot be built
(no compiler), the function says so once in the log and returns False; the attention backend
then uses sdpa over gathered keys for every bucket, and int4 weights are refused.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from pathlib import Path

import torch

from eagle_core.worker.loader import cache_root

logger = logging.getLogger(__name__)

_SOURCE = Path(__file__).parent / "csrc" / "paged_attention.cpp"
_NAME = "eagle_serve_paged_attention"
_INT4_SOURCE = Path(__file__).parent / "csrc" / "int4_linear.cpp"
_INT4_NAME = "eagle_serve_int4_linear"


def _isa_flags() -> tuple[str, list[str]]:
    """The vector ISA inductor would compile for on this CPU, and its compiler flags."""
    from torch._inductor import cpu_vec_isa

    isa = cpu_vec_isa.pick_vec_isa()
    if not isa:
        return "scalar", []
    macros = isa.build_macro()  # e.g. ["CPU_CAPABILITY_AVX512"]
    # ATen's vector headers also name their namespace after the capability (CPU_CAPABILITY)
    capability = next(m.removeprefix("CPU_CAPABILITY_") for m in macros if m.startswith("CPU_CAPABILITY_"))
    flags = [*(f"-D{macro}" for macro in macros), f"-DCPU_CAPABILITY={capability}", *isa.build_arch_flags().split()]
    return str(isa), flags


def build(name: str, source: Path, build_dir: Path) -> None:
    """Compile `source` for this CPU's vector ISA (`_isa_flags`) into `build_dir` and load it
    into the process as library `name` (its TORCH_LIBRARY registrations take effect)."""
    from torch.utils.cpp_extension import load

    build_dir.mkdir(parents=True, exist_ok=True)
    load(
        name=name,
        sources=[str(source)],
        extra_cflags=["-O3", "-fopenmp", *_isa_flags()[1]],
        extra_ldflags=["-fopenmp"],
        build_directory=str(build_dir),
        is_python_module=False,
        verbose=False,
    )


def _load(name: str, source: Path) -> None:
    """Build `source` (or find it in the cache) and load it as library `name`."""
    isa, flags = _isa_flags()
    key = hashlib.sha256(source.read_bytes() + f"{torch.__version__}|{isa}|{flags}".encode()).hexdigest()[:16]
    build(name, source, cache_root() / "kernels" / f"{name}-{key}")


@functools.cache
def paged_attention_available() -> bool:
    """Builds (or finds in the cache) and loads the paged attention kernel; True when
    `torch.ops.eagle_serve.paged_attention` can be called."""
    try:
        _load(_NAME, _SOURCE)
    except Exception as exc:  # no compiler or ninja, a failed build: fall back, loudly
        logger.warning("CPU paged attention kernel unavailable, using sdpa over gathered keys: %s", exc)
        return False
    torch.library.register_fake("eagle_serve::paged_attention")(_fake_paged_attention)
    return True


@functools.cache
def int4_linear_available() -> bool:
    """Builds (or finds in the cache) and loads the int4 linear operator (worker/int4_linear.py);
    True when `torch.ops.eagle_serve.int4_linear` can be called."""
    if not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") or not torch.backends.mkldnn.is_available():
        logger.warning("int4 weights unavailable: this torch build lacks its CPU int4 kernel or oneDNN")
        return False
    try:
        _load(_INT4_NAME, _INT4_SOURCE)
    except Exception as exc:
        logger.warning("int4 linear operator unavailable: %s", exc)
        return False
    torch.library.register_fake("eagle_serve::int4_linear")(_fake_int4_linear)
    return True


def _fake_int4_linear(
    x: torch.Tensor,  # [N, in] bfloat16
    weight4: torch.Tensor,  # tiles: [out / 16, in / 32, 16, 16] uint8
    scales: torch.Tensor,  # not tiles: [in / group, out, 2]
    zeros: torch.Tensor,
    tiles: bool,
    dense: torch.Tensor,
    dense_packed: bool,
    group: int,
    row_limit: int,
) -> torch.Tensor:  # [N, out]
    out_features = weight4.shape[0] * 16 if tiles else scales.shape[1]
    return x.new_empty(x.shape[0], out_features)


def _fake_paged_attention(
    query: torch.Tensor,  # [N, Q, H, D] float32
    key_cache: torch.Tensor,  # [S, KVH, D]
    value_cache: torch.Tensor,  # [S, KVH, D]
    key_slots: torch.Tensor,  # [N, L] long
    visible: torch.Tensor,  # [N, Q, L] bool
    scale: float,
    max_in_place_query: int,
) -> torch.Tensor:  # [N, Q, H, D] float32
    return torch.empty_like(query)
