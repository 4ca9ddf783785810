"""EAGLE draft heads (EAGLE-1/2 and EAGLE-3) and their checkpoints.

Both heads are a Llama decoder layer fed with the target's own features (an EAGLE-3 head may
stack more plain decoder layers after it, see `Eagle3Head`):

- `EagleHead` (EAGLE-1/2): input at position i is concat(embed(token i+1), f_i) -> fc (2h -> h)
  -> a Llama decoder layer without its input norm -> predicted feature f_{i+1}. f_i is the
  target's LAST hidden state AFTER its final norm (the LM head's input); the head's output is in
  the same space, so its logits come from the target's own LM head. Embedding and LM head are
  the target's, shared and frozen: they are not registered as submodules (not in
  `parameters()`, not in saved checkpoints).
- `Eagle3Head` (EAGLE-3): the target features are the residual stream ENTERING three target
  layers (`layer_ids`, = transformers' `hidden_states[i]`), concatenated (3 * h_target) and fused
  by fc (-> h). The decoder layer's attention reads concat(input_layernorm(embed(token)),
  hidden_norm(hidden)) (q/k/v take 2h); its residual is `hidden`. The layer output (before the
  final norm) is what later draft steps feed back as `features`; logits are
  lm_head(norm(output)) over a reduced draft vocabulary, mapped back with
  target_id = draft_id + d2t[draft_id]. `t2d[target_id]` is True iff the token is in the draft
  vocabulary.

Attention goes through transformers' attention interface (`config._attn_implementation`), so
extra keyword arguments of `forward` (attention_mask, cache, custom metadata) reach the attention
function untouched. The caller owns masks, positions and KV.

Checkpoints: a directory with config.json and model.safetensors or pytorch_model.bin. Weight
names follow SafeAILab's (EAGLE-1/2: `fc.*`, `layers.0.*`; EAGLE-3: `fc.*`, `midlayer.*`,
`norm.weight`, `lm_head.weight`, `d2t`, `t2d`); `save_draft_head` writes the same names plus an
"eagle_serve" block in config.json, so its output also loads as a SafeAILab-layout checkpoint.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)

from eagle_core.errors import ModelLoadError

FORMAT_VERSION = 1
"""Version of the "eagle_serve" block that `save_draft_head` writes."""

_CONFIG_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "rms_norm_eps",
    "max_position_embeddings",
    "vocab_size",
    "rope_parameters",
)


def eagle3_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """Target layers whose INPUT residual stream EAGLE-3 fuses: (2, L // 2, L - 3).

    An id i means transformers' `hidden_states[i]` (embeddings for 0, the output of layer i - 1
    otherwise). Targets with fewer than 7 layers, where the reference choice collides, get
    (0, L // 2, L - 1) instead.
    """
    if num_layers >= 7:
        return (2, num_layers // 2, num_layers - 3)
    if num_layers >= 3:
        return (0, num_layers // 2, num_layers - 1)
    raise ValueError(f"EAGLE-3 needs a target with at least 3 layers, got {num_layers}")


def draft_config_from_target(
    target_config: Any, num_layers: int = 1, **overrides: Any
) -> LlamaConfig:
    """A Llama config shaped like the target's decoder layers; one layer is the usual head."""
    hidden = target_config.hidden_size
    heads = target_config.num_attention_heads
    fields: dict[str, Any] = {
        "hidden_size": hidden,
        "intermediate_size": target_config.intermediate_size,
        "num_attention_heads": heads,
        "num_key_value_heads": getattr(target_config, "num_key_value_heads", None) or heads,
        "head_dim": getattr(target_config, "head_dim", None) or hidden // heads,
        "hidden_act": getattr(target_config, "hidden_act", "silu"),
        "rms_norm_eps": getattr(target_config, "rms_norm_eps", 1e-6),
        "max_position_embeddings": target_config.max_position_embeddings,
        "vocab_size": target_config.vocab_size,
        "rope_parameters": dict(
            getattr(target_config, "rope_parameters", None)
            or {"rope_type": "default", "rope_theta": 10000.0}
        ),
    }
    fields.update(overrides)
    return LlamaConfig(num_hidden_layers=num_layers, attention_bias=False, mlp_bias=False, **fields)


class _DraftHeadBase(nn.Module):
    """What both heads share: RoPE kept in float32, the target's embedding held unregistered."""

    kind: str

    def __init__(self, config: LlamaConfig, embedding: nn.Module) -> None:
        super().__init__()
        self.config = config
        self.rotary_emb = LlamaRotaryEmbedding(config)
        # the target's frozen embedding: used, never trained, moved or saved by the head
        object.__setattr__(self, "_target_embedding", embedding)

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def num_layers(self) -> int:
        """Decoder layers, each with its own KV (layer_idx 0 .. num_layers - 1)."""
        return self.config.num_hidden_layers

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self._target_embedding(input_ids)

    def draft_to_target(self, ids: torch.Tensor) -> torch.Tensor:
        """Map ids of the head's logits to target token ids (identity for EAGLE-1/2)."""
        return ids

    def _position_embeddings(
        self, x: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotary_emb(x, position_ids)

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        # .to(dtype) would round RoPE's inverse frequencies; rebuild them in float32 instead
        super()._apply(fn, recurse)
        device = self.rotary_emb.inv_freq.device
        self.rotary_emb = LlamaRotaryEmbedding(self.config).to(device)
        return self


class EagleHead(_DraftHeadBase):
    """EAGLE-1/2 draft head: fc(concat(embed, feature)) -> one Llama decoder layer."""

    kind = "eagle1"

    def __init__(
        self,
        config: LlamaConfig,
        embedding: nn.Module,
        lm_head: nn.Module,
        fc_bias: bool = True,
        qkv_bias: bool = False,
        layer_idx: int = 0,
    ) -> None:
        super().__init__(config, embedding)
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=fc_bias)
        layer = LlamaDecoderLayer(config, layer_idx)
        layer.input_layernorm = nn.Identity()  # EAGLE's first layer has no input norm
        if qkv_bias:
            _replace_qkv(layer.self_attn, hidden, bias=True)
        self.layers = nn.ModuleList([layer])
        object.__setattr__(self, "_target_lm_head", lm_head)

    @property
    def feature_size(self) -> int:
        """Width of the target features `forward` takes."""
        return self.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def layer_ids(self) -> None:
        """EAGLE-1/2 reads the target's final-norm output, not intermediate layers."""
        return None

    def features_from_hidden_states(self, hidden_states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The feature from transformers' `output_hidden_states` tuple: its last entry, which in
        transformers 5 is the final norm's output (the LM head input)."""
        return hidden_states[-1]

    def forward(
        self,
        input_ids: torch.Tensor,  # [1, T] token i+1
        features: torch.Tensor,  # [1, T, h] target feature f_i (or the head's own prediction)
        position_ids: torch.Tensor,  # [1, T]
        **attn_kwargs: Any,
    ) -> torch.Tensor:
        """Predicted features f_{i+1}, [1, T, h]. `attn_kwargs` go to the decoder layer."""
        dtype = self.fc.weight.dtype
        x = self.fc(torch.cat([self.embed(input_ids).to(dtype), features.to(dtype)], dim=-1))
        position_embeddings = self._position_embeddings(x, position_ids)
        return self.layers[0](
            x, position_ids=position_ids, position_embeddings=position_embeddings, **attn_kwargs
        )

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[*, h] -> [*, V] through the target's LM head."""
        weight = getattr(self._target_lm_head, "weight", None)
        if weight is not None:
            hidden = hidden.to(weight.dtype)
        return self._target_lm_head(hidden)


class Eagle3DecoderLayer(nn.Module):
    """The EAGLE-3 layer: attention over concat(norm(embedding), norm(hidden)), residual hidden."""

    def __init__(self, config: LlamaConfig, layer_idx: int = 0, qkv_bias: bool = False) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.self_attn = LlamaAttention(config, layer_idx)
        _replace_qkv(self.self_attn, 2 * hidden, bias=qkv_bias)
        self.mlp = LlamaMLP(config)
        self.hidden_norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.input_layernorm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)

    def forward(
        self,
        embeds: torch.Tensor,  # [1, T, h]
        hidden: torch.Tensor,  # [1, T, h]
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        **attn_kwargs: Any,
    ) -> torch.Tensor:
        residual = hidden
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        x, _ = self.self_attn(x, position_embeddings=position_embeddings, **attn_kwargs)
        x = residual + x
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3Head(_DraftHeadBase):
    """EAGLE-3 draft head: fused target layers, own final norm and reduced-vocabulary LM head.

    `config.num_hidden_layers` > 1 stacks plain Llama decoder layers (`extra_layers`, input norm
    included, layer_idx + 1, + 2, ...) after the EAGLE-3 layer: more capacity for a small head at
    one more layer's cost per draft forward. The last layer's output is the fed-back feature."""

    kind = "eagle3"

    def __init__(
        self,
        config: LlamaConfig,
        embedding: nn.Module | None,
        layer_ids: tuple[int, ...],
        target_hidden_size: int | None = None,
        draft_vocab_size: int | None = None,
        fc_bias: bool = False,
        qkv_bias: bool = False,
        layer_idx: int = 0,
    ) -> None:
        """`embedding=None` gives the head its own `embed_tokens` (needed when its hidden size
        differs from the target's); otherwise the target's embedding is shared."""
        super().__init__(config, embedding)  # type: ignore[arg-type]
        hidden = config.hidden_size
        target_hidden = target_hidden_size or hidden
        if len(layer_ids) != 3:
            raise ValueError(f"EAGLE-3 fuses 3 target layers, got layer_ids {layer_ids}")
        if 3 * target_hidden == hidden:
            raise ValueError("fc input and output widths coincide (3 * target_hidden == hidden)")
        self.layer_ids = tuple(layer_ids)
        self.target_hidden_size = target_hidden
        vocab = config.vocab_size
        draft_vocab = draft_vocab_size or vocab
        if embedding is None:
            self.embed_tokens = nn.Embedding(vocab, hidden)
        self.fc = nn.Linear(3 * target_hidden, hidden, bias=fc_bias)
        self.midlayer = Eagle3DecoderLayer(config, layer_idx, qkv_bias=qkv_bias)
        self.extra_layers = nn.ModuleList(
            LlamaDecoderLayer(config, layer_idx + i) for i in range(1, config.num_hidden_layers)
        )
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long))
        self.register_buffer("t2d", torch.arange(vocab) < draft_vocab)
        if draft_vocab < vocab:
            self.t2d.zero_()  # unknown until set_draft_vocab or a checkpoint fills d2t/t2d

    @property
    def feature_size(self) -> int:
        """Width of the target features `forward` takes (3 fused target layers)."""
        return 3 * self.target_hidden_size

    @property
    def vocab_size(self) -> int:
        """Width of `logits`: the draft vocabulary."""
        return self.lm_head.out_features

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if "embed_tokens" in self._modules:
            return self.embed_tokens(input_ids)
        return self._target_embedding(input_ids)

    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """Define the draft vocabulary: draft id d is target id `target_ids[d]` ([draft_vocab])."""
        if target_ids.shape != self.d2t.shape:
            raise ValueError(f"need {self.d2t.shape[0]} target ids, got {tuple(target_ids.shape)}")
        target_ids = target_ids.to(self.d2t.device, torch.long)
        self.d2t.copy_(target_ids - torch.arange(len(target_ids), device=self.d2t.device))
        self.t2d.zero_()
        self.t2d[target_ids] = True

    def draft_to_target(self, ids: torch.Tensor) -> torch.Tensor:
        return ids + self.d2t[ids]

    def target_to_draft(self, ids: torch.Tensor) -> torch.Tensor:
        """Target ids -> draft ids, -1 for tokens outside the draft vocabulary."""
        inverse = torch.full_like(self.t2d, -1, dtype=torch.long)
        draft_ids = torch.arange(len(self.d2t), device=self.d2t.device)
        inverse[draft_ids + self.d2t] = draft_ids
        return inverse[ids]

    def features_from_hidden_states(self, hidden_states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """concat(hidden_states[i] for i in layer_ids) from transformers' `output_hidden_states`."""
        return torch.cat([hidden_states[i] for i in self.layer_ids], dim=-1)

    def fuse(self, target_features: torch.Tensor) -> torch.Tensor:
        """[*, 3 * h_target] fused target layers -> [*, h] (the input `hidden` of a first step)."""
        return self.fc(target_features.to(self.fc.weight.dtype))

    def forward(
        self,
        input_ids: torch.Tensor,  # [1, T] token i+1
        features: torch.Tensor,  # [1, T, 3 * h_target] target features, or [1, T, h] fused/own
        position_ids: torch.Tensor,  # [1, T]
        **attn_kwargs: Any,
    ) -> torch.Tensor:
        """The layer output [1, T, h] (before the final norm): feed it back as `features` for the
        next draft step; `logits` applies the norm. Target features are fused by fc first."""
        dtype = self.fc.weight.dtype
        if features.shape[-1] == self.fc.in_features:
            hidden = self.fuse(features)
        elif features.shape[-1] == self.hidden_size:
            hidden = features.to(dtype)
        else:
            raise ValueError(
                f"features width {features.shape[-1]} is neither {self.fc.in_features} (target "
                f"features) nor {self.hidden_size} (the head's own output)"
            )
        position_embeddings = self._position_embeddings(hidden, position_ids)
        hidden = self.midlayer(
            self.embed(input_ids).to(dtype),
            hidden,
            position_embeddings,
            position_ids=position_ids,
            **attn_kwargs,
        )
        for layer in self.extra_layers:
            hidden = layer(
                hidden,
                position_ids=position_ids,
                position_embeddings=position_embeddings,
                **attn_kwargs,
            )
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[*, h] -> [*, draft_vocab]; map sampled ids with `draft_to_target`."""
        return self.lm_head(self.norm(hidden.to(self.norm.weight.dtype)))


def _replace_qkv(attn: LlamaAttention, in_features: int, bias: bool) -> None:
    """Give q/k/v projections a new input width and bias (o_proj stays bias-free)."""
    for name in ("q_proj", "k_proj", "v_proj"):
        old: nn.Linear = getattr(attn, name)
        setattr(attn, name, nn.Linear(in_features, old.out_features, bias=bias))


# ----------------------------------------------------------------------------------------------
# Checkpoints
# ----------------------------------------------------------------------------------------------


def save_draft_head(head: EagleHead | Eagle3Head, path: str) -> None:
    """Write `path`/config.json (with an "eagle_serve" block) and `path`/model.safetensors."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    config = head.config
    out: dict[str, Any] = {name: getattr(config, name) for name in _CONFIG_FIELDS}
    out["num_hidden_layers"] = head.num_layers
    out["bias"] = head.fc.bias is not None
    attn = head.layers[0].self_attn if isinstance(head, EagleHead) else head.midlayer.self_attn
    out["qkv_bias"] = attn.q_proj.bias is not None
    block: dict[str, Any] = {"version": FORMAT_VERSION, "kind": head.kind}
    if isinstance(head, Eagle3Head):
        out["draft_vocab_size"] = head.vocab_size
        out["target_hidden_size"] = head.target_hidden_size
        block["layer_ids"] = list(head.layer_ids)
        block["feature"] = "residual stream entering each of layer_ids (hidden_states[i])"
    else:
        block["feature"] = "target final-norm output (LM head input)"
    out["eagle_serve"] = block
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(out, f, indent=2)
    tensors = {name: t.detach().contiguous().cpu() for name, t in head.state_dict().items()}
    save_file(tensors, os.path.join(path, "model.safetensors"))


def load_draft_head(
    path: str,
    target_config: Any,
    target_embedding: nn.Module,
    target_lm_head: nn.Module,
    dtype: torch.dtype,
    device: torch.device | str,
    attn_implementation: str = "sdpa",
    layer_idx: int = 0,
) -> EagleHead | Eagle3Head:
    """Load a draft head saved by `save_draft_head` or in SafeAILab's EAGLE-1/2/3 layouts.

    Validates it against the target (hidden size, vocabulary, d2t/t2d, EAGLE-3 layer ids) and
    the weights against the head (missing, unexpected, mis-shaped); raises ModelLoadError naming
    the mismatch. `layer_idx` is the index the head's attention passes to `cache.update`.
    """
    raw = _read_config(path)
    state_dict = _read_weights(path)
    ours = raw.get("eagle_serve")
    kind = _detect_kind(path, ours, state_dict)
    num_layers = raw.get("num_hidden_layers", 1)
    _check(
        isinstance(num_layers, int) and num_layers >= 1,
        path,
        f"draft head num_hidden_layers must be a positive integer, got {num_layers!r}",
    )
    _check(
        num_layers == 1 or kind == "eagle3",
        path,
        f"draft head has {num_layers} decoder layers; EAGLE-1/2 heads have exactly 1",
    )
    config = _llama_config(raw, num_layers, attn_implementation)
    head: EagleHead | Eagle3Head
    if kind == "eagle1":
        head = _build_eagle1(
            path,
            raw,
            config,
            state_dict,
            target_config,
            target_embedding,
            target_lm_head,
            layer_idx,
        )
    else:
        head = _build_eagle3(
            path, raw, config, state_dict, target_config, target_embedding, layer_idx
        )
    _load_checked(path, head, state_dict, target_config)
    if isinstance(head, Eagle3Head):
        _check_vocab_map(path, head)
    return head.to(device=device, dtype=dtype).eval()


def _build_eagle1(
    path: str,
    raw: dict[str, Any],
    config: LlamaConfig,
    state_dict: dict[str, torch.Tensor],
    target_config: Any,
    embedding: nn.Module,
    lm_head: nn.Module,
    layer_idx: int,
) -> EagleHead:
    _check(
        config.hidden_size == target_config.hidden_size,
        path,
        f"draft head hidden_size {config.hidden_size} does not match target hidden_size "
        f"{target_config.hidden_size}",
    )
    _check_vocab_size(path, config, target_config)
    fc_bias = raw["bias"] if "bias" in raw else "fc.bias" in state_dict
    qkv_bias = raw.get("qkv_bias", "layers.0.self_attn.q_proj.bias" in state_dict)
    return EagleHead(
        config,
        embedding,
        lm_head,
        fc_bias=bool(fc_bias),
        qkv_bias=bool(qkv_bias),
        layer_idx=layer_idx,
    )


def _build_eagle3(
    path: str,
    raw: dict[str, Any],
    config: LlamaConfig,
    state_dict: dict[str, torch.Tensor],
    target_config: Any,
    embedding: nn.Module,
    layer_idx: int,
) -> Eagle3Head:
    target_hidden = target_config.hidden_size
    if "target_hidden_size" in raw:
        _check(
            raw["target_hidden_size"] == target_hidden,
            path,
            f"draft head target_hidden_size {raw['target_hidden_size']} does not match "
            f"target hidden_size {target_hidden}",
        )
    else:
        _check(
            config.hidden_size == target_hidden,
            path,
            f"draft head hidden_size {config.hidden_size} does not match target hidden_size "
            f"{target_hidden}",
        )
    _check_vocab_size(path, config, target_config)
    num_layers = target_config.num_hidden_layers
    try:
        layer_ids = _eagle3_layer_ids_from(raw, num_layers)
    except ValueError as e:
        raise ModelLoadError(f"{e} ({path})") from e
    for layer_id in layer_ids:
        _check(
            0 <= layer_id < num_layers,
            path,
            f"EAGLE-3 layer id {layer_id} is outside the target's {num_layers} layers "
            f"(valid: 0..{num_layers - 1})",
        )
    own_embedding = config.hidden_size != target_hidden
    ours = raw.get("eagle_serve") is not None
    fc_bias = raw["bias"] if ours and "bias" in raw else "fc.bias" in state_dict
    qkv_bias = raw.get("qkv_bias", "midlayer.self_attn.q_proj.bias" in state_dict)
    draft_vocab = raw.get("draft_vocab_size") or config.vocab_size
    _check(
        draft_vocab <= config.vocab_size,
        path,
        f"draft head draft_vocab_size {draft_vocab} exceeds vocab_size {config.vocab_size}",
    )
    if draft_vocab == config.vocab_size:  # full vocabulary: the maps are identities if absent
        state_dict.setdefault("d2t", torch.zeros(draft_vocab, dtype=torch.long))
        state_dict.setdefault("t2d", torch.ones(config.vocab_size, dtype=torch.bool))
    return Eagle3Head(
        config,
        None if own_embedding else embedding,
        layer_ids,
        target_hidden_size=target_hidden,
        draft_vocab_size=draft_vocab,
        fc_bias=bool(fc_bias),
        qkv_bias=bool(qkv_bias),
        layer_idx=layer_idx,
    )


def _eagle3_layer_ids_from(raw: dict[str, Any], num_layers: int) -> tuple[int, ...]:
    ours = raw.get("eagle_serve") or {}
    if "layer_ids" in ours:
        return tuple(int(i) for i in ours["layer_ids"])
    aux = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if aux is not None:  # vLLM/SGLang convention: ids of layer OUTPUTS, i.e. inputs of i + 1
        return tuple(int(i) + 1 for i in aux)
    return eagle3_layer_ids(num_layers)


def _llama_config(raw: dict[str, Any], num_layers: int, attn_implementation: str) -> LlamaConfig:
    fields = {
        k: v for k, v in raw.items() if k in _CONFIG_FIELDS or k in ("rope_theta", "rope_scaling")
    }
    if fields.get("head_dim") is None:
        fields.pop("head_dim", None)
    config = LlamaConfig(
        num_hidden_layers=num_layers, attention_bias=False, mlp_bias=False, **fields
    )
    config._attn_implementation = attn_implementation
    return config


def _detect_kind(
    path: str, ours: dict[str, Any] | None, state_dict: dict[str, torch.Tensor]
) -> str:
    if ours is not None:
        version = ours.get("version", 0)
        _check(
            isinstance(version, int) and version <= FORMAT_VERSION,
            path,
            f"draft head format version {version} is newer than this eagle-serve "
            f"understands ({FORMAT_VERSION})",
        )
        kind = ours.get("kind")
        _check(kind in ("eagle1", "eagle3"), path, f"unknown draft head kind {kind!r}")
        return str(kind)
    if any(k.startswith("midlayer.") for k in state_dict):
        return "eagle3"
    if any(k.startswith("layers.") for k in state_dict):
        return "eagle1"
    raise ModelLoadError(
        f"cannot tell the draft head's kind: no midlayer.* (EAGLE-3) or layers.* (EAGLE-1/2) "
        f"weights ({path})"
    )


def _load_checked(
    path: str, head: nn.Module, state_dict: dict[str, torch.Tensor], target_config: Any
) -> None:
    expected = head.state_dict()
    provided = dict(state_dict)
    # SafeAILab checkpoints carry a copy of the target's embedding; the head shares the real one
    if "embed_tokens.weight" in provided and "embed_tokens.weight" not in expected:
        emb = provided.pop("embed_tokens.weight")
        want = (target_config.vocab_size, target_config.hidden_size)
        _check(
            tuple(emb.shape) == want,
            path,
            f"draft head weight embed_tokens.weight has shape {tuple(emb.shape)} but the "
            f"target's embedding is {want}",
        )
    for key in [k for k in provided if k.endswith("rotary_emb.inv_freq")]:
        provided.pop(key)
    missing = sorted(set(expected) - set(provided))
    unexpected = sorted(set(provided) - set(expected))
    _check(not missing, path, f"draft head checkpoint is missing keys: {_names(missing)}")
    _check(not unexpected, path, f"draft head checkpoint has unexpected keys: {_names(unexpected)}")
    for key, tensor in expected.items():
        got = tuple(provided[key].shape)
        _check(
            got == tuple(tensor.shape),
            path,
            f"draft head weight {key} has shape {got} but the head expects {tuple(tensor.shape)}",
        )
    head.load_state_dict(provided, strict=True)


def _check_vocab_size(path: str, config: LlamaConfig, target_config: Any) -> None:
    _check(
        config.vocab_size == target_config.vocab_size,
        path,
        f"draft head vocab_size {config.vocab_size} does not match target vocab_size "
        f"{target_config.vocab_size}",
    )


def _check_vocab_map(path: str, head: Eagle3Head) -> None:
    draft_ids = torch.arange(len(head.d2t))
    target_ids = draft_ids + head.d2t
    vocab = len(head.t2d)
    _check(
        bool(((target_ids >= 0) & (target_ids < vocab)).all()),
        path,
        f"draft head d2t maps draft ids outside the target vocabulary of {vocab}",
    )
    _check(
        len(set(target_ids.tolist())) == len(target_ids),
        path,
        "draft head d2t maps two draft ids to the same target id",
    )
    _check(
        bool(head.t2d[target_ids].all()) and int(head.t2d.sum()) == len(target_ids),
        path,
        "draft head t2d does not mark exactly the target ids that d2t maps to",
    )


def _read_config(path: str) -> dict[str, Any]:
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise ModelLoadError(f"draft head directory {path} has no config.json")
    try:
        with open(config_path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read draft head config {config_path}: {e}") from e


def _read_weights(path: str) -> dict[str, torch.Tensor]:
    safetensors_path = os.path.join(path, "model.safetensors")
    bin_path = os.path.join(path, "pytorch_model.bin")
    try:
        if os.path.isfile(safetensors_path):
            from safetensors.torch import load_file

            return load_file(safetensors_path)
        if os.path.isfile(bin_path):
            return torch.load(bin_path, map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt file, pickle refused by weights_only, ...
        raise ModelLoadError(f"cannot read draft head weights in {path}: {e}") from e
    raise ModelLoadError(
        f"draft head directory {path} has no model.safetensors or pytorch_model.bin"
    )


def _check(ok: bool, path: str, message: str) -> None:
    if not ok:
        raise ModelLoadError(f"{message} ({path})")


def _names(keys: list[str], limit: int = 8) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")
