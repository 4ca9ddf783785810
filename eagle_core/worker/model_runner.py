"""Runs the target model over a scheduled batch: one packed forward per step."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.utils.output_capturing import maybe_install_capturing_hooks

from eagle_core.batch import ScheduledBatch, SeqResult, SeqWork, StepResult
from eagle_core.worker.attention import make_backend
from eagle_core.worker.attn_paged import padded_size
from eagle_core.worker.compiled import CompiledFunction, CompileSettings, mark_dynamic
from eagle_core.worker.inputs import SeqGroup, causal_group
from eagle_core.worker.kv_storage import KVStorage
from eagle_core.worker.loader import LoadedModel
from eagle_core.worker.sampler import Sampler
from eagle_core.worker.warm_up import dummy_groups


def kv_shape(config) -> tuple[int, int, int]:
    """(num_layers, num_kv_heads, head_dim) of a transformers decoder config."""
    num_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    return config.num_hidden_layers, getattr(config, "num_key_value_heads", None) or num_heads, head_dim


# MKL's fp32 GEMM takes a slow path for 7-15 rows against a wide weight (the LM head): eagerly,
# on a CPU in fp32, such row counts are padded to 16 (docs/benchmarks.md, "LM-head rows").
# Compiled forwards run the LM head on oneDNN-packed weights and need no padding.
_SLOW_FP32_ROWS_FROM, _PADDED_ROWS = 7, 16


@dataclass
class TargetOutput:
    features: torch.Tensor  # [T, feature] what the drafter reads (final-norm output, or EAGLE-3's layers)
    logits: torch.Tensor  # [R, vocab] float32 at the requested rows


class TargetModel:
    """The target LM split into its decoder stack and LM head, run through paged attention.

    `forward` is one function of fixed structure, compiled once (worker/compiled.py) unless
    `compile` is None (eager): the decoder over the packed tokens, then the LM head at the rows
    that need logits."""

    def __init__(
        self,
        loaded: LoadedModel,
        num_slots: int,
        block_size: int,
        attention_backend: str,
        compile: CompileSettings | None,
        feature_layers: tuple[int, ...] | None = None,
    ):
        self.model = loaded.model
        self.config = loaded.model.config
        self.device = loaded.device
        self.dtype = loaded.dtype
        self.block_size = block_size
        self.decoder = loaded.model.get_decoder()
        self.lm_head = loaded.model.get_output_embeddings()
        self.embed_tokens = loaded.model.get_input_embeddings()
        num_layers, num_kv_heads, head_dim = kv_shape(self.config)
        self.kv = KVStorage(num_layers, num_slots, num_kv_heads, head_dim, self.dtype, self.device)
        self.shape_buckets = compile is not None and compile.shape_buckets(self.device)
        self.backend = make_backend(attention_backend, block_size, self.kv, self.shape_buckets)
        self.feature_layers = feature_layers
        """EAGLE-3 reads these layers' inputs (hidden_states[i]); else the final-norm output."""
        if feature_layers is not None:
            # transformers installs its hidden-state capturing hooks lazily, under a lock that
            # torch.compile cannot trace: install them before any compiled call.
            maybe_install_capturing_hooks(self.decoder)
        self.compiled = compile is not None
        self._run = (
            CompiledFunction(self._forward, self.device, compile, static_inputs=(self.kv.kv,))
            if self.compiled
            else self._forward
        )
        self._pad_lm_head_rows = not self.compiled and self.device.type == "cpu" and self.dtype == torch.float32
        self.num_forwards = 0
        """Target forwards run so far (tests count them)."""

    @torch.inference_mode()
    def forward(self, groups: list[SeqGroup], logit_rows: torch.Tensor) -> TargetOutput:
        """One packed forward over `groups`; logits at `logit_rows` ([R] indices into the
        packed row, on the host). Features cover the real tokens only."""
        batch = self.backend.prepare(groups)
        num_rows = logit_rows.shape[0]
        rows = pad_rows(logit_rows, self.compiled, self.shape_buckets).to(self.device)
        if self.compiled and self._run.guarded:  # only a compiling call needs the marks
            mark_dynamic(batch.input_ids, batch.positions, rows, *batch.meta.dynamic_tensors())
        features, logits = self._run(batch.input_ids, batch.positions, batch.meta, self.kv.kv, rows)
        self.num_forwards += 1
        return TargetOutput(features[: batch.num_tokens], logits[:num_rows])

    def warm_up(self) -> None:
        """Build the compiled graph (worker/warm_up.py)."""
        self.forward(dummy_groups(self.block_size, tree=True), torch.tensor([0, 1, 2]))
        self._run.warmed_up()

    def _forward(self, input_ids, positions, meta, kv_tensor, logit_rows):
        """[T] ids and positions, metadata, the KV tensor, [R] rows -> ([T, feature], [R, vocab])."""
        if hasattr(meta, "derive"):
            meta = meta.derive()
        out = self.decoder(
            input_ids=input_ids[None],
            position_ids=positions[None],
            use_cache=False,
            output_hidden_states=self.feature_layers is not None,
            eagle_meta=meta,
            eagle_kv=kv_tensor,
        )
        hidden = out.last_hidden_state[0]  # [T, hidden]
        if self.feature_layers is None:
            features = hidden
        else:
            features = torch.cat([out.hidden_states[i][0] for i in self.feature_layers], dim=-1)  # [T, 3h]
        return features, self.logits(hidden[logit_rows])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[R, hidden] -> [R, vocab] float32."""
        rows = hidden.shape[0]
        if self._pad_lm_head_rows and _SLOW_FP32_ROWS_FROM <= rows < _PADDED_ROWS:
            padded = hidden.new_zeros(_PADDED_ROWS, hidden.shape[1])  # [16, hidden]
            padded[:rows] = hidden
            return self.lm_head(padded)[:rows].float()
        return self.lm_head(hidden).float()


def pad_rows(rows: torch.Tensor, compiled: bool, buckets: bool) -> torch.Tensor:
    """A new tensor of `rows` ([R]), for a compiled forward padded with zeros to
    `attn_paged.padded_size`. Always new, so that every input of a compiled forward is made
    inside inference mode alike (dynamo guards on it)."""
    size = padded_size(rows.shape[0], buckets) if compiled else rows.shape[0]
    return torch.cat([rows, rows.new_zeros(size - rows.shape[0])])


def pack_works(works: list[SeqWork], block_size: int) -> tuple[list[SeqGroup], list[int]]:
    """The groups of a plain forward over `works` and each work's first token's packed index:
    every decode token in one group (first), then each prefill chunk as a group of its own."""
    decode = [i for i, w in enumerate(works) if len(w.token_ids) == 1]
    others = [i for i, w in enumerate(works) if len(w.token_ids) != 1]
    groups: list[SeqGroup] = []
    offsets = [0] * len(works)
    total = 0
    if decode:
        chosen = [works[i] for i in decode]
        groups.append(
            causal_group([w.token_ids for w in chosen], [w.start_pos for w in chosen],
                         [w.block_table for w in chosen], block_size)
        )
        for k, i in enumerate(decode):
            offsets[i] = k
        total = len(decode)
    for i in others:
        work = works[i]
        groups.append(causal_group([work.token_ids], [work.start_pos], [work.block_table], block_size))
        offsets[i] = total
        total += len(work.token_ids)
    return groups, offsets


def last_token_rows(works: list[SeqWork], offsets: list[int], chosen: list[int]) -> torch.Tensor:
    """[len(chosen)] packed index of each chosen work's last new token."""
    return torch.tensor([offsets[i] + len(works[i].token_ids) - 1 for i in chosen], dtype=torch.long)


