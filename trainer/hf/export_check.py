"""Every merged export is checked before it is offered.

Rank 0 runs a few held-out rows (:data:`CHECK_ROWS`) through the model the job trained, rebuilt in
float32 on the base as stored (the adapter attached: the reference), and through the merged model
as written (its weights in the export dtype, computed in float32), and takes the largest absolute
logit difference. It must stay within :data:`TOLERANCES` of the export dtype times the reference's
logit scale (``max(1, max |logit|)``): the merge adds rounding only where the delta lands and the
cast rounds each weight once, so a larger difference is a wrong export (a lost delta, a wrong
scaling, a head left out), and the job fails ``export_failed`` before either export is published.
The result goes in ``export/model/halfcast_export.json`` (``check``, served by
``GET /jobs/{id}/exports``) and in the ``end`` record (``export_check``).

The tolerances are loose on purpose: they catch a wrong model, never the rounding of a right one
(measured on a tiny Llama: 4.5e-8 in float32, up to 8.1e-4 in bfloat16 and 9.9e-5 in float16, with
logits under 1; docs/fine-tuning.md).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from halfcast.contracts.records import ExportCheck
from halfcast.contracts.status import FailureReason
from trainer.data.base import Batch
from trainer.errors import TrainerError
from trainer.hf.wrapper import HFModule

#: Held-out rows compared.
CHECK_ROWS = 4
#: Largest max-abs logit difference, relative to ``max(1, max |reference logit|)``, per export dtype.
TOLERANCES = {torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 1e-2}


@torch.no_grad()
def logits_of(model: nn.Module, rows: Batch) -> Tensor:
    """``model``'s (an :class:`HFModule`) float32 logits on ``rows``, in eval mode."""
    return model.eval()(rows.inputs, rows.attention_mask).float()


def check_merged(merged: nn.Module, causal: bool, rows: Batch, reference: Tensor) -> ExportCheck:
    """Compare ``merged`` (the Hugging Face model as written, in its export dtype) with ``reference``.

    Raises :class:`TrainerError` (``export_failed``) over the tolerance. ``merged`` is left in float32.
    """
    dtype = next(merged.parameters()).dtype
    candidate = logits_of(HFModule(merged.float(), causal=causal, adapter=False), rows)
    difference = (candidate - reference).abs().max().item()
    scale = max(1.0, reference.abs().max().item())
    tolerance = TOLERANCES.get(dtype, TOLERANCES[torch.float32]) * scale
    check = ExportCheck(
        rows=int(rows.inputs.shape[0]),
        dtype=str(dtype).removeprefix("torch."),
        max_logit_difference=difference,
        tolerance=tolerance,
    )
    if not difference <= tolerance:  # a NaN difference fails too
        msg = (
            f"the merged export's logits differ from the trained model's by {difference:.3g} on "
            f"{check.rows} held-out rows (tolerance {tolerance:.3g} in {check.dtype}): not published"
        )
        raise TrainerError(FailureReason.EXPORT_FAILED, msg)
    return check
