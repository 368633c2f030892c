"""Multi-layer perceptron for feature data."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh}


def build_mlp(
    in_features: int,
    out_features: int,
    hidden_sizes: Sequence[int],
    activation: str = "relu",
    dropout: float = 0.0,
) -> nn.Sequential:
    """``Linear -> activation [-> Dropout]`` per hidden size, then a final ``Linear``.

    Maps float ``[B, in_features]`` to ``[B, out_features]`` (logits or regression
    outputs). With no hidden sizes the model is the single ``Linear(in, out)``.
    Layers use PyTorch's default initialisation. Raises ``KeyError`` for an unknown
    activation.
    """
    layers: list[nn.Module] = []
    width = in_features
    for hidden in hidden_sizes:
        layers += [nn.Linear(width, hidden), ACTIVATIONS[activation]()]
        if dropout > 0.0:
            layers.append(nn.Dropout(dropout))
        width = hidden
    layers.append(nn.Linear(width, out_features))
    return nn.Sequential(*layers)
