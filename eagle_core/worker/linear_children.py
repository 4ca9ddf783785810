"""Finding the nn.Linear layers of a module to wrap in place (int8 draft weights, packed weights,
block linears), and the base of the wrappers that keep the linear they wrap."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn


class LinearWrapper(nn.Module):
    """A module computing what `linear` does, another way. `weight` and `bias` are the wrapped
    linear's, for code that reads them (a tied LM head's weight is the embedding's)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.linear = linear

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.linear.bias


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
