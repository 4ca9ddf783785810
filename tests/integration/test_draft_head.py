"""Draft heads on tiny random Llama targets: forward, attention plumbing, checkpoints."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from safetensors.torch import save_file
from transformers import AttentionInterface, DynamicCache, LlamaConfig, LlamaForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from eagle_core.errors import ModelLoadError
from eagle_core.spec.draft_head import (
    Eagle3Head,
    EagleHead,
    draft_config_from_target,
    eagle3_layer_ids,
    load_draft_head,
    save_draft_head,
)

HIDDEN, VOCAB, HEADS, KV_HEADS, INTER = 64, 128, 4, 2, 128
HEAD_DIM = HIDDEN // HEADS
DRAFT_VOCAB = 32


def make_target(num_layers: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        hidden_size=HIDDEN,
        intermediate_size=INTER,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        num_hidden_layers=num_layers,
        vocab_size=VOCAB,
        max_position_embeddings=256,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(num_layers)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def target() -> LlamaForCausalLM:
    return make_target(2)


@pytest.fixture(scope="module")
def target8() -> LlamaForCausalLM:
    return make_target(8)


def eagle1_head(target, attn: str = "sdpa", seed: int = 0) -> EagleHead:
    config = draft_config_from_target(target.config)
    config._attn_implementation = attn
    torch.manual_seed(seed)
    head = EagleHead(config, target.model.embed_tokens, target.lm_head)
    randomize_norms(head)
    return head.eval()


def eagle3_head(target, attn: str = "sdpa", seed: int = 0, num_layers: int = 1) -> Eagle3Head:
    config = draft_config_from_target(target.config, num_layers=num_layers)
    config._attn_implementation = attn
    torch.manual_seed(seed)
    head = Eagle3Head(
        config,
        target.model.embed_tokens,
        eagle3_layer_ids(target.config.num_hidden_layers),
        draft_vocab_size=DRAFT_VOCAB,
    )
    head.set_draft_vocab(torch.arange(0, VOCAB, VOCAB // DRAFT_VOCAB))
    randomize_norms(head)
    return head.eval()


def randomize_norms(head: torch.nn.Module) -> None:
    """Norm weights start at 1; make them differ so a dropped norm would show."""
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)


def inputs(t: int = 6, seed: int = 1, width: int = HIDDEN):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (1, t), generator=gen)
    features = torch.randn(1, t, width, generator=gen)
    positions = torch.arange(10, 10 + t)[None]
    return ids, features, positions


def causal_mask(t: int) -> torch.Tensor:
    return torch.ones(t, t, dtype=torch.bool).tril()[None, None]  # [1, 1, T, T]


def run(head, ids, features, positions, **kw) -> torch.Tensor:
    with torch.no_grad():
        return head(ids, features, positions, **kw)


# ---------------------------------------------------------------------------------------------
# forward
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_forward_with_causal_mask(kind, target, target8):
    head = eagle1_head(target) if kind == "eagle1" else eagle3_head(target8)
    ids, features, positions = inputs(width=head.feature_size)
    out = run(head, ids, features, positions, attention_mask=causal_mask(6))
    assert out.shape == (1, 6, HIDDEN)
    assert head.logits(out).shape == (1, 6, head.vocab_size)
    # causal: changing the last position leaves earlier outputs untouched
    ids2, features2 = ids.clone(), features.clone()
    ids2[0, -1] = (ids[0, -1] + 1) % VOCAB
    features2[0, -1] += 1.0
    out2 = run(head, ids2, features2, positions, attention_mask=causal_mask(6))
    assert torch.allclose(out[:, :5], out2[:, :5], atol=1e-5)
    assert not torch.allclose(out[:, 5], out2[:, 5], atol=1e-3)
    # an explicit causal mask equals sdpa's implicit causal mode
    assert torch.allclose(out, run(head, ids, features, positions), atol=1e-5)


def recording_attention(module, query, key, value, attention_mask, **kwargs):
    SEEN.append((kwargs.get("step_meta"), tuple(query.shape), tuple(key.shape)))
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


SEEN: list = []
AttentionInterface.register("spec_test_recording", recording_attention)


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_custom_attention_receives_caller_kwargs(kind, target, target8):
    SEEN.clear()
    make = eagle1_head if kind == "eagle1" else eagle3_head
    head = make(target if kind == "eagle1" else target8, attn="spec_test_recording")
    reference = make(target if kind == "eagle1" else target8, attn="sdpa")
    ids, features, positions = inputs(width=head.feature_size)
    out = run(head, ids, features, positions, step_meta={"step": 3})
    assert SEEN == [({"step": 3}, (1, HEADS, 6, HEAD_DIM), (1, KV_HEADS, 6, HEAD_DIM))]
    assert torch.allclose(out, run(reference, ids, features, positions), atol=1e-6)


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_cache_kwarg_reaches_attention(kind, target, target8):
    head = eagle1_head(target) if kind == "eagle1" else eagle3_head(target8)
    ids, features, positions = inputs(width=head.feature_size)
    full = run(head, ids, features, positions)
    cache = DynamicCache(config=head.config)
    run(head, ids[:, :5], features[:, :5], positions[:, :5], cache=cache)
    assert cache.get_seq_length() == 5
    last = run(head, ids[:, 5:], features[:, 5:], positions[:, 5:], cache=cache)
    assert torch.allclose(last, full[:, 5:], atol=1e-5)


def test_extra_layers_follow_the_eagle3_layer(target8):
    """A two-layer head is the EAGLE-3 layer, then a plain Llama decoder layer on its output
    (same positions, the next layer_idx), and the last layer's output is what feeds back."""
    head = eagle3_head(target8, num_layers=2)
    assert head.num_layers == 2 and head.extra_layers[0].self_attn.layer_idx == 1
    ids, features, positions = inputs(width=head.feature_size)
    with torch.no_grad():
        hidden = head.fuse(features)
        first = head.midlayer(
            head.embed(ids), hidden, head.rotary_emb(hidden, positions), position_ids=positions
        )
        expected = head.extra_layers[0](
            first, position_ids=positions, position_embeddings=head.rotary_emb(hidden, positions)
        )
    out = run(head, ids, features, positions)
    assert torch.allclose(out, expected, atol=1e-6)
    assert not torch.allclose(out, first, atol=1e-3)  # the extra layer did something


