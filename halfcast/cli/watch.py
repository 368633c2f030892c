"""The live view of ``halfcast watch``: turns a job's events into terminal lines.

On a terminal (TTY) one line is redrawn in place by rich's live display
(:class:`LiveOutput`): a progress bar with ETA, the current loss, loss scale (not for a
job whose precision scales nothing: fp32, bf16, fp8), skipped steps and throughput,
fitted to the terminal's width (lower-priority fields are shortened, then dropped:
:func:`fit`), so it never wraps and a redraw never leaves a line behind; status changes, the start-up
phase (``job j: running (loading data)``) and the
evaluation get lines of their own above it. Elsewhere (a pipe, a log file) every step
and every status change is printed as a plain, whole line (:class:`PlainOutput`), so
the output is greppable.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol, TextIO

from rich.console import Console
from rich.live import Live
from rich.text import Text

from halfcast.client import JobEvent
from halfcast.contracts.events import Rewind
from halfcast.contracts.records import EvalRecord, StepRecord
from halfcast.contracts.resources import JobPublic
from halfcast.contracts.status import TERMINAL_STATUSES

#: Width of the progress bar, in characters (and of its short form, on narrow terminals).
BAR_WIDTH, SHORT_BAR_WIDTH = 24, 10
#: Step records over which the step rate (for the ETA) is measured.
RATE_WINDOW = 50


def format_duration(seconds: float | None) -> str:
    """``1h02m``, ``3m05s``, ``42s``; ``?`` when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def format_number(value: float | None, digits: int = 4) -> str:
    """A compact number (``-`` for none): ``0.1234``, ``1.2e-05``, ``65536``."""
    if value is None:
        return "-"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.{digits}g}"


def format_scale(scale: float | None) -> str:
    """A loss scale with its power of two when it is one: ``65536 (2^16)``."""
    if scale is None or scale <= 0:
        return format_number(scale)
    exponent = math.log2(scale)
    power = f" (2^{int(exponent)})" if exponent.is_integer() else ""
    return f"{format_number(scale)}{power}"


def progress_bar(step: int, total: int, width: int = BAR_WIDTH) -> str:
    """``[#########.......]`` for ``step`` of ``total``."""
    filled = 0 if total <= 0 else min(width, round(width * step / total))
    return "[" + "#" * filled + "." * (width - filled) + "]"


# ----------------------------------------------------------------------------- fitting a line


@dataclass(frozen=True)
class Part:
    """One field of a line: its ``forms``, longest first, and how soon it goes when the line is too long.

    Every part is shortened (a higher ``priority`` first) before any is dropped; then a higher
    ``priority`` is dropped before a lower one, and ``priority`` 0 never. ``sep`` joins it to the part before.
    """

    forms: tuple[str, ...]
    priority: int
    sep: str = " | "


def _join(parts: Sequence[Part], forms: Sequence[str | None]) -> str:
    """The line of ``parts`` in ``forms`` (``None``: the part is left out)."""
    shown = [(part, form) for part, form in zip(parts, forms, strict=True) if form is not None]
    return "".join((part.sep if number else "") + form for number, (part, form) in enumerate(shown))


def _reductions(parts: Sequence[Part]) -> Iterator[list[str | None]]:
    """The forms of ``parts``: in full, then ever shorter: every part's next shorter form in turn (the least
    important part's first), round after round, then without the least important part, then without the next
    one... A short form loses a digit or a word; a dropped part loses the field."""
    forms: list[str | None] = [part.forms[0] for part in parts]
    yield list(forms)
    order = sorted(range(len(parts)), key=lambda i: parts[i].priority, reverse=True)
    for level in range(1, max((len(part.forms) for part in parts), default=1)):
        for index in order:
            if level < len(parts[index].forms):
                forms[index] = parts[index].forms[level]
                yield list(forms)
    for index in order:
        if parts[index].priority > 0:
            forms[index] = None
            yield list(forms)


def fit(parts: Sequence[Part], width: int | None) -> str:
    """The fullest line of ``parts`` at most ``width`` characters long (cut at ``width`` if even the shortest is not).

    ``width`` ``None``: every part in full.
    """
    line = ""
    for forms in _reductions(parts):
        line = _join(parts, forms)
        if width is None or len(line) <= width:
            return line
    return line[: max(width or 0, 0)]


