"""Runs the target model over a scheduled batch: one packed forward per step."""

from __future__ import annotations

import torch

from eagle_core.batch import ScheduledBatch, SeqResult, SeqWork, StepResult
from eagle_core.worker.inputs import SeqInput, build_inputs
from eagle_core.worker.kv_storage import KVStorage
from eagle_core.worker.loader import LoadedModel
from eagle_core.worker.sampler import Sampler


def kv_shape(config) -> tuple[int, int, int]:
    """(num_layers, num_kv_heads, head_dim) of a transformers decoder config."""
    num_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    return config.num_hidden_layers, getattr(config, "num_key_value_heads", None) or num_heads, head_dim


# MKL's fp32 GEMM takes a slow path for 7-15 rows against a wide weight: SmolLM2's 49,152 x 576
# LM head took 12.7-24.6 ms for 8-15 rows and 9.9 ms for 16 on a 2-core Xeon without bf16
# (1 row: 4.6 ms). Verifying a batch-1 tree of 8 nodes lands right in that range, so on a CPU in
# fp32 such row counts are padded to 16: the same logits up to fp32 rounding, 5 ms less per
# step there (14.2 -> 9.3 ms).
_SLOW_FP32_ROWS_FROM, _PADDED_ROWS = 7, 16


class TargetModel:
    """The target LM split into its decoder stack and LM head, run through paged attention."""

    def __init__(self, loaded: LoadedModel, num_slots: int, block_size: int):
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
        self.num_forwards = 0
        """Target forwards run so far (tests count them)."""
        self._pad_lm_head_rows = self.device.type == "cpu" and self.dtype == torch.float32

    @torch.inference_mode()
    def forward(self, seqs: list[SeqInput], output_hidden_states: bool = False):
        """Returns (hidden [T, hidden] after the final norm, offsets, all layer hidden states or None)."""
        inputs = build_inputs(seqs, self.block_size, self.device)
        out = self.decoder(
            input_ids=inputs.input_ids,
            position_ids=inputs.position_ids,
            use_cache=False,
            output_hidden_states=output_hidden_states,
            eagle_meta=inputs.meta,
            eagle_kv=self.kv,
        )
        self.num_forwards += 1
        return out.last_hidden_state[0], inputs.offsets, out.hidden_states

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[R, hidden] -> [R, vocab] float32."""
        rows = hidden.shape[0]
        if self._pad_lm_head_rows and _SLOW_FP32_ROWS_FROM <= rows < _PADDED_ROWS:
            padded = hidden.new_zeros(_PADDED_ROWS, hidden.shape[1])  # [16, hidden]
            padded[:rows] = hidden
            return self.lm_head(padded)[:rows].float()
        return self.lm_head(hidden).float()


def work_input(work: SeqWork) -> SeqInput:
    return SeqInput(torch.tensor(work.token_ids, dtype=torch.long), work.start_pos, work.block_table)


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
        hidden, offsets, _ = self.target.forward([work_input(w) for w in batch.seqs])
        rows = [i for i, w in enumerate(batch.seqs) if w.sample]
        return StepResult(sample_last_tokens(self.target, self.sampler, hidden, offsets, batch.seqs, rows))


def sample_last_tokens(
    target: TargetModel,
    sampler: Sampler,
    hidden: torch.Tensor,  # [T, hidden] the packed forward's output
    offsets: list[int],
    works: list[SeqWork],
    rows: list[int],
) -> dict[str, SeqResult]:
    """One new token for each work in `rows`, sampled at its last new token."""
    if not rows:
        return {}
    last = torch.tensor([offsets[i] + len(works[i].token_ids) - 1 for i in rows], device=hidden.device)
    chosen = [works[i] for i in rows]
    logits = target.logits(hidden[last])  # [R, vocab]
    token_ids, logprobs = sampler.sample(logits, chosen)
    return {
        w.request_id: SeqResult(w.request_id, [t], logprobs=None if lp is None else [lp])
        for w, t, lp in zip(chosen, token_ids, logprobs)
    }
