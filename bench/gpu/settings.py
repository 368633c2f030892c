"""What one run of the GPU checks measures: models, precisions, paths, sizes and step counts (typed)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

#: Dense bf16 peak of an H100/H200 SXM, FLOP/s (NVIDIA datasheet, without sparsity).
H100_BF16_PEAK = 989e12


class ModelKind(StrEnum):
    """The two models checked: the GPT-style decoder and a Hugging Face Llama with a LoRA adapter."""

    GPT = "gpt"
    HF_LORA = "hf-lora"


class PathKind(StrEnum):
    """Who runs the step: Halfcast's trainer step, or a plain PyTorch loop on the same model and batches."""

    HALFCAST = "halfcast"
    HAND = "hand"


class CheckPrecision(StrEnum):
    """The precisions checked (fp8: torchao on compute capability >= 8.9)."""

    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GptSize(_Frozen):
    """The GPT-style model (:class:`trainer.models.gpt.GPT`, byte-level vocabulary of 256)."""

    n_layer: int = Field(12, ge=1)
    n_head: int = Field(12, ge=1)
    d_model: int = Field(768, ge=8)
    seq_len: int = Field(1024, ge=2)
    batch: int = Field(16, ge=1)


class LlamaSize(_Frozen):
    """The random-init Llama (byte-level vocabulary of 256) and its LoRA adapter on every Linear but the head."""

    hidden_size: int = Field(1024, ge=8)
    intermediate_size: int = Field(2816, ge=8)
    num_layers: int = Field(16, ge=1)
    num_heads: int = Field(16, ge=1)
    seq_len: int = Field(1024, ge=2)
    batch: int = Field(8, ge=1)
    lora_r: int = Field(16, ge=1)
    lora_alpha: int = Field(32, ge=1)


class StepCounts(_Frozen):
    """Warm-up steps (untimed, unchecked), steady steps (checked and timed), Halfcast's log interval."""

    warmup: int = Field(10, ge=1)
    steps: int = Field(40, ge=1)
    log_interval: int = Field(10, ge=1)


class CheckSettings(_Frozen):
    """One run: what to check, at which sizes, on which device kind (``dry_run``: tiny, on the CPU)."""

    models: tuple[ModelKind, ...] = (ModelKind.GPT, ModelKind.HF_LORA)
    precisions: tuple[CheckPrecision, ...] = (CheckPrecision.FP16, CheckPrecision.BF16, CheckPrecision.FP8)
    paths: tuple[PathKind, ...] = (PathKind.HALFCAST, PathKind.HAND)
    gpt: GptSize = GptSize()
    llama: LlamaSize = LlamaSize()
    counts: StepCounts = StepCounts()
    implementation: str = "fused"
    max_bytes: int = Field(8 << 20, ge=1024)
    peak_flops: float = Field(H100_BF16_PEAK, gt=0)
    dry_run: bool = False
    ddp: bool = True
    #: Both paths compiled (Halfcast ``compile: true``, the hand loop ``torch.compile(model)``); fp8 rows are skipped.
    compile: bool = False

    def size_of(self, model: ModelKind) -> GptSize | LlamaSize:
        """The size block of ``model``."""
        return self.gpt if model is ModelKind.GPT else self.llama


#: ``--dry-run``: everything tiny, one steady step (a smoke test of the script, no numbers worth reading).
DRY_RUN = {
    "gpt": GptSize(n_layer=1, n_head=2, d_model=32, seq_len=16, batch=2),
    "llama": LlamaSize(
        hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, seq_len=16, batch=2, lora_r=4, lora_alpha=8
    ),
    "counts": StepCounts(warmup=2, steps=1, log_interval=1),
    "max_bytes": 20_000,
}
#: ``--quick``: the full sizes with fewer steps (about half the time of the default on one H100/H200).
QUICK_COUNTS = StepCounts(warmup=5, steps=15, log_interval=5)
