"""Stage e: train an EAGLE-3 draft head on captured features (training-time test).

Alignment (the engine's, see eagle_core/spec/drafter.py): the draft entry at position q reads
(token x_{q+1}, feature) and predicts x_{q+2}, whose target distribution is P_{q+1}.

  step 0:  feature = fc(target features f_q); attends step-0 entries at positions <= q.
  step k:  feature = the head's own step-(k-1) output at q-1 (what tree level k feeds back);
           attends step-0 entries at positions <= q-k (the committed context) and the step-i
           entries at q-k+i for i = 1..k (its own ancestors in the tree), as in EAGLE-3.

The loss of step k is weighted step_decay**k and weighted per position (prompt positions less).
It is chosen by `trainer.objective`:
  soft_ce  cross-entropy against the target's top-k next-token probabilities restricted to the
           draft vocabulary (renormalised);
  lk       -log(sum_x min(p(x), q(x))): the negative log of the rate at which a token drawn from
           the head's q is accepted under the target's p (p: the captured top-k T=1
           probabilities in the draft vocabulary, not renormalised, so the mass the head cannot
           reach stays out of reach), plus `lk_ce_weight` x soft_ce, which keeps a gradient on
           positions where the head's q and p do not overlap yet.
Validation measures both on the same terms: the target's mass on the head's top-1 and top-3
tokens, the probability that a tree's first level is accepted when its children are the head's
top-k (verification accepts a drafted child with its target probability).

The draft vocabulary is the `draft_vocab_size` most frequent target top-1 tokens of the training
data. Training resumes from `<work_dir>/train/ckpt.pt`.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import random
import shutil
import time
import zlib
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from safetensors import safe_open
from tqdm.auto import tqdm
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from eagle_core.spec.draft_head import (
    Eagle3Head,
    draft_config_from_target,
    load_draft_head,
    save_draft_head,
)
from eagle_core.train.config import TrainConfig, TrainerConfig
from eagle_core.train.features import load_target, shard_paths
from eagle_core.train.prompts import prompt_style

logger = logging.getLogger(__name__)

_FIELDS = ("input_ids", "weights", "features", "topk_ids", "topk_probs")


@dataclass
class Sequence:
    key: str
    tensors: dict[str, torch.Tensor]  # per-position arrays of one sequence

    def __len__(self) -> int:
        return len(self.tensors["input_ids"])


def load_sequences(paths: list[str], max_tokens: int | None = None, seed: int = 0) -> list[Sequence]:
    """All captured sequences (or a seeded random subset of about max_tokens tokens)."""
    seqs: list[Sequence] = []
    for path in paths:
        with safe_open(path, "pt") as f:
            keys = json.loads(f.metadata()["keys"])
            cu = f.get_tensor("cu_seqlens").tolist()
            data = {name: f.get_tensor(name) for name in _FIELDS}
        for i, key in enumerate(keys):
            seqs.append(Sequence(key, {n: t[cu[i] : cu[i + 1]] for n, t in data.items()}))
    seqs.sort(key=lambda s: s.key)
    random.Random(seed).shuffle(seqs)
    if max_tokens is not None:
        out, total = [], 0
        for s in seqs:
            if total >= max_tokens:
                break
            out.append(s)
            total += len(s)
        seqs = out
    return seqs


def _style_of(key: str) -> str | None:
    """Prompt style of a self-distilled sequence ("resp:<prompt id>"); None for fixed text."""
    kind, _, ident = key.partition(":")
    return prompt_style(int(ident)) if kind == "resp" else None


def split_validation(seqs: list[Sequence], every: int = 20) -> tuple[list[Sequence], list[Sequence]]:
    """About 1/every of the sequences (by a hash of their key) are held out for validation."""
    val = [s for s in seqs if zlib.crc32(s.key.encode()) % every == 0]
    train = [s for s in seqs if zlib.crc32(s.key.encode()) % every != 0]
    return train, val


def _top1_counts(seqs: list[Sequence], vocab_size: int) -> torch.Tensor:
    """[vocab] weighted count of each token as the target's top-1 prediction."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for s in seqs:
        counts.index_add_(0, s.tensors["topk_ids"][:, 0].long(), s.tensors["weights"].double())
    return counts


