"""Draft heads for tests: random ones, and an exact "oracle" for a degenerate target."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

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