def test_eagle3_takes_fused_or_own_hidden(target8):
    head = eagle3_head(target8)
    ids, features, positions = inputs(width=head.feature_size)
    fused = head.fuse(features)
    assert torch.allclose(run(head, ids, features, positions), run(head, ids, fused, positions))
    with pytest.raises(ValueError, match="features width"):
        run(head, ids, features[..., :10], positions)


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_int8_weights_keep_the_heads_drafts(kind, target, target8):
    """The draft head's decoding path with int8 linears stays within rounding of the bf16 head."""
    import copy

    from eagle_core.spec.int8_linear import Int8Linear, quantize_linears

    head = (eagle1_head(target) if kind == "eagle1" else eagle3_head(target8)).to(torch.bfloat16)
    quantized = copy.deepcopy(head)
    replaced, left = quantize_linears(quantized, keep=("fc",))
    assert replaced and not left
    assert sum(isinstance(m, Int8Linear) for m in quantized.modules()) == len(replaced)
    ids, features, positions = inputs(t=4, width=head.feature_size)  # decoding-sized: int8 path
    with torch.no_grad():
        expected = head.logits(run(head, ids, features, positions, attention_mask=causal_mask(4))).float()
        got = quantized.logits(
            run(quantized, ids, features, positions, attention_mask=causal_mask(4))
        ).float()
    assert ((got - expected).norm() / expected.norm()).item() < 0.03
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean().item() >= 0.75