def choose_draft_vocab(seqs: list[Sequence], vocab_size: int, draft_vocab: int) -> tuple[torch.Tensor, float]:
    """The draft_vocab most frequent target top-1 tokens (sorted ids) and their coverage."""
    counts = _top1_counts(seqs, vocab_size)
    top = counts.topk(min(draft_vocab, vocab_size)).indices.sort().values
    return top, float(counts[top].sum() / counts.sum().clamp_min(1e-9))


def vocab_coverage(seqs: list[Sequence], vocab_size: int, draft_ids: torch.Tensor) -> float:
    """Fraction of the target's (weighted) top-1 predictions that fall in draft_ids."""
    counts = _top1_counts(seqs, vocab_size)
    return float(counts[draft_ids].sum() / counts.sum().clamp_min(1e-9))


def make_batches(seqs: list[Sequence], batch_tokens: int, max_len: int, rng: random.Random):
    """Shuffled batches of similar-length sequences, at most batch_tokens padded tokens each."""
    order = seqs[:]
    rng.shuffle(order)
    batches = []
    for i in range(0, len(order), 64):
        chunk = sorted(order[i : i + 64], key=len)
        batch: list[Sequence] = []
        for s in chunk:
            longest = min(max_len, max([len(x) for x in batch] + [len(s)]))
            if batch and longest * (len(batch) + 1) > batch_tokens:
                batches.append(batch)
                batch = []
            batch.append(s)
        if batch:
            batches.append(batch)
    rng.shuffle(batches)
    return batches


def collate(batch: list[Sequence], max_len: int, t2d: torch.Tensor) -> dict[str, torch.Tensor]:
    """Shifted, right-padded tensors: position q holds x_{q+1}, f_q and target P_{q+1}."""
    n = min(max_len, max(len(s) for s in batch)) - 1
    b = len(batch)
    first = batch[0].tensors
    out = {
        "input_ids": torch.zeros(b, n, dtype=torch.long),
        "features": torch.zeros(b, n, first["features"].shape[-1], dtype=first["features"].dtype),
        "label_ids": torch.full((b, n, first["topk_ids"].shape[-1]), -1, dtype=torch.long),
        "label_probs": torch.zeros(b, n, first["topk_ids"].shape[-1]),
        "weights": torch.zeros(b, n),
    }
    for i, s in enumerate(batch):
        t = s.tensors
        m = min(len(s), max_len) - 1
        out["input_ids"][i, :m] = t["input_ids"][1 : m + 1].long()
        out["features"][i, :m] = t["features"][:m]
        out["label_ids"][i, :m] = t2d[t["topk_ids"][1 : m + 1].long()]
        out["label_probs"][i, :m] = t["topk_probs"][1 : m + 1].float()
        out["weights"][i, :m] = t["weights"][1 : m + 1].float()
    return out


def ttt_mask(num_tokens: int, step: int) -> torch.Tensor:
    """[T, (step + 1) * T] bool: what the step-`step` entry at q attends (see module docstring)."""
    q = torch.arange(num_tokens)[:, None]
    j = torch.arange(num_tokens)[None, :]
    blocks = [j <= q - step]
    blocks += [j == q - step + i for i in range(1, step + 1)]
    return torch.cat(blocks, dim=1)


def _attend(attn, x, cos, sin, past, mask):
    """A Llama attention over x's own keys/values plus earlier blocks `past` (list of (k, v));
    returns (output, this block's (k, v)). Written out because the unrolled steps attend keys
    of earlier steps, which transformers' attention modules cannot be handed."""
    shape = (*x.shape[:-1], -1, attn.head_dim)
    q = attn.q_proj(x).view(shape).transpose(1, 2)
    k = attn.k_proj(x).view(shape).transpose(1, 2)
    v = attn.v_proj(x).view(shape).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    keys = torch.cat([pk for pk, _ in past] + [k], dim=2)
    values = torch.cat([pv for _, pv in past] + [v], dim=2)
    groups = q.shape[1] // k.shape[1]
    keys = keys.repeat_interleave(groups, dim=1)
    values = values.repeat_interleave(groups, dim=1)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attn.scaling)
    return attn.o_proj(out.transpose(1, 2).reshape(*x.shape[:-1], -1)), (k, v)


