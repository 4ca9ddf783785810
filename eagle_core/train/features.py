"""Stage d: the target's features, read teacher-forced, into safetensors shards.

A training sequence is a chat (prompt + assistant text) tokenized exactly as the engine does
(`apply_chat_template(..., add_generation_prompt=True)` for the prompt, then the response ids and
the end-of-turn token). Each shard holds, for all positions t of its sequences (packed, with
`cu_seqlens`):

  input_ids   [N]          int32  token x_t
  weights     [N]          fp16   loss weight of predicting x_{t+1} (prompt positions lower)
  features    [N, 3h]      bf16   EAGLE-3: concat(hidden_states[i] for i in layer_ids)
  last_hidden [N, h]       bf16   EAGLE-1: the final norm's output (the LM head's input)
  topk_ids    [N, k]       int32  the target's top-k next-token ids at t
  topk_probs  [N, k]       fp16   and their probabilities (T=1)

Features come from the target in the serving dtype (cfg.dtype). Shards are written atomically;
each lists the keys of its sequences in its metadata, and a rerun captures only sequences not
yet in any shard (so data accumulates as more responses are generated).
"""

from __future__ import annotations

import glob
import json
import logging
import os
import time

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from eagle_core.spec.draft_head import eagle3_layer_ids
from eagle_core.train.common import read_jsonl, tmp_path_for
from eagle_core.train.config import TrainConfig
from eagle_core.train.corpus import corpus_path
from eagle_core.train.generate import conversation, load_responses

logger = logging.getLogger(__name__)


def shards_dir(cfg: TrainConfig) -> str:
    return os.path.join(cfg.work_dir, "features")


def load_target(cfg: TrainConfig):
    from eagle_core.config import ModelConfig
    from eagle_core.worker.loader import load_model

    return load_model(ModelConfig(model=cfg.model, dtype=cfg.dtype), attn_implementation="sdpa")


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Prompt ids exactly as the engine builds them (generation prompt included)."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def build_sequences(cfg: TrainConfig, tokenizer) -> list[dict]:
    """Every training sequence: {"key", "ids", "num_prompt"} (self-distilled, then fixed text)."""
    end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if end_id is None or end_id == tokenizer.unk_token_id:
        end_id = tokenizer.eos_token_id
    seqs = []
    sources = [("resp", load_responses(cfg))]
    if cfg.corpus.enabled and os.path.exists(corpus_path(cfg)):
        sources.append(("corpus", read_jsonl(corpus_path(cfg))))
    for kind, rows in sources:
        for i, row in enumerate(rows):
            prompt_ids = chat_ids(tokenizer, conversation(cfg, row["prompt"]))
            response = row.get("token_ids")
            if response is None:
                response = tokenizer(row["response"], add_special_tokens=False)["input_ids"]
            if row.get("finish_reason", "stop") == "stop" or kind == "corpus":
                response = list(response) + [end_id]
            ids = (prompt_ids + list(response))[: cfg.features.max_seq_len]
            key = f"{kind}:{row['id'] if kind == 'resp' else i}"
            seqs.append({"key": key, "ids": ids, "num_prompt": len(prompt_ids),
                         "drafted": row.get("drafted")})
    return seqs


def captured_keys(cfg: TrainConfig) -> set[str]:
    keys: set[str] = set()
    for path in shard_paths(cfg):
        with safe_open(path, "pt") as f:
            keys.update(json.loads(f.metadata()["keys"]))
    return keys


def shard_paths(cfg: TrainConfig) -> list[str]:
    return sorted(glob.glob(os.path.join(shards_dir(cfg), "shard-*.safetensors")))


