"""EAGLE speculative decoding: the pure parts the worker's drafting loop is built from.

- `tree`: EAGLE-2 dynamic draft trees (frontier expansion, global top-N selection, masks).
- `verify`: greedy and lossless sampling verification of a tree against the target's outputs.
- `draft_head`: the EAGLE-1/2 and EAGLE-3 draft heads, their checkpoint loading and saving.

Import the submodules directly; this package imports nothing so that `tree` and `verify` stay
cheap to import (the draft heads pull in transformers).
"""