def test_features_from_target_hidden_states(target, target8):
    ids = torch.randint(0, VOCAB, (1, 5))
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    head = eagle1_head(target)
    feature = head.features_from_hidden_states(out.hidden_states)
    # the EAGLE-1 feature is the LM head's input (after the final norm)
    assert torch.allclose(target.lm_head(feature), out.logits, atol=1e-5)
    # EAGLE-3 features are the residual stream entering layers 2, 4 and 5
    entering = {}
    hooks = [
        target8.model.layers[i].register_forward_pre_hook(
            lambda _m, args, kwargs, i=i: entering.__setitem__(
                i, args[0] if args else kwargs["hidden_states"]
            ),
            with_kwargs=True,
        )
        for i in (2, 4, 5)
    ]
    with torch.no_grad():
        out8 = target8(ids, output_hidden_states=True)
    for hook in hooks:
        hook.remove()
    head3 = eagle3_head(target8)
    fused = head3.features_from_hidden_states(out8.hidden_states)
    assert torch.equal(fused, torch.cat([entering[2], entering[4], entering[5]], dim=-1))


def test_vocab_maps(target8):
    head = eagle3_head(target8)
    assert head.draft_to_target(torch.tensor([0, 1, 31])).tolist() == [0, 4, 124]
    assert head.target_to_draft(torch.tensor([0, 4, 5, 124])).tolist() == [0, 1, -1, 31]
    assert int(head.t2d.sum()) == DRAFT_VOCAB


def test_eagle3_layer_ids():
    assert eagle3_layer_ids(30) == (2, 15, 27)
    assert eagle3_layer_ids(32) == (2, 16, 29)
    for n in range(3, 40):
        ids = eagle3_layer_ids(n)
        assert len(set(ids)) == 3 and all(0 <= i < n for i in ids)
    with pytest.raises(ValueError):
        eagle3_layer_ids(2)


def test_head_keeps_rope_in_float32_and_target_modules_out(target):
    head = eagle1_head(target).to(torch.bfloat16)
    assert head.rotary_emb.inv_freq.dtype == torch.float32
    assert head.fc.weight.dtype == torch.bfloat16
    assert target.model.embed_tokens.weight.dtype == torch.float32  # the target was not cast
    names = [n for n, _ in head.named_parameters()]
    assert not any("embed" in n or "lm_head" in n for n in names)


# ---------------------------------------------------------------------------------------------
# checkpoints: our format
# ---------------------------------------------------------------------------------------------


def load(path, target, dtype=torch.float32, attn="sdpa"):
    return load_draft_head(
        str(path), target.config, target.model.embed_tokens, target.lm_head, dtype, "cpu", attn
    )


@pytest.mark.parametrize(("kind", "num_layers"), [("eagle1", 1), ("eagle3", 1), ("eagle3", 2)])
def test_save_load_roundtrip(kind, num_layers, target, target8, tmp_path):
    tgt = target if kind == "eagle1" else target8
    head = eagle1_head(tgt) if kind == "eagle1" else eagle3_head(tgt, num_layers=num_layers)
    save_draft_head(head, str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["eagle_serve"]["kind"] == kind
    assert config["num_hidden_layers"] == num_layers
    assert config["eagle_serve"]["version"] == 1
    if kind == "eagle3":
        assert config["eagle_serve"]["layer_ids"] == [2, 4, 5]
    loaded = load(tmp_path, tgt)
    assert type(loaded) is type(head)
    ids, features, positions = inputs(width=head.feature_size)
    out = run(head, ids, features, positions)
    assert torch.equal(run(loaded, ids, features, positions), out)
    assert torch.equal(loaded.logits(out), head.logits(out))
    bf16 = load(tmp_path, tgt, dtype=torch.bfloat16)
    assert bf16.fc.weight.dtype == torch.bfloat16
    assert bf16.rotary_emb.inv_freq.dtype == torch.float32


def test_saved_eagle1_checkpoint_leaves_out_target_weights(target, tmp_path):
    from safetensors.torch import load_file

    save_draft_head(eagle1_head(target), str(tmp_path))
    keys = set(load_file(str(tmp_path / "model.safetensors")))
    assert "fc.weight" in keys and "layers.0.self_attn.q_proj.weight" in keys
    assert not any("embed" in k or "lm_head" in k for k in keys)


# ---------------------------------------------------------------------------------------------
# checkpoints: SafeAILab layouts, built by hand, checked against EAGLE's math
# ---------------------------------------------------------------------------------------------


def rand(*shape: int) -> torch.Tensor:
    # stored in fp16 like the published heads; the reference uses the same rounded values
    return (torch.randn(*shape) * 0.1).half()


def llama_layer_weights(prefix: str, in_width: int) -> dict[str, torch.Tensor]:
    return {
        f"{prefix}.self_attn.q_proj.weight": rand(HEADS * HEAD_DIM, in_width),
        f"{prefix}.self_attn.k_proj.weight": rand(KV_HEADS * HEAD_DIM, in_width),
        f"{prefix}.self_attn.v_proj.weight": rand(KV_HEADS * HEAD_DIM, in_width),
        f"{prefix}.self_attn.o_proj.weight": rand(HIDDEN, HEADS * HEAD_DIM),
        f"{prefix}.mlp.gate_proj.weight": rand(INTER, HIDDEN),
        f"{prefix}.mlp.up_proj.weight": rand(INTER, HIDDEN),
        f"{prefix}.mlp.down_proj.weight": rand(HIDDEN, INTER),
        f"{prefix}.post_attention_layernorm.weight": 1 + rand(HIDDEN),
    }


def safeailab_config(**extra) -> dict:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": INTER,
        "max_position_embeddings": 256,
        "model_type": "llama",
        "num_attention_heads": HEADS,
        "num_hidden_layers": 1,
        "num_key_value_heads": KV_HEADS,
        "pad_token_id": 0,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-6,
        "rope_scaling": None,
        "rope_theta": 5000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "transformers_version": "4.28.1",
        "use_cache": True,
        "vocab_size": VOCAB,
    }
    config.update(extra)
    return config