def _layer_forward(layer, embeds, hidden, cos, sin, past, mask):
    """Eagle3DecoderLayer.forward with extra key/value blocks `past` (list of (k, v))."""
    x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden)], dim=-1)
    out, kv = _attend(layer.self_attn, x, cos, sin, past, mask)
    x = hidden + out
    return x + layer.mlp(layer.post_attention_layernorm(x)), kv


def _extra_layer_forward(layer, hidden, cos, sin, past, mask):
    """LlamaDecoderLayer.forward (a head's `extra_layers`) with extra key/value blocks `past`."""
    out, kv = _attend(layer.self_attn, layer.input_layernorm(hidden), cos, sin, past, mask)
    x = hidden + out
    return x + layer.mlp(layer.post_attention_layernorm(x)), kv


def ttt_forward(head: Eagle3Head, batch: dict[str, torch.Tensor], steps: int):
    """Unroll the head `steps` times; returns per-step logits [B, T, draft_vocab]."""
    ids = batch["input_ids"]
    num_tokens = ids.shape[1]
    positions = torch.arange(num_tokens)[None].expand(ids.shape[0], -1)
    embeds = head.embed(ids).detach()
    hidden = head.fuse(batch["features"])
    cos, sin = head.rotary_emb(hidden, positions)
    cos, sin = cos.to(hidden.dtype), sin.to(hidden.dtype)
    past: list[list] = [[] for _ in range(head.num_layers)]  # per layer, one (k, v) per step
    logits = []
    for step in range(steps):
        mask = ttt_mask(num_tokens, step)
        out, kv = _layer_forward(
            head.midlayer, embeds.to(hidden.dtype), hidden, cos, sin, past[0], mask
        )
        past[0].append(kv)
        for i, layer in enumerate(head.extra_layers, start=1):
            out, kv = _extra_layer_forward(layer, out, cos, sin, past[i], mask)
            past[i].append(kv)
        logits.append(head.logits(out))
        hidden = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)
    return logits


class StepStats(NamedTuple):
    """Sums over one unrolled step's positions of weight > 0.5 (prompt positions excluded). The
    target's probabilities are the captured top-k: a token outside them counts 0, so the masses
    are lower bounds (by the target's probability beyond its top-k, small at k = 8)."""

    loss: float  # the step's weighted mean loss (not a sum)
    hits: float  # head's top-1 == target's top-1
    count: float
    mass1: float  # target probability of the head's top-1 token
    mass3: float  # target probability mass of the head's top-3 tokens
    ceiling1: float  # the same for a perfect head (the target's own top-1 / top-3 in the draft vocabulary)
    ceiling3: float


def _objective(step_logits: torch.Tensor, label_ids: torch.Tensor, probs: torch.Tensor,
               renormalised: torch.Tensor, objective: str, lk_ce_weight: float) -> torch.Tensor:
    """[B, T] per-position loss. step_logits [B, T, Vd]; label_ids [B, T, k] draft ids (-1: out of
    the draft vocabulary); probs [B, T, k] the target's probabilities (0 out of the vocabulary);
    renormalised: probs / their sum."""
    logp = torch.log_softmax(step_logits.float(), dim=-1)
    picked = logp.gather(-1, label_ids.clamp_min(0))  # [B, T, k]
    soft_ce = -(renormalised * picked).sum(-1)
    if objective == "soft_ce":
        return soft_ce
    accepted = torch.minimum(probs, picked.exp()).sum(-1)  # [B, T] sum_x min(p, q)
    return -torch.log(accepted.clamp_min(1e-6)) + lk_ce_weight * soft_ce


