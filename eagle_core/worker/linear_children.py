"""Finding the nn.Linear layers of a module to wrap in place (int8 draft weights, packed weights)."""

from __future__ import annotations

from collections.abc import Iterator

from torch import nn


def linear_children(module: nn.Module, skip: type[nn.Module]) -> Iterator[tuple[nn.Module, str, str, nn.Linear]]:
    """(parent, attribute name, dotted name, linear) for every nn.Linear under `module`, except
    inside modules of type `skip` (wrappers already applied). Collected before yielding, so the
    caller may replace the attributes as it goes."""
    found = []
    for name, parent in module.named_modules():
        if isinstance(parent, skip):
            continue
        for child_name, child in parent.named_children():
            if isinstance(child, nn.Linear):
                found.append((parent, child_name, f"{name}.{child_name}" if name else child_name, child))
    yield from found