def write_checkpoint(path, config: dict, weights: dict, fmt: str) -> None:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    if fmt == "bin":
        torch.save(weights, os.path.join(path, "pytorch_model.bin"))
    else:
        save_file(weights, os.path.join(path, "model.safetensors"))


def eagle1_weights() -> dict[str, torch.Tensor]:
    torch.manual_seed(11)
    weights = {"fc.weight": rand(HIDDEN, 2 * HIDDEN), "fc.bias": rand(HIDDEN)}
    weights.update(llama_layer_weights("layers.0", HIDDEN))
    weights["embed_tokens.weight"] = rand(VOCAB, HIDDEN)  # SafeAILab stores a target copy
    return weights


def eagle3_weights() -> dict[str, torch.Tensor]:
    torch.manual_seed(12)
    weights = {"fc.weight": rand(HIDDEN, 3 * HIDDEN)}
    weights.update(llama_layer_weights("midlayer", 2 * HIDDEN))
    weights["midlayer.hidden_norm.weight"] = 1 + rand(HIDDEN)
    weights["midlayer.input_layernorm.weight"] = 1 + rand(HIDDEN)
    weights["norm.weight"] = 1 + rand(HIDDEN)
    weights["lm_head.weight"] = rand(DRAFT_VOCAB, HIDDEN)
    draft_to_target = torch.arange(0, VOCAB, VOCAB // DRAFT_VOCAB)
    weights["d2t"] = draft_to_target - torch.arange(DRAFT_VOCAB)  # SafeAILab stores offsets
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[draft_to_target] = True
    weights["t2d"] = t2d
    return weights


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def ref_attention(x, w, prefix, positions, theta):
    """Plain causal attention with RoPE, as in SafeAILab's cnets."""
    t = x.shape[1]
    q = (x @ w[f"{prefix}.q_proj.weight"].T).view(1, t, HEADS, HEAD_DIM).transpose(1, 2)
    k = (x @ w[f"{prefix}.k_proj.weight"].T).view(1, t, KV_HEADS, HEAD_DIM).transpose(1, 2)
    v = (x @ w[f"{prefix}.v_proj.weight"].T).view(1, t, KV_HEADS, HEAD_DIM).transpose(1, 2)
    inv_freq = 1.0 / (theta ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
    angles = positions[0, :, None].float() * inv_freq
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()

    def rotate(u):
        half = HEAD_DIM // 2
        return u * cos + torch.cat([-u[..., half:], u[..., :half]], -1) * sin

    q, k = rotate(q), rotate(k)
    k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
    v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM)
    scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(1, t, HEADS * HEAD_DIM)
    return out @ w[f"{prefix}.o_proj.weight"].T


def ref_mlp(x, w, prefix):
    gate = torch.nn.functional.silu(x @ w[f"{prefix}.gate_proj.weight"].T)
    return (gate * (x @ w[f"{prefix}.up_proj.weight"].T)) @ w[f"{prefix}.down_proj.weight"].T


def ref_eagle1(w, embedding, ids, features, positions, theta):
    x = torch.cat([embedding[ids], features], -1) @ w["fc.weight"].T + w["fc.bias"]
    x = x + ref_attention(x, w, "layers.0.self_attn", positions, theta)  # no input norm
    post = rms(x, w["layers.0.post_attention_layernorm.weight"], 1e-6)
    return x + ref_mlp(post, w, "layers.0.mlp")


def ref_eagle3(w, embedding, ids, features, positions, theta, eps):
    hidden = features @ w["fc.weight"].T
    attn_in = torch.cat(
        [
            rms(embedding[ids], w["midlayer.input_layernorm.weight"], eps),
            rms(hidden, w["midlayer.hidden_norm.weight"], eps),
        ],
        -1,
    )
    x = hidden + ref_attention(attn_in, w, "midlayer.self_attn", positions, theta)
    x = x + ref_mlp(rms(x, w["midlayer.post_attention_layernorm.weight"], eps), w, "midlayer.mlp")
    logits = rms(x, w["norm.weight"], eps) @ w["lm_head.weight"].T
    return x, logits


def as_float(weights):
    return {k: v.float() if v.is_floating_point() else v for k, v in weights.items()}


@pytest.mark.parametrize("fmt", ["bin", "safetensors"])
def test_safeailab_eagle1_checkpoint_matches_reference(fmt, target, tmp_path):
    weights = eagle1_weights()
    write_checkpoint(tmp_path, safeailab_config(bias=True), weights, fmt)
    head = load(tmp_path, target)
    assert isinstance(head, EagleHead)
    assert torch.equal(head.fc.weight, weights["fc.weight"].float())
    ids, features, positions = inputs()
    embedding = target.model.embed_tokens.weight.detach()  # the target's, not the stored copy
    expected = ref_eagle1(as_float(weights), embedding, ids, features, positions, theta=5000.0)
    assert torch.allclose(run(head, ids, features, positions), expected, atol=1e-4)


def test_safeailab_eagle1_bias_inferred_from_weights(target, tmp_path):
    weights = eagle1_weights()
    del weights["fc.bias"]
    write_checkpoint(tmp_path, safeailab_config(), weights, "bin")
    assert load(tmp_path, target).fc.bias is None


@pytest.mark.parametrize("fmt", ["bin", "safetensors"])
def test_safeailab_eagle3_checkpoint_matches_reference(fmt, target8, tmp_path):
    weights = eagle3_weights()
    config = safeailab_config(
        architectures=["LlamaForCausalLMEagle3"],
        draft_vocab_size=DRAFT_VOCAB,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
    )
    write_checkpoint(tmp_path, config, weights, fmt)
    head = load(tmp_path, target8)
    assert isinstance(head, Eagle3Head)
    assert head.layer_ids == (2, 4, 5)
    assert head.draft_to_target(torch.tensor([0, 5])).tolist() == [0, 20]
    ids, features, positions = inputs(width=3 * HIDDEN)
    embedding = target8.model.embed_tokens.weight.detach()
    expected, expected_logits = ref_eagle3(
        as_float(weights), embedding, ids, features, positions, theta=500000.0, eps=1e-5
    )
    out = run(head, ids, features, positions)
    assert torch.allclose(out, expected, atol=1e-4)
    with torch.no_grad():
        assert torch.allclose(head.logits(out), expected_logits, atol=1e-4)


def test_eagle3_full_vocab_without_maps_and_aux_layer_ids(target8, tmp_path):
    weights = eagle3_weights()
    del weights["d2t"], weights["t2d"]
    weights["lm_head.weight"] = rand(VOCAB, HIDDEN)
    config = safeailab_config(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 3, 6]})
    write_checkpoint(tmp_path, config, weights, "safetensors")
    head = load(tmp_path, target8)
    assert head.vocab_size == VOCAB
    assert head.draft_to_target(torch.tensor([5, 77])).tolist() == [5, 77]
    assert head.layer_ids == (2, 4, 7)  # layer outputs 1, 3, 6 = inputs of layers 2, 4, 7