def ttt_loss(logits: list[torch.Tensor], batch: dict[str, torch.Tensor], decay: float,
             objective: str = "soft_ce", lk_ce_weight: float = 0.0):
    """(total loss, one StepStats per unrolled step)."""
    label_ids, label_probs, weights = batch["label_ids"], batch["label_probs"], batch["weights"]
    in_vocab = label_ids >= 0
    probs = label_probs * in_vocab  # [B, T, k]
    renormalised = probs / probs.sum(-1, keepdim=True).clamp_min(1e-6)
    top1 = torch.where(in_vocab[..., 0], label_ids[..., 0], -2)
    best = probs.sort(dim=-1, descending=True).values
    total, stats = 0.0, []
    for step, step_logits in enumerate(logits):
        per_pos = _objective(step_logits, label_ids, probs, renormalised, objective, lk_ce_weight)
        w = weights.clone()
        w[:, :step] = 0  # entries without a full chain behind them
        denom = w.sum().clamp_min(1e-6)
        loss = (per_pos * w).sum() / denom
        total = total + (decay**step) * loss
        with torch.no_grad():
            counted = (w > 0.5).float()
            head_top = step_logits.topk(min(3, step_logits.shape[-1]), dim=-1).indices  # [B, T, 3]
            mass = ((head_top[..., :, None] == label_ids[..., None, :]) * probs[..., None, :]).sum(-1)
            correct = (head_top[..., 0] == top1).float()
            stats.append(StepStats(
                loss.item(), (correct * counted).sum().item(), counted.sum().item(),
                (mass[..., 0] * counted).sum().item(), (mass.sum(-1) * counted).sum().item(),
                (best[..., 0] * counted).sum().item(), (best[..., :3].sum(-1) * counted).sum().item(),
            ))
    return total, stats


def build_head(target_model, tc: TrainerConfig, draft_ids: torch.Tensor) -> Eagle3Head:
    from eagle_core.spec.draft_head import eagle3_layer_ids

    config = draft_config_from_target(target_model.config, num_layers=tc.num_layers)
    config._attn_implementation = "sdpa"
    torch.manual_seed(tc.seed)
    head = Eagle3Head(
        config,
        target_model.get_input_embeddings(),
        eagle3_layer_ids(target_model.config.num_hidden_layers),
        draft_vocab_size=len(draft_ids),
    )
    head.set_draft_vocab(draft_ids)
    # warm start: the draft LM head from the target's output rows (its norm stays at ones: the
    # target's final-norm scale on a random initial direction gives huge, confident logits)
    with torch.no_grad():
        head.lm_head.weight.copy_(target_model.get_output_embeddings().weight[draft_ids].float())
    return head.float()


def load_head_for_training(target_model, path: str, num_layers: int = 1, seed: int = 0) -> Eagle3Head:
    """Warm start (`trainer.init_from`): an earlier head, validated against the target, in float32,
    grown to `num_layers` decoder layers if it has fewer (see `grow_head`)."""
    head = load_draft_head(path, target_model.config, target_model.get_input_embeddings(),
                           target_model.get_output_embeddings(), torch.float32, "cpu")
    if not isinstance(head, Eagle3Head):
        raise ValueError(f"trainer.init_from {path}: an EAGLE-3 head is needed, found {head.kind}")
    if head.num_layers > num_layers:
        raise ValueError(f"trainer.init_from {path} has {head.num_layers} decoder layers, more "
                         f"than trainer.num_layers {num_layers}")
    if head.num_layers < num_layers:
        head = grow_head(head, target_model.get_input_embeddings(), num_layers, seed)
    return head.train()


