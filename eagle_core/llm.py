"""Offline batch generation: `LLM(model=...).generate(prompts, SamplingParams(...))`."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from eagle_core.config import AUTO_DRAFT, EngineConfig, ModelConfig
from eagle_core.engine import Engine
from eagle_core.outputs import SpecStats
from eagle_core.sampling_params import SamplingParams


@dataclass
class CompletionOutput:
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    spec: SpecStats = field(default_factory=SpecStats)
    token_sources: list[str] | None = None
    """One per token of token_ids (eagle_core.batch's *_SOURCE) when SamplingParams.token_sources."""


class LLM:
    """Runs the same engine as the server, synchronously, over a list of prompts."""

    def __init__(
        self,
        model: str = ModelConfig.model,
        dtype: str = "auto",
        config: EngineConfig | None = None,
        draft: str | None = AUTO_DRAFT,
        **model_options,
    ):
        """`draft`: an EAGLE head directory, "auto" (the shipped head for the default model) or
        None (plain decoding). It overrides `config.spec.draft` unless left at "auto"."""
        config = config or EngineConfig()
        config = dataclasses.replace(
            config,
            model=dataclasses.replace(config.model, model=model, dtype=dtype, **model_options),
            spec=config.spec if draft == AUTO_DRAFT else dataclasses.replace(config.spec, draft=draft),
        )
        self.engine = Engine(config)
        self._ids = itertools.count()

    def generate(
        self,
        prompts: str | list[str] | list[list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[CompletionOutput]:
        """`params`: one SamplingParams for all prompts, or one per prompt."""
        prompts = [prompts] if isinstance(prompts, str) else prompts
        return self._run([p for p in prompts], params or SamplingParams(), use_tqdm)

    def chat(
        self, conversations: list[dict] | list[list[dict]], params: SamplingParams | None = None, use_tqdm: bool = False
    ) -> list[CompletionOutput]:
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]
        prompts = [self.engine.apply_chat_template(c) for c in conversations]
        return self._run(prompts, params or SamplingParams(), use_tqdm)

    def _run(self, prompts: list, params: SamplingParams | list[SamplingParams], use_tqdm: bool
             ) -> list[CompletionOutput]:
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} SamplingParams for {len(prompts)} prompts")
        by_id: dict[str, CompletionOutput] = {}
        order = []
        for prompt, prompt_params in zip(prompts, params):
            request_id = f"offline-{next(self._ids)}"
            self.engine.add_request(request_id, prompt, prompt_params)
            by_id[request_id] = CompletionOutput(self.engine.scheduler.requests[request_id].prompt_token_ids)
            order.append(request_id)
        with tqdm(total=len(order), disable=not use_tqdm, desc="generate") as bar:
            while self.engine.has_unfinished():
                for out in self.engine.step():
                    done = by_id[out.request_id]
                    done.token_ids.extend(out.new_token_ids)
                    if out.new_token_sources is not None:
                        if done.token_sources is None:
                            done.token_sources = []
                        done.token_sources.extend(t.source for t in out.new_token_sources)
                    done.text += out.new_text
                    done.spec = out.spec
                    if out.finished:
                        done.finish_reason = out.finish_reason
                        bar.update(1)
        return [by_id[i] for i in order]
