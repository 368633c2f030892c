"""The live view of ``halfcast watch``: turns a job's events into terminal lines.

On a terminal (TTY) one line is redrawn in place: a progress bar with ETA, the
current loss, loss scale (not for a job whose precision scales nothing: fp32, bf16,
fp8), skipped steps and throughput; status changes and the
evaluation get lines of their own. Elsewhere (a pipe, a log file) every step and
every status change is printed as a plain line, so the output is greppable.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, TextIO

from server.client import Event

#: Width of the progress bar, in characters.
BAR_WIDTH = 24
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


@dataclass
class WatchView:
    """State of one watched job; :meth:`lines` turns each event into what to print.

    ``scales_loss``: show the loss scale (the resource's ``loss_scaling`` is not ``none``).
    """

    job_id: str
    max_steps: int
    tty: bool
    status: str = "?"
    scales_loss: bool = True
    latest: dict[str, Any] | None = None
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

    def progress_line(self) -> str:
        """The one-line summary of the latest step."""
        record = self.latest or {}
        step = int(record.get("step", 0))
        throughput = f"{format_number(record.get('samples_per_second'), 5)} samples/s"
        if record.get("tokens_per_second") is not None:
            throughput += f" {format_number(record['tokens_per_second'], 5)} tok/s"
        overflow = f" OVERFLOW{_overflow_where(record)}" if record.get("overflow") else ""
        return (
            f"{progress_bar(step, self.max_steps)} {step}/{self.max_steps} ETA {format_duration(self.eta_s())}"
            f" | loss {format_number(record.get('loss'))}{self._scale_column(record)}"
            f" | skipped {record.get('skipped_steps', 0)} | {throughput}{overflow}"
        )

    def _scale_column(self, record: dict[str, Any]) -> str:
        """`` | scale 65536 (2^16)``; nothing for a job that does no loss scaling (its scale is always 1)."""
        return f" | scale {format_scale(record.get('loss_scale'))}" if self.scales_loss else ""

    def lines(self, event: Event) -> list[str]:
        """What to print for ``event``: whole lines (non-TTY) or, on a TTY, ``"\\r"``-prefixed redraws."""
        if event.event == "step":
            self.latest = event.data
            self._times.append((int(event.data["step"]), float(event.data["time"])))
            return ["\r" + self.progress_line() + "\x1b[K"] if self.tty else [self.progress_line()]
        if event.event == "status":
            return self._status_lines(event.data)
        if event.event == "eval":
            return [self._own_line(f"eval at step {event.data.get('step')}: {_eval_text(event.data)}")]
        if event.event == "rewind":
            self._times.clear()
            return [self._own_line(f"resumed from the checkpoint at step {event.data.get('step')}")]
        return []

    def _status_lines(self, job: dict[str, Any]) -> list[str]:
        status = str(job.get("status"))
        if status == self.status:
            return []
        self.status = status
        self.max_steps = int(job.get("max_steps") or self.max_steps)
        self.scales_loss = job.get("loss_scaling", "dynamic") != "none"
        text = f"job {self.job_id}: {status}"
        if job.get("error"):
            text += f" ({job['error']['reason']}: {job['error']['message'].splitlines()[0] if job['error']['message'] else ''})"
        return [self._own_line(text)]

    def _own_line(self, text: str) -> str:
        """A line that must not be overwritten: on a TTY it replaces the progress line, which is redrawn below it."""
        if not self.tty:
            return text
        redraw = "\r" + self.progress_line() + "\x1b[K" if self.latest else ""
        return "\r\x1b[K" + text + "\n" + redraw


def _eval_text(record: dict[str, Any]) -> str:
    parts = [f"{key} {format_number(value)}" for key, value in record.items() if key not in ("step", "time", "type")]
    return ", ".join(parts)


def write(out: TextIO, lines: list[str], tty: bool) -> None:
    """Write ``lines`` (newline-terminated unless they are TTY redraws) and flush."""
    out.writelines(line if tty else line + "\n" for line in lines)
    out.flush()


def _overflow_where(record: dict[str, Any]) -> str:
    """`` in fc1.weight (nan) +2 more on rank 1`` from a step record's overflow forensics; '' without them."""
    params = record.get("nonfinite_params") or []
    if not params:
        return ""
    text = f" in {params[0]['name']} ({params[0]['kind']})"
    more = int(record.get("nonfinite_param_count") or len(params)) - 1
    text += f" +{more} more" if more > 0 else ""
    ranks = record.get("overflow_ranks") or []
    return text + (f" on rank {','.join(map(str, ranks))}" if ranks else "")