def grow_head(head: Eagle3Head, embedding, num_layers: int, seed: int = 0) -> Eagle3Head:
    """A copy of `head` with `num_layers` decoder layers that computes exactly what `head` does.

    The new layers start with zero output projections (o_proj, down_proj), so each is the
    identity on its residual stream until training moves them; the old layers keep their
    weights. Growing a trained head this way continues from its acceptance rather than from
    scratch."""
    config = copy.deepcopy(head.config)
    config.num_hidden_layers = num_layers
    torch.manual_seed(seed)
    grown = _eagle3_like(head, config, embedding, head.vocab_size)
    missing, unexpected = grown.load_state_dict(head.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("extra_layers.") for k in missing), (missing, unexpected)
    with torch.no_grad():
        for layer in grown.extra_layers[head.num_layers - 1:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return grown


def _eagle3_like(head: Eagle3Head, config, embedding, draft_vocab_size: int) -> Eagle3Head:
    """An untrained head shaped like `head` (biases, fused layers, own or shared embedding, dtype)."""
    own_embedding = "embed_tokens" in head._modules
    return Eagle3Head(config, None if own_embedding else embedding, head.layer_ids,
                      head.target_hidden_size, draft_vocab_size, fc_bias=head.fc.bias is not None,
                      qkv_bias=head.midlayer.self_attn.q_proj.bias is not None).to(head.fc.weight.dtype)


def grow_draft_vocab(head: Eagle3Head, target_model, counts: torch.Tensor, size: int) -> Eagle3Head:
    """A copy of `head` whose draft vocabulary keeps its tokens (and their trained LM-head rows)
    and adds the most frequent target top-1 tokens (`counts`, [vocab]) it lacked, up to `size`.

    Why: a warm start keeps its vocabulary, and a token outside it can never be drafted (on
    MT-bench answers 8% of the target's greedy tokens fell outside the shipped head's 8,192; see
    bench/draft_accuracy.py). New rows start from the target's output embedding, as a fresh
    head's do."""
    old_ids = head.draft_to_target(torch.arange(head.vocab_size))
    counts = counts.clone()
    counts[old_ids] = -1
    new_ids = counts.topk(size - head.vocab_size).indices
    grown = _eagle3_like(head, head.config, target_model.get_input_embeddings(), size)
    state = {k: v for k, v in head.state_dict().items() if k not in ("lm_head.weight", "d2t", "t2d")}
    missing, unexpected = grown.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) == {"lm_head.weight", "d2t", "t2d"}, (missing, unexpected)
    grown.set_draft_vocab(torch.cat([old_ids, new_ids]))
    with torch.no_grad():
        grown.lm_head.weight[: head.vocab_size].copy_(head.lm_head.weight)
        grown.lm_head.weight[head.vocab_size :].copy_(
            target_model.get_output_embeddings().weight[new_ids].to(grown.lm_head.weight.dtype))
    return grown


_SUMMED = StepStats._fields[1:]  # every field but the mean loss
_METRICS = {"val_top1_accuracy_by_step": "hits", "val_mass_top1_by_step": "mass1",
            "val_mass_top3_by_step": "mass3", "val_ceiling_top1_by_step": "ceiling1",
            "val_ceiling_top3_by_step": "ceiling3"}


def _sums(head, seqs, tc: TrainerConfig, t2d) -> list[dict[str, float]]:
    """Per unrolled step, StepStats' sums (`_SUMMED`) over the sequences."""
    sums = [dict.fromkeys(_SUMMED, 0.0) for _ in range(tc.ttt_steps)]
    head.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=tc.bf16_autocast):
        for batch in make_batches(seqs, tc.batch_tokens, tc.max_seq_len, random.Random(0)):
            tensors = collate(batch, tc.max_seq_len, t2d)
            _, stats = ttt_loss(ttt_forward(head, tensors, tc.ttt_steps), tensors, tc.step_decay,
                                tc.objective, tc.lk_ce_weight)
            for k, st in enumerate(stats):
                for name in _SUMMED:
                    sums[k][name] += getattr(st, name)
    head.train()
    return sums


def _metrics(sums: list[dict[str, float]]) -> dict[str, list[float]]:
    """Validation metrics per unrolled step: top-1 accuracy (the head's top-1 is the target's),
    the target's mass on the head's top-1 / top-3 (the first tree level's acceptance when it
    drafts that many children) and a perfect head's mass on the same terms."""
    return {metric: [s[name] / max(s["count"], 1) for s in sums] for metric, name in _METRICS.items()}


def evaluate(head, seqs, tc: TrainerConfig, t2d,
             groups: dict[str, str] | None = None) -> dict:
    """`_metrics` over the sequences, plus "val_by_group" (with `groups`, key -> group name): the
    same per group, e.g. answers by sampling temperature, each sequence scored once (the overall
    figures are the groups' sums plus the ungrouped sequences')."""
    members: dict[str | None, list[Sequence]] = {}
    for seq in seqs:
        members.setdefault((groups or {}).get(seq.key), []).append(seq)
    by_group = {name: _sums(head, group, tc, t2d) for name, group in members.items()}
    total = [{name: sum(g[k][name] for g in by_group.values()) for name in _SUMMED}
             for k in range(tc.ttt_steps)]
    out: dict = _metrics(total)
    if groups:
        out["val_by_group"] = {name: _metrics(by_group[name]) | {"sequences": len(members[name])}
                               for name in sorted(n for n in by_group if n is not None)}
    return out


