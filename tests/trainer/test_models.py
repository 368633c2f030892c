"""Model registry: sizes from the dataset, the MLP's layers, the GPT's shapes and causality."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from halfcast.contracts.catalog import GPTModel, MLPModel
from trainer.data import DataInfo, Task
from trainer.errors import TrainerError
from trainer.models import build_model
from trainer.models.gpt import GPT

DIGITS_INFO = DataInfo(task=Task.CLASSIFICATION, num_outputs=10, in_features=64)
TEXT_INFO = DataInfo(task=Task.LM, num_outputs=256, seq_len=16)


def test_mlp_sizes_come_from_the_dataset() -> None:
    model = build_model(MLPModel(name="mlp", config={"hidden_sizes": [32, 16]}), DIGITS_INFO)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(64, 32), (32, 16), (16, 10)]
    out = model(torch.rand(5, 64))
    assert out.shape == (5, 10) and out.dtype == torch.float32


def test_mlp_without_hidden_layers_is_one_linear() -> None:
    info = DataInfo(task=Task.REGRESSION, num_outputs=1, in_features=8)
    model = build_model(MLPModel(name="mlp", config={"hidden_sizes": []}), info)
    modules = list(model.children())
    assert len(modules) == 1 and isinstance(modules[0], nn.Linear)
    assert (modules[0].in_features, modules[0].out_features) == (8, 1)


def test_mlp_needs_feature_data() -> None:
    with pytest.raises(TrainerError) as info:
        build_model(MLPModel(name="mlp"), TEXT_INFO)
    assert info.value.reason == "spec_invalid"


def test_gpt_shapes_and_tied_head() -> None:
    torch.manual_seed(0)
    model = build_model(GPTModel(name="gpt", config={"n_layer": 1, "n_head": 2, "d_model": 16}), TEXT_INFO)
    assert isinstance(model, GPT)
    assert model.head.weight is model.token_embedding.weight
    logits = model(torch.randint(0, 256, (3, 16)))
    assert logits.shape == (3, 16, 256) and logits.dtype == torch.float32


def test_gpt_untied_head_is_a_separate_parameter() -> None:
    model = GPT(vocab_size=32, context=8, n_layer=1, n_head=2, d_model=16, tie_weights=False)
    assert model.head.weight is not model.token_embedding.weight


def test_gpt_is_causal() -> None:
    """Changing the token at position t changes no logits before t."""
    torch.manual_seed(0)
    model = GPT(vocab_size=32, context=8, n_layer=2, n_head=2, d_model=16).eval()
    tokens = torch.randint(0, 32, (1, 8))
    changed = tokens.clone()
    changed[0, 5] = (tokens[0, 5] + 1) % 32
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert torch.equal(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_gpt_rejects_bad_shapes() -> None:
    with pytest.raises(ValidationError, match="divisible by n_head"):
        GPTModel(name="gpt", config={"n_head": 3, "d_model": 16})
    model = GPT(vocab_size=32, context=4, n_layer=1, n_head=2, d_model=16)
    with pytest.raises(ValueError, match="exceeds the context"):
        model(torch.zeros(1, 5, dtype=torch.int64))


def test_gpt_under_bf16_autocast() -> None:
    model = GPT(vocab_size=32, context=8, n_layer=1, n_head=2, d_model=16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(torch.randint(0, 32, (2, 8)))
    assert logits.dtype == torch.bfloat16
    assert next(model.parameters()).dtype == torch.float32