class PlainRunner:
    """Plain decoding: one forward computes every sequence's new tokens; sampling rows are each
    sequence's last new token."""

    def __init__(self, target: TargetModel, sampler: Sampler):
        self.target = target
        self.sampler = sampler

    def execute(self, batch: ScheduledBatch) -> StepResult:
        self.sampler.drop(batch.finished_request_ids)
        if batch.is_empty:
            return StepResult()
        works = batch.seqs
        groups, offsets = pack_works(works, self.target.block_size)
        rows = [i for i, w in enumerate(works) if w.sample]
        out = self.target.forward(groups, last_token_rows(works, offsets, rows))
        return StepResult(sample_rows(self.sampler, out.logits, [works[i] for i in rows]))


def sample_rows(sampler: Sampler, logits: torch.Tensor, works: list[SeqWork]) -> dict[str, SeqResult]:
    """One new token per work, from its row of `logits` ([len(works), vocab])."""
    if not works:
        return {}
    token_ids = sampler.draw(logits, works).tolist()  # the step's one device-to-host transfer
    logprobs = sampler.logprobs(logits, token_ids, works)
    return {
        w.request_id: SeqResult(w.request_id, [t], logprobs=None if lp is None else [lp])
        for w, t, lp in zip(works, token_ids, logprobs)
    }