def _describe(metrics: dict) -> str:
    return "; ".join(f"{name.removeprefix('val_').removesuffix('_by_step')} "
                     + " ".join(f"{v:.3f}" for v in values)
                     for name, values in metrics.items() if name in _METRICS)


def target_to_draft(vocab_size: int, draft_ids: torch.Tensor) -> torch.Tensor:
    """[vocab_size] draft id of each target id (-1: outside the draft vocabulary)."""
    t2d = torch.full((vocab_size,), -1, dtype=torch.long)
    t2d[draft_ids] = torch.arange(len(draft_ids))
    return t2d


def _training_sequences(shard_files: list[str], tc: TrainerConfig, exclude: set[str], log) -> list[Sequence]:
    seqs = load_sequences(shard_files, tc.max_train_tokens, tc.seed)
    if exclude:
        log(f"excluding {sum(s.key in exclude for s in seqs)} sequences (trainer.exclude_sources)")
        seqs = [s for s in seqs if s.key not in exclude]
    if tc.prompt_styles is not None:
        kept = [s for s in seqs if _style_of(s.key) in (None, *tc.prompt_styles)]
        log(f"prompt styles {list(tc.prompt_styles)}: {len(kept)} of {len(seqs)} sequences")
        seqs = kept
    return seqs


def validate_head(target_model, shard_files: list[str], tc: TrainerConfig, head_dir: str,
                  groups: dict[str, str], log=logger.info, exclude: set[str] = frozenset()) -> dict:
    """A trained head's validation metrics on the split `train_head` holds out, overall and by
    group (the same sequences a training run on these shards validates on)."""
    torch.set_num_threads(max(1, tc.num_threads))
    _, val = split_validation(_training_sequences(shard_files, tc, exclude, log))
    head = load_draft_head(head_dir, target_model.config, target_model.get_input_embeddings(),
                           target_model.get_output_embeddings(), torch.float32, "cpu")
    t2d = target_to_draft(target_model.config.vocab_size, head.draft_to_target(torch.arange(head.vocab_size)))
    metrics = evaluate(head, val, tc, t2d, groups)
    log(f"{head_dir}: validation by step: {_describe(metrics)}")
    for name, m in metrics.get("val_by_group", {}).items():
        log(f"  {name} ({m['sequences']} sequences): {_describe(m)}")
    return {"head": head_dir, "val_sequences": len(val), **metrics}


