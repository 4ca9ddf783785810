"""Turning logits into tokens: penalties, temperature and filters, seeded draws.

Every random draw goes through the request's own `torch.Generator`, so a seeded request samples
the same tokens alone or inside any batch.

The pipeline for one step, each function vectorised over rows (a row is one position to sample
at: one per plain decoding sequence, or one per node of a speculative draft tree):

    logits = apply_penalties(raw_logits, prompt_ids, output_ids, params)   # [num_rows, vocab]
    logits = hold_back_stop_tokens(logits, num_output, params, stop_ids)     # min_tokens
    probs = processed_probs(logits, params)                                  # [num_rows, vocab]
    token_ids = sample(probs, generators, greedy)                            # num_rows ints
    logprobs = compute_logprobs(raw_logits, token_ids, num_top)              # from RAW logits

`processed_probs` is *the* distribution a request samples from; speculative verification draws
from the same rows, which is what makes it lossless. All math runs in float32.
"""

from __future__ import annotations

import secrets

import torch

from eagle_core.batch import TokenLogprob
from eagle_core.sampling_params import SamplingParams

_SEED_MODULUS = 2**64
"""torch generators take seeds in [0, 2**64); any Python int seed is reduced into that range."""


def sample_from_probs(probs: torch.Tensor, generator: torch.Generator) -> int:
    """Draw one token id from `probs` ([vocab], sums to 1) with the request's generator.

    Exponential race (argmax of p / E, E ~ Exp(1)) instead of torch.multinomial: one pass over
    the vocabulary, no cumulative sum, and exactly distributed as `probs`.
    """
    noise = torch.empty_like(probs, dtype=torch.float32).exponential_(generator=generator)
    return int(torch.argmax(probs.float() / noise).item())


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator:
    """The per-request generator: seeded from `seed` when given, else from the OS entropy pool.

    Unseeded requests still get their own generator (fresh 63-bit seed from `secrets`), so two
    unseeded requests differ and no request shares random state with another.
    """
    generator = torch.Generator(device=device)
    if seed is None:
        generator.manual_seed(secrets.randbits(63))
    else:
        generator.manual_seed(seed % _SEED_MODULUS)
    return generator


# --------------------------------------------------------------------------------------------
# Penalties


def _token_counts(
    ids: list[list[int]], vocab_size: int, device: torch.device
) -> torch.Tensor:  # [num_rows, vocab] float32
    """How often each token occurs in each row's list (padded index tensor + scatter_add)."""
    max_len = max((len(row) for row in ids), default=0)
    counts = torch.zeros(len(ids), vocab_size + 1, dtype=torch.float32, device=device)
    if max_len == 0:
        return counts[:, :vocab_size]
    # Padding points at an extra column (index vocab_size) that is dropped afterwards.
    padded = torch.full((len(ids), max_len), vocab_size, dtype=torch.int64)  # [num_rows, max_len]
    for i, row in enumerate(ids):
        if row:
            padded[i, : len(row)] = torch.as_tensor(row, dtype=torch.int64)
    padded = padded.to(device)
    counts.scatter_add_(1, padded, torch.ones(padded.shape, dtype=torch.float32, device=device))
    return counts[:, :vocab_size]


