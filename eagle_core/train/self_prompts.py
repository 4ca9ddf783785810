"""The "self" prompt style: user requests written by the target model itself (stage a).

Why: heads trained on template-made prompts accept far less on MT-bench than on held-out prompts
of their own templates (tau 1.95 vs 2.65 with the third head): open chat is wider than any word
list. An instruction-tuned model has learned what its users ask, so we let it write the user turn:
the chat template up to the start of a user message (system prompt included, nothing after
"user") is given as a raw prompt and the model samples a request until its end-of-turn token, as
in Magpie (Xu et al., 2024, "Magpie: Alignment Data Synthesis from Scratch by Prompting Aligned
LLMs with Nothing"). Small models also ramble or drift into other languages, so requests that hit
the length cap, are too short, repeat an earlier one, are mostly non-ASCII or share a long word
run with an evaluation question (MT-bench; decontamination) are dropped.
"""

from __future__ import annotations

import logging
import re

from eagle_core.train.prompts import ID_BASE

logger = logging.getLogger(__name__)

_SENTINEL = "\x00REQUEST\x00"


def pre_query_ids(tokenizer) -> list[int]:
    """Token ids of the chat template up to where a user message's text would start."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": _SENTINEL}], tokenize=False, add_generation_prompt=False
    )
    prefix = text[: text.index(_SENTINEL)]
    return list(tokenizer(prefix, add_special_tokens=False).input_ids)


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    words = _words(text)
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def keep_request(text: str, num_tokens: int, finish_reason: str | None, min_tokens: int) -> bool:
    """A finished, not-too-short request that is mostly ASCII (the model's strong language)."""
    if finish_reason != "stop" or num_tokens < min_tokens or not text.strip():
        return False
    return sum(c.isascii() for c in text) >= 0.95 * len(text)


def make_self_prompts(llm, num_prompts: int, seed: int, temperature: float, max_tokens: int,
                      min_tokens: int = 8, avoid: list[str] = (), avoid_ngram: int = 8,
                      batch: int = 256, existing: list[str] = ()) -> list[dict]:
    """Sample requests from `llm` (an eagle_core.LLM) until `num_prompts` pass the filters.

    Request i is sampled with seed (seed, i), so a rerun with the same settings reproduces the set.
    `avoid`: texts (evaluation questions) no kept request may share an `avoid_ngram`-word run with.
    `existing`: requests of an earlier set that this one extends. New requests must differ from
    them, take ids after them, and are sampled from index 20 * len(existing) + batch on, past
    every index the earlier set can have used (sampling stops before that, see below).
    """
    from eagle_core import SamplingParams

    prefix = pre_query_ids(llm.engine.tokenizer)
    banned = set().union(*(ngrams(t, avoid_ngram) for t in avoid)) if avoid else set()
    out: list[dict] = []
    seen: set[str] = set(existing)
    dropped = {"filtered": 0, "duplicate": 0, "evaluation overlap": 0}
    first = 20 * len(existing) + batch if existing else 0
    sampled = first
    while len(out) < num_prompts:
        if sampled - first > 20 * num_prompts:  # so every index used is < first + 20 * num_prompts + batch
            raise RuntimeError(
                f"only {len(out)} of {num_prompts} self-written requests passed the filters "
                f"after {sampled - first} samples ({dropped}); is this a chat-tuned model?"
            )
        params = [
            SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed * 1_000_003 + sampled + i)
            for i in range(batch)
        ]
        outs = llm.generate([prefix] * batch, params, use_tqdm=True)
        sampled += batch
        for o in outs:
            text = o.text.strip()
            if not keep_request(text, len(o.token_ids), o.finish_reason, min_tokens):
                dropped["filtered"] += 1
            elif text in seen:
                dropped["duplicate"] += 1
            elif banned and ngrams(text, avoid_ngram) & banned:
                dropped["evaluation overlap"] += 1
            else:
                seen.add(text)
                out.append({"id": ID_BASE["self"] + len(existing) + len(out), "category": "self", "prompt": text})
            if len(out) == num_prompts:
                break
        logger.info("self prompts: %d kept of %d sampled (dropped: %s)", len(out), sampled - first, dropped)
    return out