def train_head(target_model, shard_files: list[str], tc: TrainerConfig, out_dir: str,
               state_dir: str, log=logger.info, exclude: set[str] = frozenset(),
               groups: dict[str, str] | None = None) -> dict:
    """Train (resuming from state_dir/ckpt.pt) and save the head to out_dir; returns a summary.
    `groups` (sequence key -> group name) adds validation metrics per group to the summary."""
    if tc.kind != "eagle3":
        raise ValueError(f"trainer kind {tc.kind!r} is not implemented (use eagle3)")
    torch.set_num_threads(max(1, tc.num_threads))
    seqs = _training_sequences(shard_files, tc, exclude, log)
    train, val = split_validation(seqs)
    unique_tokens = sum(len(s) for s in train)
    if tc.response_repeat > 1:
        train = train + [s for s in train if s.key.startswith("resp:")] * (tc.response_repeat - 1)
    vocab_size = target_model.config.vocab_size
    if tc.init_from:
        # the warm-started head keeps its draft vocabulary: its LM head rows are tied to it
        head = load_head_for_training(target_model, tc.init_from, tc.num_layers, tc.seed)
        if tc.draft_vocab_size > head.vocab_size:
            head = grow_draft_vocab(head, target_model, _top1_counts(train, vocab_size), tc.draft_vocab_size)
            log(f"draft vocabulary grown to {head.vocab_size} tokens")
        draft_ids = head.draft_to_target(torch.arange(head.vocab_size))
        coverage = vocab_coverage(train, vocab_size, draft_ids)
        log(f"warm start from {tc.init_from}")
    else:
        draft_ids, coverage = choose_draft_vocab(train, vocab_size, tc.draft_vocab_size)
        head = build_head(target_model, tc, draft_ids)
    num_train_tokens = sum(len(s) for s in train)
    log(f"train: {len(train)} sequences / {num_train_tokens} tokens, val {len(val)}; "
        f"draft vocab {len(draft_ids)} covers {coverage:.1%} of target top-1")
    t2d = target_to_draft(vocab_size, draft_ids)
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=tc.lr, betas=(0.9, 0.95), weight_decay=tc.weight_decay)
    steps_per_epoch = len(make_batches(train, tc.batch_tokens, tc.max_seq_len, random.Random(0)))
    total_steps = max(1, int(steps_per_epoch * tc.epochs))
    sched = torch.optim.lr_scheduler.LambdaLR(optimizer, _cosine(tc.warmup_steps, total_steps))

    os.makedirs(state_dir, exist_ok=True)
    ckpt_path = os.path.join(state_dir, "ckpt.pt")
    step, elapsed_before = 0, 0.0
    if os.path.exists(ckpt_path):
        ckpt = torch.load(ckpt_path, weights_only=False)
        same_head = ckpt["head"].keys() == head.state_dict().keys()  # e.g. trainer.num_layers
        if same_head and ckpt.get("num_train_tokens") == num_train_tokens and ckpt["total_steps"] == total_steps:
            head.load_state_dict(ckpt["head"])
            optimizer.load_state_dict(ckpt["optimizer"])
            sched.load_state_dict(ckpt["sched"])
            step, elapsed_before = ckpt["step"], ckpt.get("elapsed", 0.0)
            log(f"resumed at step {step}/{total_steps}")
        else:
            log("checkpoint is for different data, schedule or head shape: starting over")
    head.train()
    start = time.time()
    bar = tqdm(total=total_steps, initial=step, desc="train", unit="step")
    running: list[list[float]] = []
    epoch_batches: list = []
    while step < total_steps:
        epoch, offset = divmod(step, steps_per_epoch)
        if offset == 0 or not epoch_batches:
            epoch_batches = make_batches(train, tc.batch_tokens, tc.max_seq_len,
                                         random.Random(tc.seed * 1000 + epoch))
        tensors = collate(epoch_batches[offset % len(epoch_batches)], tc.max_seq_len, t2d)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=tc.bf16_autocast):
            logits = ttt_forward(head, tensors, tc.ttt_steps)
        loss, stats = ttt_loss(logits, tensors, tc.step_decay, tc.objective, tc.lk_ce_weight)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, tc.grad_clip)
        optimizer.step()
        sched.step()
        step += 1
        running.append([s.hits / max(s.count, 1) for s in stats])
        running = running[-20:]
        accs = [sum(r[k] for r in running) / len(running) for k in range(tc.ttt_steps)]
        bar.set_postfix(loss=f"{loss.item():.3f}", acc="/".join(f"{a:.2f}" for a in accs))
        bar.update(1)
        for fraction in tc.snapshot_fractions:
            if step == max(1, round(fraction * total_steps)) and step < total_steps:
                snap_dir = f"{out_dir.rstrip('/')}-at{fraction:g}"
                if not os.path.exists(snap_dir):
                    metrics = evaluate(head, val, tc, t2d) if val else {}
                    _publish_head(head, snap_dir, {
                        "kind": tc.kind, "step": step, "of_steps": total_steps,
                        "tokens_seen": int(fraction * tc.epochs * num_train_tokens),
                        **metrics, "train_wall_s": elapsed_before + time.time() - start})
                    log(f"snapshot {snap_dir}: validation by step: {_describe(metrics)}")
        if step % tc.save_every_steps == 0 or step == total_steps:
            _save_ckpt(ckpt_path, head, optimizer, sched, step, total_steps, num_train_tokens,
                       elapsed_before + time.time() - start)
            log(f"step {step}/{total_steps} loss {loss.item():.3f} train acc by step "
                + " ".join(f"{a:.3f}" for a in accs))
    bar.close()
    wall = elapsed_before + time.time() - start
    metrics = evaluate(head, val, tc, t2d, groups) if val else {}
    log(f"validation by step: {_describe(metrics)}")
    summary = {
        "kind": tc.kind, "steps": total_steps, "epochs": tc.epochs, "ttt_steps": tc.ttt_steps,
        "train_sequences": len(train), "train_tokens": num_train_tokens,
        "unique_train_tokens": unique_tokens, "response_repeat": tc.response_repeat,
        "val_sequences": len(val), "draft_vocab_size": len(draft_ids),
        "draft_vocab_coverage": coverage, **metrics, "objective": tc.objective,
        "train_wall_s": wall, "lr": tc.lr, "batch_tokens": tc.batch_tokens,
        "init_from": tc.init_from, "prompt_styles": tc.prompt_styles,
    }
    _publish_head(head, out_dir, summary)
    log(f"saved head to {out_dir}")
    return summary