def apply_penalties(
    logits: torch.Tensor,  # [num_rows, vocab]
    prompt_ids: list[list[int]],
    output_ids: list[list[int]],
    params: list[SamplingParams],
) -> torch.Tensor:  # [num_rows, vocab] float32
    """Presence, frequency and repetition penalties, OpenAI/vLLM semantics; returns a new tensor.

    Row i uses its own histories `prompt_ids[i]` and `output_ids[i]` (a draft-tree node's output
    is the request's output so far plus the path to that node). In this order:
    - repetition (HF/CTRL): for tokens in the prompt OR the output, positive logits are divided
      by `repetition_penalty`, negative ones multiplied by it;
    - frequency: subtract `frequency_penalty * count` of the token in the output;
    - presence: subtract `presence_penalty` once for each token present in the output.
    Rows whose params need no penalty come back unchanged (apart from the float32 cast).
    """
    logits = logits.float()
    rows = [i for i, p in enumerate(params) if p.needs_penalties]
    if not rows:
        return logits
    device = logits.device
    vocab_size = logits.shape[1]
    sel = [params[i] for i in rows]
    row_index = torch.tensor(rows, dtype=torch.int64, device=device)  # [n]
    sub = logits.index_select(0, row_index)  # [n, vocab]

    output_counts = _token_counts([output_ids[i] for i in rows], vocab_size, device)  # [n, vocab]
    output_mask = output_counts > 0  # [n, vocab]

    repetition = torch.tensor([p.repetition_penalty for p in sel], device=device)  # [n]
    if any(p.repetition_penalty != 1.0 for p in sel):
        # Prompts only matter for repetition; skip the rows that do not use it.
        prompts = [
            prompt_ids[i] if p.repetition_penalty != 1.0 else []
            for i, p in zip(rows, sel, strict=True)
        ]
        seen = output_mask | (_token_counts(prompts, vocab_size, device) > 0)  # [n, vocab]
        penalty = repetition.unsqueeze(1)  # [n, 1]
        penalised = torch.where(sub > 0, sub / penalty, sub * penalty)
        sub = torch.where(seen, penalised, sub)

    frequency = torch.tensor([p.frequency_penalty for p in sel], device=device)  # [n]
    presence = torch.tensor([p.presence_penalty for p in sel], device=device)  # [n]
    sub = sub - frequency.unsqueeze(1) * output_counts - presence.unsqueeze(1) * output_mask

    out = logits.clone()
    out.index_copy_(0, row_index, sub)
    return out


def hold_back_stop_tokens(
    logits: torch.Tensor,  # [num_rows, vocab] float32
    num_output: list[int],  # tokens already output before each row's sample
    params: list[SamplingParams],
    stop_token_ids: list[frozenset[int]],  # the tokens that would end each row's request
) -> torch.Tensor:  # [num_rows, vocab] float32
    """min_tokens (vLLM semantics): a row with fewer than min_tokens tokens out cannot end its
    request, so its stop tokens get -inf. Returns a new tensor when any row changes."""
    rows: list[int] = []
    cols: list[int] = []
    vocab_size = logits.shape[1]
    for i, (done, p, stops) in enumerate(zip(num_output, params, stop_token_ids, strict=True)):
        if done < p.min_tokens:
            ids = [t for t in stops if t < vocab_size]
            rows += [i] * len(ids)
            cols += ids
    if not rows:
        return logits
    index = (torch.tensor(rows, device=logits.device), torch.tensor(cols, device=logits.device))
    return logits.index_put(index, torch.tensor(float("-inf"), device=logits.device))


# --------------------------------------------------------------------------------------------
# Temperature and filters


def _uses_filters(p: SamplingParams) -> bool:
    return not p.greedy and (p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0.0)


def _filter_keep_mask(
    scaled: torch.Tensor,  # [n, vocab] temperature-scaled logits
    params: list[SamplingParams],
) -> torch.Tensor:  # [n, vocab] bool, True = token stays
    """Top-k, then top-p on the top-k survivors' renormalised mass, then min-p.

    Works in sorted order (descending, stable: among equal logits the lower id ranks first), so
    top-k keeps exactly k tokens and the top token always survives every filter.
    """
    n, vocab_size = scaled.shape
    device = scaled.device
    sorted_logits, sorted_ids = scaled.sort(dim=1, descending=True, stable=True)  # [n, vocab]
    rank = torch.arange(vocab_size, device=device).unsqueeze(0)  # [1, vocab]

    # min(): a top_k past the vocabulary keeps everything (and may not fit in an int64).
    top_k = torch.tensor(
        [min(p.top_k, vocab_size) if p.top_k > 0 else vocab_size for p in params], device=device
    )  # [n]
    keep = rank < top_k.unsqueeze(1)  # [n, vocab]

    # top_p == 1 disables the filter outright (a cumulative sum may round just above 1).
    top_p = torch.tensor(
        [p.top_p if p.top_p < 1.0 else float("inf") for p in params], device=device
    )  # [n]
    sorted_probs = torch.softmax(sorted_logits.masked_fill(~keep, float("-inf")), dim=1)
    mass_before = torch.cumsum(sorted_probs, dim=1) - sorted_probs  # [n, vocab]
    keep &= mass_before < top_p.unsqueeze(1)

    # p_i >= min_p * p_max, in log space; invariant to renormalisation, and rank 0 is the max.
    min_p = torch.tensor([p.min_p for p in params], device=device)  # [n]
    log_min_p = torch.log(min_p).unsqueeze(1)  # [n, 1]; log(0) = -inf keeps everything
    keep &= sorted_logits - sorted_logits[:, :1] >= log_min_p
    keep[:, 0] = True

    return torch.zeros_like(keep).scatter_(1, sorted_ids, keep)


