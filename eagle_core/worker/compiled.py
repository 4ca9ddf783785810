"""torch.compile for the step's forwards: settings, the on-disk cache, dynamic dimensions.

One compiled graph serves every step of a forward function: inputs are padded so that no
dimension is 0 or 1 (worker/attn_paged.py) and every input dimension is marked dynamic, so a new
batch size, context length or tree size never recompiles. Inductor's freezing treats the weights
as constants, which on the CPU lets it pack every linear's weight for oneDNN once.

On CUDA the compiled forwards also run as CUDA graphs (inductor's cudagraph trees, the
`mode="reduce-overhead"` of torch.compile): one graph is recorded per distinct set of input
shapes, so the inputs are padded to power-of-two buckets there (`CompileSettings.shape_buckets`,
worker/attn_paged.py) and a few graphs cover every step. A step then costs one graph launch
instead of one launch per kernel.

Compiled artifacts are cached under `$EAGLE_SERVE_CACHE/inductor` (TORCHINDUCTOR_CACHE_DIR, when
not already set). A second start with the same model, torch and code skips most of the work
for graphs without packed weights (CompiledFunction), and only the C++ kernel builds for those
with them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from eagle_core.worker.loader import cache_root


def use_cache_dir() -> None:
    """Point inductor's caches at the project's cache root unless the user chose a place.
    Inductor writes its default into the environment on first use, so a value equal to that
    default counts as not chosen."""
    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current is None or os.path.abspath(current) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_root() / "inductor")


INDUCTOR_SETTINGS = {
    # weights as constants (packed for oneDNN/MKL on the CPU unless CompiledFunction says not to)
    "freezing": True,
    # a C++ wrapper calls the kernels, not Python: less host time per layer
    "cpp_wrapper": True,
    # Realize pointwise results of more than 10 ops instead of inlining them into consumers:
    # inlined, RoPE's query rotation was recomputed for every key position inside attention
    # (worker/attn_paged.py), several times its cost (docs/benchmarks.md, "Host cost")
    "realize_opcount_threshold": 10,
}

CPU_AUTOTUNE = {
    # Each GEMM's kernel is chosen by timing the candidates on this machine while compiling:
    # the library's (oneDNN or MKL, "ATEN") or inductor's own C++ template ("CPP"), which
    # fuses the epilogue and costs no library call. The choices are cached with the graphs.
    "max_autotune": True,
    "max_autotune_gemm_backends": "CPP,ATEN",
}
"""Added on the CPU with `CompileSettings.autotune`: timing every GEMM's candidates (each a C++
build) lengthens a start (docs/benchmarks.md, "Host cost"); on GPUs max_autotune would time
Triton GEMMs instead."""

CPU_CONCAT_LINEAR = {"cpp.enable_concat_linear": True}
"""Always on the CPU: linears that read the same input (q/k/v, gate/up) become one GEMM."""


@dataclass(frozen=True)
class CompileSettings:
    """How the step's forwards are compiled (ModelConfig.compile and weight_packing)."""

    pack_weights: bool = True
    """Freezing repacks CPU linear weights for oneDNN/MKL (see CompiledFunction)."""
    autotune: bool = False
    """Each CPU GEMM's kernel is chosen by timing the candidates while compiling."""

    @staticmethod
    def graphs(device: torch.device) -> bool:
        """Whether compiled forwards on `device` replay CUDA graphs: on CUDA, always."""
        return device.type == "cuda"

    def shape_buckets(self, device: torch.device) -> bool:
        """Whether forwards on `device` pad their dynamic dimensions to powers of two: one CUDA
        graph is recorded per distinct shape."""
        return self.graphs(device)

    def inductor(self, device: torch.device) -> dict:
        """Inductor's config for forwards on `device`."""
        settings = {**INDUCTOR_SETTINGS, "cpp.weight_prepack": self.pack_weights}
        if device.type == "cpu":
            settings |= CPU_CONCAT_LINEAR
            if self.autotune:
                settings |= CPU_AUTOTUNE
        else:
            # the graph replay replaces the wrapper's launches; a C++ wrapper only adds build time
            settings |= {"cpp_wrapper": False, "triton.cudagraphs": self.graphs(device)}
        return settings