def _publish_head(head: Eagle3Head, out_dir: str, summary: dict) -> None:
    """Write a bf16 copy of the head plus training.json, atomically replacing out_dir."""
    import copy

    tmp = out_dir.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_draft_head(copy.deepcopy(head).to(torch.bfloat16), tmp)
    with open(os.path.join(tmp, "training.json"), "w") as f:
        json.dump(summary, f, indent=2)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)


def _cosine(warmup: int, total: int):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor


def _save_ckpt(path, head, optimizer, sched, step, total_steps, num_train_tokens, elapsed):
    tmp = path + ".tmp"
    torch.save({"head": head.state_dict(), "optimizer": optimizer.state_dict(),
                "sched": sched.state_dict(), "step": step, "total_steps": total_steps,
                "num_train_tokens": num_train_tokens, "elapsed": elapsed}, tmp)
    os.replace(tmp, path)


def excluded_keys(cfg: TrainConfig) -> set[str]:
    """Keys of fixed-text chunks from `trainer.exclude_sources`."""
    from eagle_core.train.common import read_jsonl
    from eagle_core.train.corpus import corpus_path

    path = corpus_path(cfg)
    if not cfg.trainer.exclude_sources or not os.path.exists(path):
        return set()
    return {f"corpus:{i}" for i, row in enumerate(read_jsonl(path))
            if row["source"].startswith(tuple(cfg.trainer.exclude_sources))}


def validation_groups(cfg: TrainConfig) -> dict[str, str]:
    """Sequence key -> "T=<temperature>" for self-distilled answers, "fixed text" for the corpus."""
    from eagle_core.train.common import read_jsonl
    from eagle_core.train.corpus import corpus_path
    from eagle_core.train.generate import load_responses

    groups = {f"resp:{row['id']}": f"T={row.get('temperature', 0.0):g}" for row in load_responses(cfg)}
    if os.path.exists(corpus_path(cfg)):
        groups |= {f"corpus:{i}": "fixed text" for i, _ in enumerate(read_jsonl(corpus_path(cfg)))}
    return groups


def run_train(cfg: TrainConfig) -> dict:
    tc = cfg.trainer
    out_dir = tc.output or os.path.join(cfg.work_dir, "head")
    target = load_target(cfg).model
    name = os.path.basename(out_dir.rstrip("/"))
    return train_head(target, shard_paths(cfg), tc, out_dir, os.path.join(cfg.work_dir, "train", name),
                      exclude=excluded_keys(cfg), groups=validation_groups(cfg))


def run_validate(cfg: TrainConfig) -> dict:
    """Validation metrics of `trainer.output` (default <work_dir>/head), written next to the
    work dir's other results as validation-<head name>.json."""
    tc = cfg.trainer
    head_dir = tc.output or os.path.join(cfg.work_dir, "head")
    target = load_target(cfg).model
    result = validate_head(target, shard_paths(cfg), tc, head_dir, validation_groups(cfg),
                           exclude=excluded_keys(cfg))
    path = os.path.join(cfg.work_dir, f"validation-{os.path.basename(head_dir.rstrip('/'))}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    logger.info("wrote %s", path)
    return result