def run_features(cfg: TrainConfig) -> None:
    fc = cfg.features
    loaded = load_target(cfg)
    model, tokenizer = loaded.model, loaded.tokenizer
    seqs = build_sequences(cfg, tokenizer)
    done = captured_keys(cfg)
    todo = [s for s in seqs if s["key"] not in done]
    total = sum(len(s["ids"]) for s in todo)
    logger.info("features: %d sequences, %d to capture (%d tokens)", len(seqs), len(todo), total)
    if not todo:
        return
    os.makedirs(shards_dir(cfg), exist_ok=True)
    layer_ids = eagle3_layer_ids(model.config.num_hidden_layers)
    next_index = len(shard_paths(cfg))
    pending: list[dict[str, torch.Tensor]] = []
    pending_keys: list[str] = []
    pending_tokens = 0
    bar = tqdm(total=total, desc="features", unit="tok", smoothing=0.1)
    start = time.time()
    for batch in _batches(todo, fc.batch_tokens):
        for seq, out in zip(batch, _capture(model, batch, layer_ids, fc.top_k)):
            pending.append(out | {"weights": _weights(seq, fc.prompt_loss_weight, fc.missed_weight)})
            pending_keys.append(seq["key"])
            pending_tokens += len(seq["ids"])
        bar.update(sum(len(s["ids"]) for s in batch))
        if pending_tokens >= fc.shard_tokens:
            _write_shard(cfg, next_index, pending, pending_keys, layer_ids)
            next_index += 1
            pending, pending_keys, pending_tokens = [], [], 0
    if pending:
        _write_shard(cfg, next_index, pending, pending_keys, layer_ids)
    bar.close()
    logger.info("features: %d tokens in %.0f s", total, time.time() - start)


def _weights(seq: dict, prompt_weight: float, missed_weight: float = 1.0) -> torch.Tensor:
    """Weight of predicting token t+1 at position t: prompt-internal predictions weigh less; in
    an on-policy answer (seq["drafted"]: 1 per answer token the head supplied), a token the head
    did not supply weighs missed_weight."""
    n = len(seq["ids"])
    w = torch.ones(n, dtype=torch.float16)
    w[: max(0, seq["num_prompt"] - 1)] = prompt_weight
    if seq.get("drafted") is not None and missed_weight != 1.0:
        start = seq["num_prompt"] - 1  # position predicting the answer's first token
        drafted = torch.tensor(seq["drafted"][: max(0, n - 1 - start)], dtype=torch.bool)
        w[start : start + len(drafted)][~drafted] = missed_weight
    w[-1] = 0  # nothing follows the last token
    return w


def _batches(seqs: list[dict], batch_tokens: int):
    """Length-sorted batches of at most batch_tokens padded tokens."""
    order = sorted(seqs, key=lambda s: len(s["ids"]))
    batch: list[dict] = []
    for seq in order:
        longest = max([len(s["ids"]) for s in batch] + [len(seq["ids"])])
        if batch and longest * (len(batch) + 1) > batch_tokens:
            yield batch
            batch = []
        batch.append(seq)
    if batch:
        yield batch


@torch.inference_mode()
def _capture(model, batch: list[dict], layer_ids, top_k: int) -> list[dict[str, torch.Tensor]]:
    lengths = [len(s["ids"]) for s in batch]
    longest = max(lengths)
    ids = torch.zeros(len(batch), longest, dtype=torch.long)
    mask = torch.zeros(len(batch), longest, dtype=torch.long)
    for b, s in enumerate(batch):
        ids[b, : lengths[b]] = torch.tensor(s["ids"])
        mask[b, : lengths[b]] = 1
    out = model.model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    hidden_states = out.hidden_states
    last = out.last_hidden_state  # [B, T, h] after the final norm
    features = torch.cat([hidden_states[i] for i in layer_ids], dim=-1)  # [B, T, 3h]
    results = []
    for b, n in enumerate(lengths):
        logits = model.lm_head(last[b, :n]).float()  # [n, V]
        probs, top_ids = torch.softmax(logits, dim=-1).topk(top_k, dim=-1)
        results.append({
            "input_ids": ids[b, :n].to(torch.int32),
            "features": features[b, :n].to(torch.bfloat16).contiguous(),
            "last_hidden": last[b, :n].to(torch.bfloat16).contiguous(),
            "topk_ids": top_ids.to(torch.int32),
            "topk_probs": probs.to(torch.float16),
        })
    return results


def _write_shard(cfg, index: int, rows: list[dict], keys: list[str], layer_ids) -> None:
    path = os.path.join(shards_dir(cfg), f"shard-{index:05d}.safetensors")
    tensors = {name: torch.cat([r[name] for r in rows]) for name in rows[0]}
    lengths = torch.tensor([0] + [len(r["input_ids"]) for r in rows])
    tensors["cu_seqlens"] = torch.cumsum(lengths, 0).to(torch.int64)
    meta = {"keys": json.dumps(keys), "layer_ids": json.dumps(list(layer_ids)),
            "dtype": cfg.dtype, "model": cfg.model}
    tmp = tmp_path_for(path)
    save_file(tensors, tmp, metadata=meta)
    os.replace(tmp, path)
    logger.info("wrote %s (%d sequences, %d tokens)", path, len(keys), int(lengths.sum()))
