"""In-process reference rows: plain Hugging Face `generate` (always) and llama.cpp through
`llama-cpp-python` (only when it is importable; it is never a dependency of the project).

Both take the prompt token ids the server built (its /tokenize route, so the chat template is
the server's), decode greedily up to `max_tokens` new tokens, stopping at end of sequence, at
batch 1, and report wall time per prompt (HF `generate` honours --ignore-eos, llama.cpp always
stops at end of sequence). Neither streams, so they have no TTFT.
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class GenerateRun:
    prompt_id: str
    completion_tokens: int
    seconds: float
    text: str


class HFGenerate:
    """transformers' `generate` on the model the servers load, same dtype and device (loaded
    through eagle_core's loader, so "smollm2" and GGUF files resolve the same way)."""

    name = "hf_generate"

    def __init__(self, model: str, dtype: str, device: str):
        from eagle_core.config import ModelConfig
        from eagle_core.worker.loader import dtype_name, load_model

        loaded = load_model(ModelConfig(model=model, dtype=dtype, device=device))
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.device = loaded.device
        self.dtype = dtype_name(loaded.dtype)
        self.source = loaded.source

    def run(self, prompt_id: str, prompt_ids: list[int], max_tokens: int, ignore_eos: bool = False) -> GenerateRun:
        import torch

        input_ids = torch.tensor([prompt_ids], device=self.device)  # [1, prompt_len]
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self._sync()
        start = time.perf_counter()
        with torch.inference_mode():
            output = self.model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens if ignore_eos else None,
                do_sample=False,
                temperature=None,
                top_p=None,
                top_k=None,
                pad_token_id=eos if isinstance(eos, int) else eos[0],
            )
        self._sync()
        seconds = time.perf_counter() - start
        new_ids = output[0, len(prompt_ids):].tolist()
        eos_ids = {eos} if isinstance(eos, int) else set(eos or ())
        if new_ids and new_ids[-1] in eos_ids:
            new_ids = new_ids[:-1]  # the server's usage does not count the end-of-sequence token
        return GenerateRun(prompt_id, len(new_ids), seconds, self.tokenizer.decode(new_ids))

    def _sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def llama_cpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def gguf_path_of(model: str) -> Path | None:
    """The GGUF file behind a model spec: the packaged default's, a .gguf path, else None."""
    from eagle_core.config import DEFAULT_MODEL

    if model == DEFAULT_MODEL:
        from eagle_core.worker.loader import default_gguf_path

        try:
            return default_gguf_path()
        except Exception:
            return None
    if model.endswith(".gguf") and Path(model).is_file():
        return Path(model)
    return None


class LlamaCpp:
    """llama.cpp on the same GGUF file (at the file's own quantization: llama.cpp does not
    dequantize to the servers' dtype, so this is a peer row, not a like-for-like one)."""

    name = "llama_cpp"

    def __init__(self, gguf_path: Path, n_ctx: int, use_gpu: bool):
        import llama_cpp

        self.version = getattr(llama_cpp, "__version__", "unknown")
        self.llm = llama_cpp.Llama(
            model_path=str(gguf_path), n_ctx=n_ctx, n_gpu_layers=-1 if use_gpu else 0, verbose=False
        )

    def run(self, prompt_id: str, prompt_ids: list[int], max_tokens: int, ignore_eos: bool = False) -> GenerateRun:
        """`ignore_eos` is not supported here: llama.cpp stops at end of sequence."""
        self.llm.reset()
        start = time.perf_counter()
        out = self.llm.create_completion(prompt=prompt_ids, max_tokens=max_tokens, temperature=0.0)
        seconds = time.perf_counter() - start
        return GenerateRun(
            prompt_id, int(out["usage"]["completion_tokens"]), seconds, out["choices"][0]["text"]
        )