def test_eagle3_own_embedding_when_hidden_sizes_differ(target8, tmp_path):
    small = 32
    torch.manual_seed(3)
    weights = {
        "fc.weight": rand(small, 3 * HIDDEN),
        "midlayer.self_attn.q_proj.weight": rand(small, 2 * small),
        "midlayer.self_attn.k_proj.weight": rand(small // 2, 2 * small),
        "midlayer.self_attn.v_proj.weight": rand(small // 2, 2 * small),
        "midlayer.self_attn.o_proj.weight": rand(small, small),
        "midlayer.mlp.gate_proj.weight": rand(INTER, small),
        "midlayer.mlp.up_proj.weight": rand(INTER, small),
        "midlayer.mlp.down_proj.weight": rand(small, INTER),
        "midlayer.post_attention_layernorm.weight": 1 + rand(small),
        "midlayer.hidden_norm.weight": 1 + rand(small),
        "midlayer.input_layernorm.weight": 1 + rand(small),
        "norm.weight": 1 + rand(small),
        "lm_head.weight": rand(VOCAB, small),
        "embed_tokens.weight": rand(VOCAB, small),
    }
    config = safeailab_config(hidden_size=small, target_hidden_size=HIDDEN, head_dim=8)
    write_checkpoint(tmp_path, config, weights, "safetensors")
    head = load(tmp_path, target8)
    assert torch.equal(head.embed_tokens.weight, weights["embed_tokens.weight"].float())
    ids, features, positions = inputs(width=3 * HIDDEN)
    assert run(head, ids, features, positions).shape == (1, 6, small)


# ---------------------------------------------------------------------------------------------
# checkpoints: validation
# ---------------------------------------------------------------------------------------------


def test_wrong_hidden_size_is_named(target, target8, tmp_path):
    write_checkpoint(tmp_path / "e1", safeailab_config(hidden_size=4096), eagle1_weights(), "bin")
    with pytest.raises(
        ModelLoadError, match="hidden_size 4096 does not match target hidden_size 64"
    ):
        load(tmp_path / "e1", target)
    write_checkpoint(tmp_path / "e3", safeailab_config(hidden_size=96), eagle3_weights(), "bin")
    with pytest.raises(ModelLoadError, match="hidden_size 96 does not match target hidden_size 64"):
        load(tmp_path / "e3", target8)
    write_checkpoint(
        tmp_path / "e3t", safeailab_config(target_hidden_size=80), eagle3_weights(), "bin"
    )
    with pytest.raises(ModelLoadError, match="target_hidden_size 80 does not match"):
        load(tmp_path / "e3t", target8)


def test_wrong_vocab_is_named(target, target8, tmp_path):
    write_checkpoint(tmp_path / "e1", safeailab_config(vocab_size=32000), eagle1_weights(), "bin")
    with pytest.raises(
        ModelLoadError, match="vocab_size 32000 does not match target vocab_size 128"
    ):
        load(tmp_path / "e1", target)
    weights = eagle3_weights()
    weights["d2t"] = weights["d2t"][:20]
    write_checkpoint(
        tmp_path / "e3", safeailab_config(draft_vocab_size=DRAFT_VOCAB), weights, "bin"
    )
    with pytest.raises(ModelLoadError, match=r"d2t has shape \(20,\)"):
        load(tmp_path / "e3", target8)
    weights = eagle3_weights()
    weights["d2t"][3] = 1000
    write_checkpoint(
        tmp_path / "e3b", safeailab_config(draft_vocab_size=DRAFT_VOCAB), weights, "bin"
    )
    with pytest.raises(ModelLoadError, match="d2t maps draft ids outside"):
        load(tmp_path / "e3b", target8)
    weights = eagle3_weights()
    weights["t2d"][1] = True
    write_checkpoint(
        tmp_path / "e3c", safeailab_config(draft_vocab_size=DRAFT_VOCAB), weights, "bin"
    )
    with pytest.raises(ModelLoadError, match="t2d does not mark"):
        load(tmp_path / "e3c", target8)


def test_missing_unexpected_and_misshaped_keys_are_named(target, tmp_path):
    weights = eagle1_weights()
    del weights["layers.0.mlp.down_proj.weight"]
    write_checkpoint(tmp_path / "missing", safeailab_config(), weights, "bin")
    with pytest.raises(ModelLoadError, match=r"missing keys: layers\.0\.mlp\.down_proj\.weight"):
        load(tmp_path / "missing", target)
    weights = eagle1_weights()
    weights["layers.0.input_layernorm.weight"] = rand(HIDDEN)
    write_checkpoint(tmp_path / "extra", safeailab_config(), weights, "bin")
    with pytest.raises(
        ModelLoadError, match=r"unexpected keys: layers\.0\.input_layernorm\.weight"
    ):
        load(tmp_path / "extra", target)
    weights = eagle1_weights()
    weights["layers.0.mlp.up_proj.weight"] = rand(INTER + 1, HIDDEN)
    write_checkpoint(tmp_path / "shape", safeailab_config(), weights, "bin")
    with pytest.raises(
        ModelLoadError, match=r"layers\.0\.mlp\.up_proj\.weight has shape \(129, 64\)"
    ):
        load(tmp_path / "shape", target)
    weights = eagle1_weights()
    del weights["fc.bias"]
    write_checkpoint(tmp_path / "bias", safeailab_config(bias=True), weights, "bin")
    with pytest.raises(ModelLoadError, match=r"missing keys: fc\.bias"):
        load(tmp_path / "bias", target)
    weights = eagle1_weights()
    weights["embed_tokens.weight"] = rand(VOCAB, 32)
    write_checkpoint(tmp_path / "emb", safeailab_config(), weights, "bin")
    with pytest.raises(ModelLoadError, match="embed_tokens.weight has shape"):
        load(tmp_path / "emb", target)


def test_eagle3_layer_ids_are_checked_against_target_depth(target, target8, tmp_path):
    head = eagle3_head(target8)
    save_draft_head(head, str(tmp_path / "ours"))
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    config["eagle_serve"]["layer_ids"] = [2, 4, 9]
    (tmp_path / "ours" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="layer id 9 is outside the target's 8 layers"):
        load(tmp_path / "ours", target8)
    write_checkpoint(tmp_path / "shallow", safeailab_config(), eagle3_weights(), "bin")
    with pytest.raises(ModelLoadError, match="at least 3 layers"):
        load(tmp_path / "shallow", target)


def test_unreadable_directories(target, tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        load(tmp_path / "nowhere", target)
    os.makedirs(tmp_path / "noweights")
    (tmp_path / "noweights" / "config.json").write_text(json.dumps(safeailab_config()))
    with pytest.raises(ModelLoadError, match="no model.safetensors or pytorch_model.bin"):
        load(tmp_path / "noweights", target)
    write_checkpoint(tmp_path / "odd", safeailab_config(), {"foo.weight": rand(3)}, "bin")
    with pytest.raises(ModelLoadError, match="cannot tell the draft head's kind"):
        load(tmp_path / "odd", target)
    write_checkpoint(
        tmp_path / "deep", safeailab_config(num_hidden_layers=2), eagle1_weights(), "bin"
    )
    with pytest.raises(ModelLoadError, match="2 decoder layers"):
        load(tmp_path / "deep", target)


def test_extra_layers_must_all_be_in_the_checkpoint(target8, tmp_path):
    write_checkpoint(tmp_path / "e3", safeailab_config(num_hidden_layers=2), eagle3_weights(), "bin")
    with pytest.raises(ModelLoadError, match="missing keys: extra_layers.0"):
        load(tmp_path / "e3", target8)
    write_checkpoint(tmp_path / "e0", safeailab_config(num_hidden_layers=0), eagle3_weights(), "bin")
    with pytest.raises(ModelLoadError, match="num_hidden_layers must be a positive integer"):
        load(tmp_path / "e0", target8)


# ---------------------------------------------------------------------------------------------
# training: the unrolled forward computes what serving computes; growing keeps the drafts
# ---------------------------------------------------------------------------------------------


def _ttt_batch(head: Eagle3Head, t: int = 7):
    ids, features, _ = inputs(t=t, width=head.feature_size)
    return {"input_ids": ids, "features": features}


@pytest.mark.parametrize("num_layers", [1, 2])
def test_unrolled_training_forward_matches_the_served_head(num_layers, target8):
    """Step 0 of the training-time test is the head over target features; step 1 at position q
    is the head over the committed context (fused target features) plus its own step-0 output
    from q - 1, which is what a tree level feeds at serving time."""
    from eagle_core.train.trainer import ttt_forward

    head = eagle3_head(target8, num_layers=num_layers)
    batch = _ttt_batch(head)
    ids, t = batch["input_ids"], batch["input_ids"].shape[1]
    positions = torch.arange(t)[None]
    with torch.no_grad():
        step0, step1 = ttt_forward(head, batch, steps=2)
        out0 = head(ids, batch["features"], positions)  # [1, T, h]
        assert torch.allclose(step0, head.logits(out0), atol=1e-5)
        fused = head.fuse(batch["features"])
        for q in (1, 3, t - 1):
            hidden = torch.cat([fused[:, :q], out0[:, q - 1 : q]], dim=1)  # [1, q + 1, h]
            tree_level = head(ids[:, : q + 1], hidden, positions[:, : q + 1])
            assert torch.allclose(step1[0, q], head.logits(tree_level)[0, q], atol=1e-5), q


def test_growing_a_head_keeps_its_drafts_and_trains_the_new_layer(target8):
    from eagle_core.train.trainer import grow_head, ttt_forward

    head = eagle3_head(target8)
    grown = grow_head(head, target8.model.embed_tokens, num_layers=3)
    assert grown.num_layers == 3 and len(grown.extra_layers) == 2
    batch = _ttt_batch(head)
    with torch.no_grad():
        for before, after in zip(ttt_forward(head, batch, 3), ttt_forward(grown, batch, 3)):
            assert torch.equal(before, after)
    assert torch.equal(grown.d2t, head.d2t) and torch.equal(grown.lm_head.weight, head.lm_head.weight)
    loss = sum(logits.logsumexp(-1).sum() for logits in ttt_forward(grown, batch, 2))
    loss.backward()
    for layer in grown.extra_layers:  # zero output projections still get gradients
        assert layer.self_attn.o_proj.weight.grad.abs().sum() > 0
        assert layer.mlp.down_proj.weight.grad.abs().sum() > 0


def test_growing_the_draft_vocabulary_keeps_the_old_rows_and_adds_frequent_tokens(target8):
    from eagle_core.train.trainer import grow_draft_vocab

    head = eagle3_head(target8)  # draft ids 0, 4, 8, ... (DRAFT_VOCAB of them)
    counts = torch.zeros(VOCAB)
    counts[[1, 2, 3, 4]] = torch.tensor([5.0, 9.0, 1.0, 100.0])  # 4 is already in the vocabulary
    grown = grow_draft_vocab(head, target8, counts, DRAFT_VOCAB + 2)
    assert grown.vocab_size == DRAFT_VOCAB + 2
    ids = grown.draft_to_target(torch.arange(grown.vocab_size))
    assert torch.equal(ids[:DRAFT_VOCAB], head.draft_to_target(torch.arange(DRAFT_VOCAB)))
    assert ids[DRAFT_VOCAB:].tolist() == [2, 1]  # the two most frequent it lacked
    assert grown.t2d.sum() == DRAFT_VOCAB + 2 and bool(grown.t2d[[1, 2]].all())
    assert torch.equal(grown.lm_head.weight[DRAFT_VOCAB:], target8.lm_head.weight[[2, 1]])
    ids_in, features, positions = inputs(width=head.feature_size)
    with torch.no_grad():
        out = run(head, ids_in, features, positions)
        assert torch.equal(run(grown, ids_in, features, positions), out)
        assert torch.equal(grown.logits(out)[..., :DRAFT_VOCAB], head.logits(out))
