"""The model types a registered model may name are Transformers architectures with a head an ``hf`` job trains."""

from __future__ import annotations

from trainer.hf.model_types import REGISTRY_MODEL_TYPES


def test_every_registry_model_type_has_a_causal_lm_or_classification_head() -> None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    )

    heads = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) | set(MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES)
    assert sorted(REGISTRY_MODEL_TYPES - set(CONFIG_MAPPING_NAMES)) == []
    assert sorted(REGISTRY_MODEL_TYPES - heads) == []
