"""The optional observers of a precision step: they watch at defined points and never decide.

:meth:`trainer.numerics.precision.PrecisionPolicy.step` calls them at two points:

1. **before unscaling**, :class:`UnderflowObserver`: the accumulated gradients, still
   multiplied by the loss scale, as the low-precision backward left them
   (:class:`trainer.numerics.underflow.UnderflowSampler`: the fraction of values fp16 cannot hold);
2. **at the cross-rank agreement**, :class:`ForensicsObserver`: evidence that rides in the
   step's one MAX ``all_reduce`` and comes back agreed over the ranks
   (:class:`trainer.numerics.forensics.OverflowForensics`: the kind of every parameter's gradient).

An observer changes no gradient and no decision: a step without observers skips, clips,
steps and scales exactly as one with them, only its :class:`trainer.numerics.step_outcome.StepOutcome`
lacks their findings (``underflow_fraction`` NaN, ``param_evidence`` empty). Both observe on
the device and read nothing on the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor


@dataclass(frozen=True, slots=True)
class Gradients:
    """The gradients of one step (a dataclass, not a named tuple: its ``count`` would shadow ``tuple.count``).

    ``tensors``: the gradients that exist, in model order; ``present``: their indices among the
    ``count`` trainable parameters, or ``None`` when every parameter has one.
    """

    tensors: list[Tensor]
    present: list[int] | None
    count: int

    @classmethod
    def of(cls, parameters: Sequence[Tensor]) -> Gradients:
        """The gradients of ``parameters`` (those whose ``.grad`` is ``None`` are left out)."""
        every = [p.grad for p in parameters]
        if all(g is not None for g in every):
            return cls(every, None, len(every))  # type: ignore[arg-type]
        present = [i for i, g in enumerate(every) if g is not None]
        return cls([every[i] for i in present], present, len(every))  # type: ignore[misc]


class UnderflowObserver(Protocol):
    """Looks at the scaled gradients before they are unscaled."""

    def before_unscale(self, step: int | None, grads: Sequence[Tensor]) -> Tensor | None:
        """A 0-d float32 finding for attempted step ``step`` (1-based; ``None``: unnumbered), or ``None``
        when it did not look.

        Every rank must decide alike: a finding may take a collective.
        """
        ...


class ForensicsObserver(Protocol):
    """Adds evidence to the step's cross-rank agreement."""

    def evidence(self, values: Tensor, grads: Gradients) -> Tensor:
        """float32 ``[E]`` (``E`` the same on every rank) to max-reduce with the ranks' verdicts (several
        ranks), or to keep as the step's evidence (one process).

        ``values``: float32 ``[len(grads.tensors)]``, per existing gradient on this rank, its kind (0 finite,
        1 infinite, 2 NaN) when several ranks agree, or its norm from one process (whose NaN or
        infinity is the kind: the host tells it, :mod:`trainer.run.telemetry`).
        """
        ...


@dataclass(frozen=True)
class StepObservers:
    """What a precision step is watched by; ``None`` leaves that point unwatched."""

    underflow: UnderflowObserver | None = None
    forensics: ForensicsObserver | None = None


#: A step watched by nothing.
NO_OBSERVERS = StepObservers()
