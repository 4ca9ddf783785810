"""Draft heads for tests (random ones, and an exact "oracle" for a degenerate target), and the
chi-square check of sampled first tokens against the target's exact distribution."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch
from scipy import stats
from transformers import AutoModelForCausalLM

from eagle_core import SamplingParams
from eagle_core.spec.draft_head import EagleHead, draft_config_from_target, save_draft_head


def _target(model_dir: Path):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def random_head_dir(model_dir: Path, out: Path, seed: int = 0) -> Path:
    """An EAGLE-1 head with random weights for `model_dir`'s target (drafts are mostly wrong)."""
    target = _target(model_dir)
    torch.manual_seed(seed)
    head = EagleHead(draft_config_from_target(target.config), target.get_input_embeddings(), target.get_output_embeddings())
    save_draft_head(head, str(out))
    return out


def bigram_target_dir(model_dir: Path, out: Path, seed: int = 0) -> Path:
    """A variant of a tiny Llama whose attention and MLP outputs are zeroed, so its next token
    depends on the current token only (logits = lm_head(norm(embed(token)))). Its LM head is
    untied and drawn small, so next-token distributions are spread over several tokens (a tied
    head would make every token predict itself)."""
    source = _target(model_dir)
    config = copy.deepcopy(source.config)
    config.tie_word_embeddings = False
    target = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    target.load_state_dict(source.state_dict(), strict=False)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        lm_head = target.get_output_embeddings().weight
        lm_head.copy_(torch.randn(lm_head.shape, generator=generator) * 0.15)
        for name, param in target.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                param.zero_()
    target.save_pretrained(out)
    for extra in model_dir.iterdir():
        if extra.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            (out / extra.name).write_bytes(extra.read_bytes())
    return out


def oracle_head_dir(bigram_dir: Path, out: Path) -> Path:
    """An EAGLE-1 head whose greedy drafts equal the bigram target's greedy tokens.

    fc passes the token embedding through and the decoder layer adds nothing, so the head's
    output is embed(token) and its logits lm_head(embed(token)) are a positive multiple of the
    target's lm_head(norm(embed(token))) (RMSNorm with unit weight): the same argmax."""
    target = _target(bigram_dir)
    hidden = target.config.hidden_size
    norm_weight = target.model.norm.weight
    assert torch.allclose(norm_weight, torch.ones_like(norm_weight)), "oracle needs a unit final norm"
    head = EagleHead(draft_config_from_target(target.config), target.get_input_embeddings(), target.get_output_embeddings())
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, :hidden] = torch.eye(hidden)
        head.fc.bias.zero_()
        layer = head.layers[0]
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    save_draft_head(head, str(out))
    return out


def first_three_counts(engine, prompt, params, num_samples: int) -> dict[tuple[int, ...], int]:
    """How often each first three tokens came out of `num_samples` seeded requests (seeds 0..)."""
    counts: dict[tuple[int, ...], int] = {}
    batch = 64
    for start in range(0, num_samples, batch):
        outputs: dict[str, list[int]] = {}
        for i in range(start, min(start + batch, num_samples)):
            engine.add_request(f"s{i}", prompt, SamplingParams(**{**params, "seed": i}))
        while engine.has_unfinished():
            for out in engine.step():
                outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
        for tokens in outputs.values():
            key = tuple(tokens[:3])
            counts[key] = counts.get(key, 0) + 1
    return counts


def exact_first_three(target_dir, prompt, top_k: int) -> dict[tuple[int, ...], float]:
    """The target's exact distribution of its first three sampled tokens under top-k, T=1."""
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()

    def step(prefix):
        with torch.inference_mode():
            logits = model(torch.tensor([prefix])).logits[0, -1]
        top = torch.topk(logits, top_k)
        probs = torch.softmax(top.values, dim=-1)
        return list(zip(top.indices.tolist(), probs.tolist()))

    exact = {}
    for a, pa in step(prompt):
        for b, pb in step(prompt + [a]):
            for c, pc in step(prompt + [a, b]):
                exact[(a, b, c)] = pa * pb * pc
    return exact


def chi_square_pvalue(counts, exact, num_samples) -> float:
    """Chi-square p-value of sampled counts against an exact distribution over the same keys."""
    keys = sorted(exact)
    observed = np.array([counts.get(k, 0) for k in keys], dtype=float)
    assert observed.sum() + sum(v for k, v in counts.items() if k not in exact) == num_samples
    assert all(k in exact for k in counts), "a sample fell outside the target's support"
    expected = np.array([exact[k] for k in keys], dtype=float)
    expected *= num_samples / expected.sum()  # float32 softmax sums to 1 only within ~1e-7
    return float(stats.chisquare(observed, expected).pvalue)


PENALISED = SamplingParams(
    temperature=0.8, top_k=20, seed=7, max_tokens=30, ignore_eos=True,
    presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.2,
)
"""Seeded sampling with every penalty: what exactness tests of sampled speculation run."""