def processed_probs(
    logits: torch.Tensor,  # [num_rows, vocab], penalties already applied
    params: list[SamplingParams],
) -> torch.Tensor:  # [num_rows, vocab] float32, each row sums to 1
    """The distribution each row actually samples from.

    Greedy rows: one-hot at argmax (ties -> lowest id). Other rows: softmax of logits /
    temperature after top-k, top-p (smallest top set with mass >= top_p; the top token always
    stays) and min-p (drop tokens below min_p * max prob), renormalised. Speculative
    verification samples from exactly these rows.
    """
    logits = logits.float()
    device = logits.device
    temperature = torch.tensor(
        [p.temperature if not p.greedy else 1.0 for p in params], device=device
    )  # [num_rows]
    scaled = logits / temperature.unsqueeze(1)  # [num_rows, vocab]

    filtered_rows = [i for i, p in enumerate(params) if _uses_filters(p)]
    if filtered_rows:
        row_index = torch.tensor(filtered_rows, dtype=torch.int64, device=device)
        sub = scaled.index_select(0, row_index)  # [n, vocab]
        keep = _filter_keep_mask(sub, [params[i] for i in filtered_rows])
        scaled = scaled.index_copy(0, row_index, sub.masked_fill(~keep, float("-inf")))
    probs = torch.softmax(scaled, dim=1)  # [num_rows, vocab]

    greedy_rows = [i for i, p in enumerate(params) if p.greedy]
    if greedy_rows:
        row_index = torch.tensor(greedy_rows, dtype=torch.int64, device=device)
        top = logits.index_select(0, row_index).argmax(dim=1, keepdim=True)  # [g, 1]
        one_hot = torch.zeros(len(greedy_rows), logits.shape[1], device=device)
        one_hot.scatter_(1, top, 1.0)
        probs.index_copy_(0, row_index, one_hot)
    return probs


# --------------------------------------------------------------------------------------------
# Drawing and log-probabilities


def sample(
    probs: torch.Tensor,  # [num_rows, vocab], from processed_probs
    generators: list[torch.Generator | None],
    greedy: list[bool],
) -> list[int]:
    """One token per row. Greedy rows take the argmax and leave their generator untouched
    (it may be None); the others draw with their own generator via `sample_from_probs`, so a
    row's draw depends only on its probabilities and its generator, never on the other rows."""
    argmax = probs.argmax(dim=1).tolist()
    return [
        argmax[i] if greedy[i] else sample_from_probs(probs[i], generators[i])
        for i in range(probs.shape[0])
    ]


def compute_logprobs(
    logits: torch.Tensor,  # [num_rows, vocab], RAW model logits (no penalties, no temperature)
    token_ids: list[int],
    num_top: list[int | None],
) -> list[TokenLogprob | None]:
    """Log-probabilities from the model's raw distribution (vLLM's default).

    Row i gives the log-prob of `token_ids[i]` and its `num_top[i]` most likely alternatives,
    sorted descending; rows with `num_top[i] is None` give None.
    """
    rows = [i for i, k in enumerate(num_top) if k is not None]
    result: list[TokenLogprob | None] = [None] * len(num_top)
    if not rows:
        return result
    device = logits.device
    row_index = torch.tensor(rows, dtype=torch.int64, device=device)
    logprobs = torch.log_softmax(logits.index_select(0, row_index).float(), dim=1)  # [n, vocab]
    chosen = torch.tensor([token_ids[i] for i in rows], dtype=torch.int64, device=device)  # [n]
    chosen_logprobs = logprobs.gather(1, chosen.unsqueeze(1)).squeeze(1).tolist()
    max_top = min(max(num_top[i] for i in rows), logprobs.shape[1])
    top_values, top_ids = logprobs.topk(max_top, dim=1)  # [n, max_top], sorted descending
    top_values, top_ids = top_values.tolist(), top_ids.tolist()
    for j, i in enumerate(rows):
        k = num_top[i]
        top = list(zip(top_ids[j][:k], top_values[j][:k], strict=True))
        result[i] = TokenLogprob(token_id=token_ids[i], logprob=chosen_logprobs[j], top=top)
    return result
