"""KV block accounting (pure Python; the tensors live in worker/kv_storage.py).

KV memory is a pool of fixed-size blocks. A sequence owns a list of block ids (its block
table); token at position p lives in block `table[p // block_size]`, offset `p % block_size`.
The scheduler asks this class whether a sequence can grow and frees blocks when a sequence
finishes or is preempted. Block 0 .. num_blocks-1 are all usable.

Prefix caching (`caching=True`): a full block whose KV is computed can be registered under a
content key, `block_hashes`' hash chained over the token ids of that block and every block
before it, so equal keys mean equal token prefixes and hence equal KV. A new sequence whose
leading blocks' keys are registered shares those blocks (reference counts) instead of
computing them. A block nobody references any more keeps its content and key in an LRU pool
and is reused on a hit, or handed out for new content (oldest first) only when no never-keyed
free block is left. Partial blocks are never keyed, and a keyed block is never written again
(its sequences write only past their computed tokens, which lie in later blocks).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict


def blocks_needed(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def block_hashes(token_ids: list[int], block_size: int, parent: bytes = b"") -> list[bytes]:
    """The content keys of the full blocks of `token_ids`, which follow the block keyed `parent`
    (b"": they start the sequence). Each key hashes its parent's key and its own token ids."""
    keys = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        digest = hashlib.blake2b(parent, digest_size=16)
        digest.update(array("q", token_ids[start : start + block_size]).tobytes())
        parent = digest.digest()
        keys.append(parent)
    return keys


def salt_key(salt: str | None) -> bytes:
    """The parent key of a sequence's first block (block_hashes): b"" without a salt, else a
    digest of the salt, so salted sequences share blocks only with the same salt."""
    return b"" if salt is None else hashlib.blake2b(salt.encode(), digest_size=16, person=b"cache_salt").digest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, caching: bool = False):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        # LIFO free list of blocks without a key: recently freed (cache-warm) blocks are reused first.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        # Keyed blocks nobody references, least recently freed first: evicted in this order.
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._refs = [0] * num_blocks
        self._key_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}
        self.num_evictions = 0
        """Keyed blocks handed out for new content (their keys dropped)."""

    @property
    def num_free_blocks(self) -> int:
        """Blocks a sequence can be given: never-keyed free blocks and unreferenced keyed ones."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks holding a registered key (referenced or not)."""
        return len(self._key_of)

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by some sequence, 0..1 (cached unreferenced ones are free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    # ---- prefix cache ----------------------------------------------------------------------

    def match(self, keys: list[bytes]) -> list[int]:
        """The blocks registered under the longest leading run of `keys` (none without caching)."""
        hits: list[int] = []
        if self.caching:
            for key in keys:
                block = self._block_of.get(key)
                if block is None:
                    break
                hits.append(block)
        return hits

    def num_free_after(self, hits: list[int]) -> int:
        """num_free_blocks once `hits` are referenced (those of them now free leave the pool)."""
        return self.num_free_blocks - sum(1 for block in hits if self._refs[block] == 0)

    def share(self, block_table: list[int], hits: list[int]) -> None:
        """Append `hits` (from `match`, the table's first blocks) to the empty `block_table`,
        referencing each."""
        assert not block_table, "a sequence shares cached blocks only as its first blocks"
        for block in hits:
            if self._refs[block] == 0:
                del self._evictable[block]
            self._refs[block] += 1
            block_table.append(block)

    def register(self, block_table: list[int], keys: list[bytes], start: int, stop: int) -> None:
        """Key the table's blocks start .. stop - 1, whose KV is now computed, by `keys`. A key
        already held by another block (the same content computed twice) leaves this block
        unkeyed: the first stays the one that hits."""
        if not self.caching:
            return
        for i in range(start, stop):
            block, key = block_table[i], keys[i]
            if key not in self._block_of and block not in self._key_of:
                self._block_of[key] = block
                self._key_of[block] = key

    # ---- allocation ----------------------------------------------------------------------

    def num_missing_blocks(self, block_table: list[int], num_tokens: int) -> int:
        """Blocks to add so that `block_table` covers `num_tokens` tokens."""
        return max(0, blocks_needed(num_tokens, self.block_size) - len(block_table))

    def can_grow(self, block_table: list[int], num_tokens: int) -> bool:
        return self.num_missing_blocks(block_table, num_tokens) <= self.num_free_blocks

    def grow(self, block_table: list[int], num_tokens: int) -> None:
        """Extend `block_table` in place to cover `num_tokens` tokens. Caller checked can_grow."""
        missing = self.num_missing_blocks(block_table, num_tokens)
        if missing > self.num_free_blocks:
            raise RuntimeError("out of KV blocks; call can_grow first")
        for _ in range(missing):
            if self._free:
                block = self._free.pop()
            else:
                block, _ = self._evictable.popitem(last=False)
                del self._block_of[self._key_of.pop(block)]
                self.num_evictions += 1
            self._refs[block] = 1
            block_table.append(block)

    def free(self, block_table: list[int]) -> None:
        """Drop `block_table`'s reference to each of its blocks and empty the table. A block left
        unreferenced returns to the pool; a keyed one stays findable until it is handed out again,
        the table's last blocks first (they are the least likely to be shared)."""
        for block in reversed(block_table):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if block in self._key_of:
                    self._evictable[block] = None
                else:
                    self._free.append(block)
        block_table.clear()
