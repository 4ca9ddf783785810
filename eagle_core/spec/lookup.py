"""Context lookup: draft tokens copied from earlier in the sequence, grafted onto the EAGLE tree.

Text often repeats itself: an answer quotes its prompt (extraction, rewriting, code edits), a list
repeats its own item pattern, a small model loops. Where the sequence's last few tokens occurred
before, the tokens that followed them then are a cheap draft ("prompt lookup decoding"). They
take no draft forward; they only widen the verify forward, and only at steps with a match. The
chain is grafted as one more root path of the head's tree, sharing the nodes the tree already
has (above --spec-max-batch, where the head does not draft, the chain is the whole tree), so
verification (greedy or lossless sampling, spec/verify.py) sees one tree as before and
the output is still exactly the target's.

Written by hand: the index is a dict of n-gram tuples kept per request; no library offers an
incremental "last occurrence of this suffix" lookup over a growing token list.
"""

from __future__ import annotations

from eagle_core.batch import token_range

MIN_NGRAM, MAX_NGRAM = 2, 4
"""Suffix lengths tried, longest first. A 1-token suffix matches at most steps but proposes the
right next token far less often (MT-bench first turns, SmolLM2 answers, T=0: a 1-4 token match
was found at 66% of positions and was right at 48% of those; a 2-4 token match at 36% and 71%)."""


class NgramIndex:
    """For one sequence: where each of its n-grams (MIN_NGRAM..MAX_NGRAM tokens) last ended.

    Built incrementally: each call indexes only the positions added since the last one. The
    sequence's final position is never indexed before it is looked up, so a match is always an
    earlier occurrence."""

    def __init__(self) -> None:
        self.next_pos: dict[tuple[int, ...], int] = {}
        """n-gram -> position of the token that followed its latest occurrence."""
        self.num_indexed = 0
        """n-grams ending at positions < num_indexed are in next_pos."""

    def continuation(self, prompt: list[int], output: list[int], max_tokens: int) -> list[int]:
        """Up to `max_tokens` tokens that followed the latest earlier occurrence of the longest
        matching suffix of prompt + output; empty when no suffix of MIN_NGRAM tokens or more
        occurred. Reads only the tokens it needs (token_range): no copy of a long context."""
        length = len(prompt) + len(output)
        last = length - 1
        if self.num_indexed < last:  # index every position but the last
            first = max(0, self.num_indexed - MAX_NGRAM + 1)
            span = token_range(prompt, output, first, last)  # tokens first .. last - 1
            for end in range(self.num_indexed, last):
                for n in range(MIN_NGRAM, min(MAX_NGRAM, end + 1) + 1):
                    self.next_pos[tuple(span[end - first - n + 1 : end - first + 1])] = end + 1
            self.num_indexed = last
        tail = token_range(prompt, output, max(0, length - MAX_NGRAM), length)
        for n in range(min(MAX_NGRAM, len(tail)), MIN_NGRAM - 1, -1):
            start = self.next_pos.get(tuple(tail[len(tail) - n :]))
            if start is not None:
                return token_range(prompt, output, start, min(start + max_tokens, length))
        return []


class ContextLookup:
    """Per-request n-gram indexes; proposes each speculating sequence's lookup chain."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self.indexes: dict[str, NgramIndex] = {}

    def drop(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.indexes.pop(request_id, None)

    def chain(self, request_id: str, prompt: list[int], output: list[int]) -> list[int]:
        """The lookup draft after prompt + output (the output ends at the root).

        The index only ever grows with the token list, which a preemption keeps, so it stays
        valid for the request's whole life."""
        index = self.indexes.setdefault(request_id, NgramIndex())
        return index.continuation(prompt, output, self.max_tokens)


def chain_path(token_ids: list[int], parents: list[int], chain: list[int]) -> list[int]:
    """The nodes of the longest prefix of `chain` that the tree holds as a path from the root."""
    path, node = [], 0
    for token in chain:
        child = next((c for c in range(1, len(token_ids)) if parents[c] == node and token_ids[c] == token), None)
        if child is None:
            break
        path.append(child)
        node = child
    return path


def graft_chain(
    token_ids: list[int], parents: list[int], chain: list[int], room: int
) -> tuple[list[int], list[int]]:
    """A tree's (token ids, parent indices) with `chain` added as a path from the root (node 0).

    The chain follows existing nodes while their tokens agree, so a chain the head also drafted
    costs nothing; the rest becomes new nodes appended after the tree's (parents still precede
    children), at most `room` of them. The inputs are not modified."""
    path = chain_path(token_ids, parents, chain)
    token_ids, parents = list(token_ids), list(parents)
    node = path[-1] if path else 0
    for token in chain[len(path) : len(path) + room]:
        token_ids.append(token)
        parents.append(node)
        node = len(token_ids) - 1
    return token_ids, parents