_process_packing: bool | None = None
"""The weight packing of this process's compiled forwards: inductor registers its packing passes
once per process, at the first compilation, so either every compiled forward packs or none does."""

_MAX_INSTANCES = 256
"""Compiled graphs one process may hold per forward method (one or two per model instance)."""


class CompiledFunction:
    """`fn` compiled whole by torch.compile (fullgraph: a graph break would put Python back
    between layers), with inductor's freezing. With `pack_weights`, freezing also repacks every
    CPU linear's weight into oneDNN's (or MKL's) blocked layout; inductor's FX graph cache cannot
    store graphs holding such constants, so only unpacked graphs come back from the on-disk cache
    at the next start.

    Until `warmed_up()`, calls run dynamo's guards and may compile. After it, only the guards
    that tell compiled graphs apart run (`skip_guard_eval_unsafe`): evaluating every guard
    (each weight, each input's dtype and device) costs host time on every call. That is
    safe here because nothing a guard checks changes after warm-up: every input dimension is
    dynamic and at least 2, dtypes, devices and weights are fixed.

    As CUDA graphs (`CompileSettings.graphs`), the tensors in `static_inputs` (the KV storage,
    which every forward writes in place) keep their address and are read and written by the
    graphs directly; every other input is copied into the graph's own buffers at each call.
    Outputs live in memory that the next replay overwrites, so each call returns copies."""

    def __init__(
        self,
        fn: Callable,
        device: torch.device,
        settings: CompileSettings,
        static_inputs: tuple[torch.Tensor, ...] = (),
    ):
        global _process_packing
        pack_weights = settings.pack_weights
        if _process_packing is None:
            _process_packing = pack_weights
        elif _process_packing != pack_weights:
            raise ValueError(
                f"this process compiles with weight packing {'on' if _process_packing else 'off'}: "
                "one process cannot compile forwards both with and without packed weights"
            )
        use_cache_dir()
        self._settings = settings.inductor(device)
        self.graphs = settings.graphs(device)
        if self.graphs:
            for tensor in static_inputs:
                # guarded: under freezing dynamo makes the tensor a graph attribute, so a forward
                # of another instance (another KV storage) must compile its own graph
                torch._dynamo.mark_static_address(tensor, guard=True)
        # Dynamo caches compiled graphs per code object, and every model instance of a process
        # (tests and benchmarks build several engines) adds entries for the same method.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, _MAX_INSTANCES)
        torch._dynamo.config.accumulated_recompile_limit = max(
            torch._dynamo.config.accumulated_recompile_limit, 4 * _MAX_INSTANCES
        )
        self._compiled = torch.compile(fn, fullgraph=True)
        self.guarded = True

    def warmed_up(self) -> None:
        self.guarded = False

    def __call__(self, *args):
        if self.graphs:
            # every earlier output is dead (copied below): replay from the tree's root
            torch.compiler.cudagraph_mark_step_begin()
        if self.guarded:
            # torch 2.13 reads freezing from inductor's global config when it compiles, not
            # from torch.compile(options=...)
            with torch._inductor.config.patch(self._settings):
                out = self._compiled(*args)
        else:
            with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                out = self._compiled(*args)
        if self.graphs:
            out = tuple(t.clone() for t in out)
        return out


def mark_dynamic(*tensors: torch.Tensor) -> None:
    """Every dimension of these inputs is dynamic (each must have size >= 2)."""
    for tensor in tensors:
        for dim in range(tensor.dim()):
            torch._dynamo.mark_dynamic(tensor, dim)


def mark_dynamic_rows(*tensors: torch.Tensor) -> None:
    """Dimension 0 of these inputs is dynamic (size >= 2); the others are the model's widths."""
    for tensor in tensors:
        torch._dynamo.mark_dynamic(tensor, 0)
