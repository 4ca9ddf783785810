"""KV block accounting (pure Python; the tensors live in worker/kv_storage.py).

KV memory is a pool of fixed-size blocks. A sequence owns a list of block ids (its block
table); token at position p lives in block `table[p // block_size]`, offset `p % block_size`.
The scheduler asks this class whether a sequence can grow and frees blocks when a sequence
finishes or is preempted. Block 0 .. num_blocks-1 are all usable.
"""

from __future__ import annotations


def blocks_needed(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # LIFO free list: recently freed (cache-warm) blocks are reused first.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0..1."""
        return 1.0 - len(self._free) / self.num_blocks

    def num_missing_blocks(self, block_table: list[int], num_tokens: int) -> int:
        """Blocks to add so that `block_table` covers `num_tokens` tokens."""
        return max(0, blocks_needed(num_tokens, self.block_size) - len(block_table))

    def can_grow(self, block_table: list[int], num_tokens: int) -> bool:
        return self.num_missing_blocks(block_table, num_tokens) <= len(self._free)

    def grow(self, block_table: list[int], num_tokens: int) -> None:
        """Extend `block_table` in place to cover `num_tokens` tokens. Caller checked can_grow."""
        missing = self.num_missing_blocks(block_table, num_tokens)
        if missing > len(self._free):
            raise RuntimeError("out of KV blocks; call can_grow first")
        for _ in range(missing):
            block_table.append(self._free.pop())

    def free(self, block_table: list[int]) -> None:
        """Return every block of `block_table` to the pool and empty the table."""
        self._free.extend(reversed(block_table))
        block_table.clear()
