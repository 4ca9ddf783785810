"""Turning logits into tokens: penalties, temperature and filters, seeded draws.

Randomness is counter-based: the uniform behind the token at output position p of a request is a
hash of (the request's key, p) (`position_uniforms`). The key is the request's seed, or a random
one for unseeded requests. So a seeded request samples the same tokens alone or inside any batch,
with or without speculation (a draft-tree node at depth d below a request with n output tokens
uses position n + d, the position its token would have in plain decoding), after preemption, and
without any generator state: draws need no host round trip and batch over rows.

The pipeline for one step, each function vectorised over rows (a row is one position to sample
at: one per plain decoding sequence, or one per node of a speculative draft tree):

    logits = apply_logit_bias(raw_logits, params)                            # [num_rows, vocab]
    logits = apply_penalties(logits, prompt_ids, output_ids, params)
    held = hold_back_stop_tokens(logits, num_output, params, stop_ids)       # min_tokens
    held = apply_grammar(held, logits, allowed)                              # structured outputs
    probs = processed_probs(held, params)                                    # [num_rows, vocab]
    token_ids = draw(probs, keys, positions, greedy)                         # [num_rows]
    logprobs = compute_logprobs(raw_logits, token_ids, num_top)              # from RAW logits

`processed_probs` is *the* distribution a request samples from; speculative verification draws
from the same rows, which is what makes it lossless. All math runs in float32.
"""

from __future__ import annotations

import secrets

import torch

from eagle_core.batch import TokenLogprob
from eagle_core.sampling_params import SamplingParams

_KEY_MODULUS = 2**63
"""Request keys are int64 >= 0; any Python int seed is reduced into that range."""
_MASK32 = 0xFFFFFFFF


def inverse_cdf(
    probs: torch.Tensor,  # [R, V], rows sum to ~1 (need not be normalised exactly)
    uniforms: torch.Tensor,  # [R] in [0, 1)
) -> torch.Tensor:  # [R] long
    """Row r's token: the first index whose cumulative probability exceeds uniforms[r] times
    the row's total. Exactly distributed as the row (up to float32 rounding of the sums), never
    a zero-probability token, and sync-free: no value leaves the device."""
    cdf = probs.float().cumsum(dim=1)  # [R, V]
    total = cdf[:, -1:]  # [R, 1]
    # strictly below the total, so the search always lands on a token with probability > 0
    target = torch.minimum(uniforms.float()[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True)[:, 0]


def request_key(seed: int | None) -> int:
    """The key of a request's random draws: its seed (any int, reduced into [0, 2**63)), or a
    fresh 63-bit key from the OS entropy pool, so two unseeded requests never share draws."""
    return secrets.randbits(63) if seed is None else seed % _KEY_MODULUS


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """(x * constant) mod 2**32 for int64 x in [0, 2**32), without int64 overflow."""
    low = x * (constant & 0xFFFF)
    high = ((x * (constant >> 16)) & 0xFFFF) << 16
    return (low + high) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (Chris Wellons' lowbias32) on int64 tensors holding uint32 values."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def position_uniforms(
    keys: torch.Tensor,  # [R] int64 request keys (>= 0)
    positions: torch.Tensor,  # [R] int64 output positions (>= 0)
) -> torch.Tensor:  # [R] float32 in [0, 1)
    """The uniform behind the token at each (request key, output position): a pure function of
    the two, computed on their device. Hand-written because torch's generators are stateful:
    their draws depend on how many came before, which speculation and batching would change."""
    keys, positions = keys.long(), positions.long()
    x = _mix32((keys & _MASK32) ^ _mix32((keys >> 32) & _MASK32))
    x = _mix32(x ^ (positions & _MASK32))
    x = _mix32(x ^ 0x9E3779B9)
    return (x >> 8).float() * 2.0**-24


def sample_from_probs(probs: torch.Tensor, key: int, position: int) -> int:
    """The token drawn from `probs` ([vocab], sums to 1) at output `position` of the request
    with `key`: `inverse_cdf` of that position's uniform."""
    device = probs.device
    uniform = position_uniforms(torch.tensor([key], device=device), torch.tensor([position], device=device))
    return int(inverse_cdf(probs[None], uniform)[0])


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


def apply_logit_bias(
    logits: torch.Tensor,  # [num_rows, vocab] float32
    params: list[SamplingParams],
) -> torch.Tensor:  # [num_rows, vocab] float32
    """Each row's `logit_bias` added to its logits (a new tensor when any row has one). Token
    ids are checked against the vocabulary when the request is added."""
    entries = [(row, token, value) for row, p in enumerate(params) for token, value in p.logit_bias]
    if not entries:
        return logits
    rows, tokens, values = zip(*entries)
    device = logits.device
    index = (torch.tensor(rows, device=device), torch.tensor(tokens, device=device))
    return logits.index_put(index, torch.tensor(values, dtype=logits.dtype, device=device), accumulate=True)


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


def apply_grammar(
    held: torch.Tensor,  # [num_rows, vocab] float32, after hold_back_stop_tokens
    before: torch.Tensor,  # [num_rows, vocab] float32, the same rows before it
    allowed: torch.Tensor,  # [num_rows, vocab] bool, what each row's grammar allows
) -> torch.Tensor:  # [num_rows, vocab] float32
    """Disallowed tokens get -inf. A row left with no token (its grammar allows only a stop
    token that min_tokens holds back) takes the grammar's mask over `before`: the grammar
    wins, so the request ends complete rather than on a token the grammar forbids."""
    masked = held.masked_fill(~allowed, float("-inf"))
    stuck = torch.isneginf(masked).all(dim=1, keepdim=True)  # [num_rows, 1]
    return torch.where(stuck, before.masked_fill(~allowed, float("-inf")), masked)


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
    temperatures = [p.temperature if not p.greedy else 1.0 for p in params]
    scaled = logits  # [num_rows, vocab]
    if any(t != 1.0 for t in temperatures):  # x / 1.0 is x: at the default temperature, no pass
        scaled = logits / torch.tensor(temperatures, device=device).unsqueeze(1)

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


def draw(
    probs: torch.Tensor,  # [num_rows, vocab], from processed_probs
    keys: torch.Tensor,  # [num_rows] int64 request keys
    positions: torch.Tensor,  # [num_rows] int64 output positions
    greedy: list[bool],
) -> torch.Tensor:  # [num_rows] long, on the device
    """One token per row, without a host sync. Greedy rows take the argmax; the others the
    `inverse_cdf` of their `position_uniforms`, so a row's draw depends only on its
    probabilities, its request's key and its output position, never on the other rows."""
    device = probs.device
    sampled = [i for i, g in enumerate(greedy) if not g]
    if len(sampled) == len(greedy):  # every row samples: no argmax, no copy of the rows
        return inverse_cdf(probs, position_uniforms(keys.to(device), positions.to(device)))
    tokens = probs.argmax(dim=1)  # [num_rows]
    if sampled:
        index = torch.tensor(sampled, device=device)
        uniforms = position_uniforms(keys.to(device)[index], positions.to(device)[index])
        tokens = tokens.index_copy(0, index, inverse_cdf(probs.index_select(0, index), uniforms))
    return tokens


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
