"""Tiny random-weight models (with a real tokenizer) for tests that must run in seconds on a CPU.

`make_tiny_model_dir(arch, path)` writes a complete Hugging Face directory: config, fp32
safetensors, and a byte-level BPE tokenizer with a ChatML chat template, so the same code path
that loads a real model (eagle_core.worker.loader) loads these.

The weights are drawn with a large init (std 0.2 instead of 0.02): with the usual init a random
model's logits are nearly uniform, greedy decoding would hinge on near-ties that a different
(but correct) kernel order could flip, and tests comparing two decoders would be flaky.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

TINY_ARCHS = ("llama", "qwen2", "mistral", "qwen3")

# "<|endoftext|>" doubles as pad and unk: transformers loads a qwen2 directory with its own
# Qwen2Tokenizer whatever tokenizer_config says, and that class appends "<|endoftext|>" as unk
# when the vocab lacks it, which would leave the tokenizer one id larger than the embedding.
PAD, BOS, IM_START, IM_END = "<|endoftext|>", "<|bos|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, BOS, IM_START, IM_END]  # ids 0..3, in this order
TINY_VOCAB_SIZE = 512

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Shared by every arch; what differs between families is what a serving engine must handle.
_COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # GQA: 2 query heads per KV head
    max_position_embeddings=512,
    initializer_range=0.2,
    rms_norm_eps=1e-6,
)
_ARCH_OVERRIDES = {
    "llama": dict(tie_word_embeddings=True),  # like SmolLM2
    "qwen2": dict(tie_word_embeddings=False),  # q/k/v projections carry biases
    "mistral": dict(tie_word_embeddings=False, sliding_window=None),  # full attention
    "qwen3": dict(tie_word_embeddings=True, head_dim=16),  # per-head q/k RMSNorm
}

_CORPUS = """\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
Once upon a time, in a small village by the sea, there lived an old fisherman and his clever daughter.
Every morning she walked to the market, counted the coins, and wrote the numbers in a little book.
Question: What is the capital of France? Answer: The capital of France is Paris.
Question: How many days are in a week? Answer: There are seven days in a week.
Please summarize the following paragraph in one sentence, then list three key points.
Speculative decoding drafts several tokens cheaply and verifies them with one forward pass of the
target model; accepted tokens are kept, and the first rejected one is replaced by a sample.
def fibonacci(n: int) -> int:
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)

for i in range(10):
    print(f"{i}: {fibonacci(i)}")

class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        return self.items.pop()

import json, os
data = {"name": "eagle", "tokens": [1, 2, 3], "ok": True, "ratio": 0.75}
with open(os.path.join("out", "data.json"), "w") as fh:
    json.dump(data, fh, indent=2)
SELECT id, name FROM users WHERE age >= 18 ORDER BY name;
<div class="note">Hello, <b>world</b>!</div>
x = [a * b for a, b in zip(xs, ys) if a != b]  # elementwise products
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14159 -7 1e-3 50% $19.99
Punctuation: ( ) [ ] { } < > ; : , . ! ? ' " ` ~ @ # ^ & * - + = / \\ | _
User: Can you help me write a poem about autumn leaves?
Assistant: Of course! Golden leaves drift slowly down, painting paths in red and brown.
User: Thanks, that is lovely. Now translate "good morning" into Spanish and German.
Assistant: "Buenos días" in Spanish and "Guten Morgen" in German.
Unicode: café naïve résumé Straße 東京 こんにちは Привет 🙂 👍
"""


def make_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (vocab TINY_VOCAB_SIZE) trained in-process: any string round-trips."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        # All 256 byte symbols up front, so bytes absent from the corpus still encode.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_CORPUS.splitlines(keepends=True) * 4, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=IM_END,
        pad_token=PAD,
        unk_token=PAD,  # byte-level BPE never needs it; declared so no loader invents one
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,  # else decode() rewrites " ," to "," and breaks round trips
    )


def tiny_config(arch: str, tokenizer: PreTrainedTokenizerFast, **overrides):
    if arch not in _ARCH_OVERRIDES:
        raise ValueError(f"unknown tiny arch {arch!r}; choose from {TINY_ARCHS}")
    return AutoConfig.for_model(
        arch,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **{**_COMMON, **_ARCH_OVERRIDES[arch], **overrides},
    )


def make_tiny_model_dir(arch: str, path: Path, seed: int = 0, **overrides) -> Path:
    """Write a tiny random-weight `arch` model (fp32) plus tokenizer into `path`; returns `path`.
    `overrides` change config fields (widths, heads, init)."""
    tokenizer = make_tiny_tokenizer()
    config = tiny_config(arch, tokenizer, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
