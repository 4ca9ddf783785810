"""The project's own CPU kernels (worker/csrc/), built on first use and cached per machine.

`paged_attention_available()` builds and loads `csrc/paged_attention.cpp` once per process: a
torch operator, `torch.ops.eagle_serve.paged_attention`, that attends query tiles over keys and
values of the paged cache, read in place for tiles of few query slots (its contract is in the
source). torch.compile calls
it as an opaque operator (its shapes come from `_fake_paged_attention`).

The build uses torch's C++ extension tooling (ninja, the system's C++ compiler, the same one
inductor needs) with the vector ISA inductor picks for this CPU, so the library is specific to
the machine: it lives under `$EAGLE_SERVE_CACHE/kernels/<key>`, keyed by the source, torch's
version and the ISA, and a second start loads it without compiling. Where it cannot be built
(no compiler), the function says so once in the log and returns False; the attention backend
then uses sdpa over gathered keys for every bucket.
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


@functools.cache
def paged_attention_available() -> bool:
    """Builds (or finds in the cache) and loads the paged attention kernel; True when
    `torch.ops.eagle_serve.paged_attention` can be called."""
    isa, flags = _isa_flags()
    key = hashlib.sha256(_SOURCE.read_bytes() + f"{torch.__version__}|{isa}|{flags}".encode()).hexdigest()[:16]
    try:
        build(_NAME, _SOURCE, cache_root() / "kernels" / f"{_NAME}-{key}")
    except Exception as exc:  # no compiler or ninja, a failed build: fall back, loudly
        logger.warning("CPU paged attention kernel unavailable, using sdpa over gathered keys: %s", exc)
        return False
    torch.library.register_fake("eagle_serve::paged_attention")(_fake_paged_attention)
    return True


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
