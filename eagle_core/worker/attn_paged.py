"""The fast attention backend: one fixed set of tensors per forward, and sdpa over query tiles.

Every new token belongs to one *tile*: up to Q consecutive new tokens of one sequence, which share
that sequence's keys. A forward's tiles fall into two buckets, each a dense [N, Q] block of tiles
with one key length L:

    narrow: the groups with few new tokens per sequence (decode tokens, verified trees, draft-tree
            levels), one tile per sequence, Q = the widest of them;
    wide:   the groups with many (prefill chunks), cut into tiles of at most TILE tokens.

`_split` chooses which groups go where by the padded work N * (Q + 1) * L of both buckets, so a
prefill chunk never pads the decode tiles to its length. Each layer gathers a bucket's keys and
values out of the paged cache ([N, L] slots) and runs `scaled_dot_product_attention` with the
bucket's visibility mask: torch's fused kernel with GQA, instead of a hand-written reduction.
Since one tile's queries read its keys once, a prefill chunk costs about what contiguous attention
costs. Both buckets always exist, so the forward has one structure and torch.compile builds one
graph (worker/compiled.py); an empty bucket is a dummy of 2 x 2 tiles that nothing reads back.
On the CPU, where the project's operator is built (worker/cpu_kernels.py), both buckets go
through it instead: the narrow bucket's tiles, and the wide bucket's when they are a step's 2 x 2
dummy, are read in place from the cache (no gathered copy, and the dummy costs microseconds, not
an sdpa call per layer); prefill tiles gather + sdpa inside it.

Per-token metadata (the rule of worker/inputs.py) and per-tile metadata:

    kv_pos [T]        KV position the token is stored at (-1: a padding token)
    seq_index [T]     its row of block_tables
    committed [T]     it sees every key position < committed (causal tokens: kv_pos + 1)
    tail_mask [T, W]  and position committed + j where tail_mask[t, j] (trees; all False otherwise)
    block_tables [S, MB]
    per bucket: tokens [N, Q] (the token of each query slot; -1: a padding slot),
                seq [N] (the tile's row of block_tables), key_positions [L] = arange(L)
    out_index [T]     where each token's output lies in the buckets' outputs, concatenated

Shapes are padded so that no dimension is 0 or 1 (`padded_size`): torch.compile specialises
sizes 0 and 1, and padding keeps one compiled graph for every step. With `shape_buckets` (CUDA
graphs, worker/compiled.py) every dynamic dimension is padded further, to a power of two.
Padding tokens write their K/V to the storage's trash slot; padding query slots read token 0's
query and their outputs are dropped. Through the CPU kernel they see no key, which it skips
(a decode tile is one real slot of two); through sdpa they attend like token 0, so that no row
is fully masked (sdpa kernels differ on what such a row yields).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from eagle_core.worker.cpu_kernels import paged_attention_available
from eagle_core.worker.inputs import ForwardBatch, SeqGroup
from eagle_core.worker.kv_storage import write_kv

MIN_DIM = 2
"""Smallest padded size of every dynamic dimension (see the module docstring)."""

WIDE_IN_PLACE_QUERY = 16
"""The wide bucket's tiles go through the in-place kernel only when at most this wide: a step's
2 x 2 dummy, not prefill tiles, where sdpa's blocked products are faster (docs/benchmarks.md,
"Attention that reads the cache in place"). The narrow bucket always does."""

NO_LIMIT = 2**62
"""The narrow bucket's `max_in_place_query`: its tiles always go through the in-place kernel."""

TILE = 64
"""Most query rows of a wide tile. Longer tiles read a chunk's keys fewer times; shorter ones pad
less of a chunk's last tile and of the key range of its first tiles."""


@dataclass
class Tiles:
    """One bucket of query tiles (see the module docstring)."""

    tokens: torch.Tensor  # [N, Q] long: packed-row index of each query slot (-1: padding; derived: 0)
    seq: torch.Tensor  # [N] long: the tile's row of block_tables
    key_positions: torch.Tensor  # [L] long: arange(L)
    # Derived once per forward by `PagedMetadata.derive`:
    key_slots: torch.Tensor | None = None  # [N, L] long
    visible: torch.Tensor | None = None  # [N, 1, Q, L] bool

    def dynamic_tensors(self) -> list[torch.Tensor]:
        return [self.tokens, self.seq, self.key_positions]