def format_rate(value: float | None) -> str:
    """A rate in at most 5 characters: ``987``, ``9.88k``, ``1.23M`` (``-`` for none)."""
    if value is None or not math.isfinite(value):
        return format_number(value)
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{suffix}"
    return f"{value:.3g}"


def _scale_forms(scale: float | None) -> tuple[str, ...]:
    """``scale 65536 (2^16)``, ``scale 65536``, ``scale 2^16`` (a power of two's shortest), ``scale 6.55e+04``..."""
    forms = [f"scale {format_scale(scale)}", f"scale {format_number(scale)}"]
    if scale is not None and scale > 0 and math.log2(scale).is_integer():
        forms.append(f"scale 2^{int(math.log2(scale))}")
    else:
        forms.append(f"scale {format_number(scale, 3)}")
    return tuple(dict.fromkeys(forms))


def _samples_forms(record: StepRecord) -> tuple[str, ...]:
    """``55182 samples/s``, then ``55.2k samples/s``."""
    rate = record.samples_per_second
    return tuple(dict.fromkeys([f"{format_number(rate, 5)} samples/s", f"{format_rate(rate)} samples/s"]))


def _tokens_forms(record: StepRecord) -> tuple[str, ...]:
    """``1.2346e+06 tok/s``, then ``1.23M tok/s`` (joined to the samples with a space)."""
    rate = record.tokens_per_second
    return tuple(dict.fromkeys([f"{format_number(rate, 5)} tok/s", f"{format_rate(rate)} tok/s"]))


# ----------------------------------------------------------------------------- the view


@dataclass
class WatchView:
    """State of one watched job; :meth:`apply` takes each event, :meth:`progress_line` draws the latest step.

    ``scales_loss``: show the loss scale (the resource's ``loss_scaling`` is not ``none``).
    """

    job_id: str
    max_steps: int
    status: str = "?"
    scales_loss: bool = True
    phase: str | None = None
    latest: StepRecord | None = None
    _times: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=RATE_WINDOW))

    def eta_s(self) -> float | None:
        """Seconds to ``max_steps`` at the step rate of the last records; ``None`` until two records."""
        if len(self._times) < 2 or self.latest is None:
            return None
        (first_step, first_time), (last_step, last_time) = self._times[0], self._times[-1]
        if last_step <= first_step or last_time <= first_time:
            return None
        rate = (last_step - first_step) / (last_time - first_time)
        return (self.max_steps - last_step) / rate

    def progress_parts(self) -> list[Part]:
        """The fields of the progress line, in display order, with their short forms and priorities.

        Every field is shortened before any is dropped, and the fields the README promises (progress, loss,
        loss scale, skipped steps, samples/s) go after the overflow's detail, tokens/s, the ETA and the bar: at 80
        columns they all fit; at 40, progress, loss, scale and skipped steps.
        """
        record = self.latest or StepRecord(step=0)
        step, scale, skipped = record.step, record.loss_scale, record.skipped_steps or 0
        overflow = [Part(("OVERFLOW",), 1), Part((_overflow_where(record),), 9, "")] if record.overflow else []
        return [
            Part((progress_bar(step, self.max_steps), progress_bar(step, self.max_steps, SHORT_BAR_WIDTH)), 4, ""),
            Part((f"{step}/{self.max_steps}",), 0, " "),
            Part((f"ETA {format_duration(self.eta_s())}",), 5, " "),
            Part((f"loss {format_number(record.loss)}", f"loss {format_number(record.loss, 3)}"), 1),
            *([Part(_scale_forms(scale), 2)] if self.scales_loss else []),
            Part((f"skipped {skipped}", f"skip {skipped}"), 2),
            Part(_samples_forms(record), 3),
            *([Part(_tokens_forms(record), 6, " ")] if record.tokens_per_second is not None else []),
            *overflow,
        ]

    def progress_line(self, width: int | None = None) -> str:
        """The one-line summary of the latest step, fitted to ``width`` characters (``None``: in full)."""
        return fit(self.progress_parts(), width)

    def apply(self, event: JobEvent) -> list[str]:
        """Take ``event``; return the lines of their own it adds (status and phase changes, evaluations, rewinds)."""
        data = event.data
        if isinstance(data, StepRecord):
            self.latest = data
            if data.time is not None:
                self._times.append((data.step, data.time))
            return []
        if isinstance(data, JobPublic):
            return self._status_lines(data)
        if isinstance(data, EvalRecord):
            return [f"eval at step {data.step}: {_eval_text(data)}"]
        if isinstance(data, Rewind):
            self._times.clear()
            return [f"resumed from the checkpoint at step {data.step}"]
        return []

    def _status_lines(self, job: JobPublic) -> list[str]:
        status, phase = str(job.status), job.phase
        if (status, phase) == (self.status, self.phase):
            return []
        self.status, self.phase = status, phase
        self.max_steps = job.max_steps or self.max_steps
        # An older server does not send loss_scaling: show the scale, as it did.
        self.scales_loss = "loss_scaling" not in job.model_fields_set or job.loss_scaling != "none"
        text = f"job {self.job_id}: {status}" + (f" ({phase})" if phase else "")
        if job.error is not None:
            text += f" ({job.error.reason}: {job.error.message.splitlines()[0] if job.error.message else ''})"
        return [text]


# ----------------------------------------------------------------------------- output


class WatchOutput(Protocol):
    """Where :func:`watch_output` shows a view: after each event, its own lines and the progress."""

    def show(self, view: WatchView, event: JobEvent, lines: list[str]) -> None:
        """Show ``lines`` (what ``view.apply(event)`` returned) and, after a step, the progress."""


class PlainOutput:
    """Not a terminal: every line of its own and every step's whole progress line, one plain line each."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def show(self, view: WatchView, event: JobEvent, lines: list[str]) -> None:
        """Write ``lines`` and, after a step, the progress line in full; flush."""
        lines = [*lines, view.progress_line()] if event.event == "step" else lines
        self.out.writelines(line + "\n" for line in lines)
        self.out.flush()


class LiveOutput:
    """A terminal: rich's live display redraws the progress line, fitted to the terminal's width at each
    redraw; lines of their own are printed above it. :meth:`close` leaves the last progress line in place."""

    def __init__(self, out: TextIO) -> None:
        self.console = Console(file=out, highlight=False, emoji=False, markup=False)
        self.live: Live | None = None

    def show(self, view: WatchView, event: JobEvent, lines: list[str]) -> None:
        """Print ``lines`` above the live line, then redraw it (once there is a step to show); a terminal
        status ends the live display first, so its line comes last."""
        if event.event == "status" and view.status in TERMINAL_STATUSES:
            self.close()
        for line in lines:
            self.console.print(Text(line))
        if view.latest is None or view.status in TERMINAL_STATUSES:
            return
        text = Text(view.progress_line(self.console.width), no_wrap=True, overflow="ellipsis")
        if self.live is None:
            self.live = Live(
                text, console=self.console, auto_refresh=False, redirect_stdout=False, redirect_stderr=False
            )
            self.live.start()
        self.live.update(text, refresh=True)

    def close(self) -> None:
        """End the live display (its last line stays, followed by a newline)."""
        if self.live is not None:
            self.live.stop()
            self.live = None


@contextmanager
def watch_output(out: TextIO) -> Iterator[WatchOutput]:
    """:class:`LiveOutput` on a terminal, else :class:`PlainOutput`; a live display is ended on exit."""
    if not out.isatty():
        yield PlainOutput(out)
        return
    live = LiveOutput(out)
    try:
        yield live
    finally:
        live.close()


def _eval_text(record: EvalRecord) -> str:
    """``loss 0.5, accuracy 0.9``: the metrics of an evaluation record, as the API sent them."""
    parts = [
        f"{key} {format_number(value)}"
        for key, value in record.model_dump(exclude_unset=True).items()
        if key not in ("step", "time", "type")
    ]
    return ", ".join(parts)


def _overflow_where(record: StepRecord) -> str:
    """`` in fc1.weight (nan) +2 more on rank 1`` from a step record's overflow forensics; '' without them."""
    params = record.nonfinite_params or []
    if not params:
        return ""
    text = f" in {params[0]['name']} ({params[0]['kind']})"
    more = (record.nonfinite_param_count or len(params)) - 1
    text += f" +{more} more" if more > 0 else ""
    ranks = record.overflow_ranks or []
    return text + (f" on rank {','.join(map(str, ranks))}" if ranks else "")