@dataclass
class PagedMetadata:
    kv_pos: torch.Tensor  # [T] long
    seq_index: torch.Tensor  # [T] long
    committed: torch.Tensor  # [T] long
    tail_mask: torch.Tensor  # [T, W] bool
    block_tables: torch.Tensor  # [S, MB] long
    narrow: Tiles
    wide: Tiles
    out_index: torch.Tensor  # [T] long: row of each token in cat(narrow outputs, wide outputs)
    block_size: int
    trash_slot: int
    in_place: bool
    """Both buckets attend through the CPU operator (worker/cpu_kernels.py), which reads keys in
    place for the narrow bucket and a dummy wide one, and gathers them for sdpa for prefill tiles."""
    slot_mapping: torch.Tensor | None = None  # [T] long; derived

    def dynamic_tensors(self) -> list[torch.Tensor]:
        return [
            self.kv_pos, self.seq_index, self.committed, self.tail_mask, self.block_tables, self.out_index,
            *self.narrow.dynamic_tensors(), *self.wide.dynamic_tensors(),
        ]  # fmt: skip

    def derive(self) -> PagedMetadata:
        """The per-forward tensors every layer reads: new tokens' slots, tiles' key slots and masks."""
        size = self.block_size
        own_block = self.block_tables[self.seq_index, self.kv_pos.clamp(min=0) // size]  # [T]
        slot_mapping = torch.where(self.kv_pos >= 0, own_block * size + self.kv_pos % size, self.trash_slot)
        return replace(
            self, slot_mapping=slot_mapping, narrow=self._derive_tiles(self.narrow), wide=self._derive_tiles(self.wide)
        )

    def _derive_tiles(self, tiles: Tiles) -> Tiles:
        size = self.block_size
        tokens = tiles.tokens.clamp(min=0)  # [N, Q]
        positions = tiles.key_positions  # [L]
        key_block = (positions // size).clamp(max=self.block_tables.shape[1] - 1)  # [L]
        key_slots = self.block_tables[tiles.seq][:, key_block] * size + positions % size  # [N, L]
        rel = positions - self.committed[tokens][:, :, None]  # [N, Q, L]
        width = self.tail_mask.shape[1]
        in_tail = (rel >= 0) & (rel < width)
        tail = self.tail_mask[tokens].gather(2, rel.clamp(0, width - 1))  # [N, Q, L]
        visible = (rel < 0) | (in_tail & tail)  # [N, Q, L]
        if self.in_place:  # padding slots see no key, so the kernel skips them
            visible = visible & (tiles.tokens >= 0)[:, :, None]
        return replace(tiles, tokens=tokens, key_slots=key_slots, visible=visible[:, None])

    def attend(
        self,
        layer: int,
        query: torch.Tensor,  # [1, heads, T, head_dim]
        key: torch.Tensor,  # [1, kv_heads, T, head_dim]
        value: torch.Tensor,  # [1, kv_heads, T, head_dim]
        kv: torch.Tensor,  # [layers, 2, slots, kv_heads, head_dim]
        scale: float | None,
    ) -> torch.Tensor:  # [1, T, heads, head_dim]
        _, heads, _, head_dim = query.shape
        write_kv(kv, layer, self.slot_mapping, key[0].transpose(0, 1), value[0].transpose(0, 1))
        outputs = []
        for tiles in (self.narrow, self.wide):
            num_tiles, width = tiles.tokens.shape
            if self.in_place:
                q = query[0].transpose(0, 1)[tiles.tokens].float()  # [N, Q, heads, head_dim]
                out = torch.ops.eagle_serve.paged_attention(
                    q, kv[layer, 0], kv[layer, 1], tiles.key_slots, tiles.visible[:, 0],
                    head_dim**-0.5 if scale is None else scale,
                    NO_LIMIT if tiles is self.narrow else WIDE_IN_PLACE_QUERY,
                )  # fmt: skip
                outputs.append(out.reshape(num_tiles * width, heads, head_dim))
                continue
            # float32 whatever the model's dtype, as the reference computes scores and softmax
            q = query[0][:, tiles.tokens].transpose(0, 1).float()  # [N, heads, Q, head_dim]
            k = kv[layer, 0][tiles.key_slots].transpose(1, 2).float()  # [N, kv_heads, L, head_dim]
            v = kv[layer, 1][tiles.key_slots].transpose(1, 2).float()  # [N, kv_heads, L, head_dim]
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=tiles.visible, scale=scale, enable_gqa=heads != k.shape[1]
            )  # [N, heads, Q, head_dim]
            outputs.append(out.transpose(1, 2).reshape(num_tiles * width, heads, head_dim))
        return torch.cat(outputs)[self.out_index][None].to(query.dtype)  # [1, T, heads, head_dim]


def padded_size(size: int, buckets: bool) -> int:
    """A dynamic dimension's size once padded: at least MIN_DIM; with `buckets`, the next power
    of two, so that the steps of a server fall on few distinct shapes."""
    size = max(size, MIN_DIM)
    return 1 << (size - 1).bit_length() if buckets else size


@dataclass
class _TileSpec:
    """One group's tiles on the host: `count` tiles of `width` slots each."""

    tokens: torch.Tensor  # [count, width] long: packed-row index, -1 for padding slots
    seq: torch.Tensor  # [count] long
    key_len: int


def _group_tiles(group: SeqGroup, offset: int, row: int, width: int) -> _TileSpec:
    """`group`'s tokens (packed from `offset`, block-table rows from `row`) as tiles of `width`."""
    batch, num_new = group.shape
    per_row = -(-num_new // width)
    index = torch.arange(per_row * width).view(per_row, width)  # [tiles per row, width]
    tokens = offset + torch.arange(batch)[:, None, None] * num_new + index  # [B, per_row, width]
    tokens = torch.where(index < num_new, tokens, -1).reshape(-1, width)
    seq = (row + torch.arange(batch)).repeat_interleave(per_row)
    return _TileSpec(tokens, seq, group.key_len)


def _widths(groups: list[SeqGroup], threshold: int) -> tuple[int, int]:
    """Tile widths of the narrow bucket (groups with at most `threshold` new tokens per
    sequence: one tile per sequence) and of the wide one (tiles of at most TILE)."""
    narrow = max((g.shape[1] for g in groups if g.shape[1] <= threshold), default=1)
    wide = min(TILE, max((g.shape[1] for g in groups if g.shape[1] > threshold), default=1))
    return narrow, wide


def _split(groups: list[SeqGroup]) -> int:
    """The most new tokens per sequence of a narrow group: every threshold between the groups'
    widths is priced by the padded work N * (Q + 1) * L of the two buckets it makes."""
    best, best_cost = 0, None
    for threshold in sorted({0, *(g.shape[1] for g in groups)}):
        cost = 0
        for narrow, width in zip((True, False), _widths(groups, threshold)):
            chosen = [g for g in groups if (g.shape[1] <= threshold) == narrow]
            if chosen:
                count = sum(g.shape[0] * -(-g.shape[1] // width) for g in chosen)
                cost += count * (width + 1) * max(g.key_len for g in chosen)
        if best_cost is None or cost < best_cost:
            best, best_cost = threshold, cost
    return best


def _bucket(
    specs: list[_TileSpec], width: int, device: torch.device, buckets: bool
) -> tuple[Tiles, torch.Tensor]:
    """Tiles of `specs` padded to at least 2 x 2 tiles and 2 keys (`padded_size`); also the flat
    [N * Q] token index of each slot (-1: padding)."""
    width = padded_size(width, buckets)
    tokens = [F.pad(s.tokens, (0, width - s.tokens.shape[1]), value=-1) for s in specs]
    seq = [s.seq for s in specs]
    count = sum(t.shape[0] for t in tokens)
    num_pad = padded_size(count, buckets) - count
    if num_pad:
        tokens.append(torch.full((num_pad, width), -1, dtype=torch.long))
        seq.append(torch.zeros(num_pad, dtype=torch.long))
    flat = torch.cat(tokens)  # [N, Q]
    key_len = padded_size(max((s.key_len for s in specs), default=0), buckets)
    tiles = Tiles(
        tokens=flat.to(device),
        seq=torch.cat(seq).to(device),
        key_positions=torch.arange(key_len, device=device),
    )
    return tiles, flat.reshape(-1)


class PagedBackend:
    name = "paged"

    def __init__(
        self,
        block_size: int,
        device: torch.device,
        trash_slot: int,
        in_place: bool | None = None,
        shape_buckets: bool = False,
    ):
        """`in_place`: attention runs through the CPU operator that reads narrow tiles in place;
        by default wherever it can (a CPU device and the kernel built, worker/cpu_kernels.py).
        `shape_buckets`: every dynamic dimension is padded to a power of two (`padded_size`)."""
        self.block_size = block_size
        self.device = device
        self.trash_slot = trash_slot
        self.shape_buckets = shape_buckets
        if in_place is None:
            in_place = device.type == "cpu" and paged_attention_available()
        elif in_place and not (device.type == "cpu" and paged_attention_available()):
            raise ValueError("the in-place attention kernel runs on the CPU, where it could be built")
        self.in_place = in_place

    def prepare(self, groups: list[SeqGroup]) -> ForwardBatch:
        """Flat and tiled metadata for `groups`, padded (see the module docstring), on the device.
        Built on the host from host tensors, except the tail masks, which trees bring on the
        device and which stay there (no host sync)."""
        buckets = self.shape_buckets
        device = self.device
        offsets, total, rows = [], 0, 0
        ids, positions, kv_pos, seq_index, committed, tails = [], [], [], [], [], []
        tail_width = max((g.tail_mask.shape[2] for g in groups if g.tail_mask is not None), default=1)
        width = padded_size(tail_width, buckets)
        num_blocks = padded_size(max(g.block_tables.shape[1] for g in groups), buckets)
        threshold = _split(groups)
        narrow_width, wide_width = _widths(groups, threshold)
        narrow, wide = [], []
        for group in groups:
            batch, num_new = group.shape
            offsets.append(total)
            is_narrow = num_new <= threshold
            tiles = _group_tiles(group, total, rows, narrow_width if is_narrow else wide_width)
            (narrow if is_narrow else wide).append(tiles)
            total += batch * num_new
            ids.append(group.token_ids.reshape(-1))
            positions.append(group.rope_positions().reshape(-1))
            stored = group.start_pos[:, None] + torch.arange(num_new)  # [B, Q]
            kv_pos.append(stored.reshape(-1))
            seq_index.append((rows + torch.arange(batch)).repeat_interleave(num_new))
            rows += batch
            if group.tail_mask is None:
                committed.append(stored.reshape(-1) + 1)
                tails.append(torch.zeros(batch * num_new, width, dtype=torch.bool, device=device))
            else:
                committed.append(group.committed_len[:, None].expand(batch, num_new).reshape(-1))
                tail = group.tail_mask.reshape(batch * num_new, -1).to(device)
                tails.append(torch.nn.functional.pad(tail, (0, width - tail.shape[1])))
        num_pad = padded_size(total, buckets) - total
        if num_pad:
            ids.append(torch.zeros(num_pad, dtype=torch.long))
            positions.append(torch.zeros(num_pad, dtype=torch.long))
            kv_pos.append(torch.full((num_pad,), -1, dtype=torch.long))
            seq_index.append(torch.zeros(num_pad, dtype=torch.long))
            committed.append(torch.ones(num_pad, dtype=torch.long))
            tails.append(torch.zeros(num_pad, width, dtype=torch.bool, device=device))
        tables = torch.zeros(padded_size(rows, buckets), num_blocks, dtype=torch.long)
        row = 0
        for group in groups:
            batch, used = group.block_tables.shape
            tables[row : row + batch, :used] = group.block_tables
            row += batch
        narrow_tiles, narrow_slots = _bucket(narrow, narrow_width, device, buckets)
        wide_tiles, wide_slots = _bucket(wide, wide_width, device, buckets)
        slots = torch.cat([narrow_slots, wide_slots])  # [N_narrow * Q_narrow + N_wide * Q_wide]
        real = slots >= 0
        out_index = torch.zeros(total + num_pad, dtype=torch.long)
        out_index[slots[real]] = torch.arange(slots.shape[0])[real]
        meta = PagedMetadata(
            kv_pos=torch.cat(kv_pos).to(device),
            seq_index=torch.cat(seq_index).to(device),
            committed=torch.cat(committed).to(device),
            tail_mask=torch.cat(tails),
            block_tables=tables.to(device),
            narrow=narrow_tiles,
            wide=wide_tiles,
            out_index=out_index.to(device),
            block_size=self.block_size,
            trash_slot=self.trash_slot,
            in_place=self.in_place,
        )
        input_ids = torch.cat([t.to(device) for t in ids])
        return ForwardBatch(input_ids, torch.cat([p.to(device) for p in positions]), meta, offsets, total)
