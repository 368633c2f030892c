"""Job commands talking to a running API: ``submit``, ``list``, ``status``, ``watch``, ``cancel``.

The API is ``--url``, else ``HALFCAST_URL``, else ``http://127.0.0.1:8000``; the token
``--token``, else ``HALFCAST_TOKEN``, else ``<data dir>/token`` (:mod:`halfcast.cli.credentials`). Errors
are one line each on stderr: an unreachable server (exit 3), a spec or argument the
server rejects (exit 2, one ``error: <field path>: <message>`` line per field, as
argparse's usage errors), anything else, an unknown job among them (exit 1). ``watch``
exits 0 when the job succeeds and 1 when it fails or is cancelled.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import BaseModel

from halfcast.cli.credentials import resolve_token, token_path
from halfcast.cli.spec_limits import SpecTooLarge, check_expansion, read_spec_text
from halfcast.cli.watch import WatchView, format_duration, format_number, format_scale, watch_output
from halfcast.client import (
    DEFAULT_URL,
    HalfcastClient,
    HalfcastError,
    ServerUnavailable,
    Unauthorized,
    ValidationFailed,
)
from halfcast.contracts.records import HELD_OUT_MINIMUM, DataReport, StartupTimes, StepRecord
from halfcast.contracts.resources import JobPublic

#: Exit statuses.
EXIT_ERROR, EXIT_INVALID, EXIT_UNAVAILABLE = 1, 2, 3

Handler = Callable[[argparse.Namespace], int]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``submit``, ``list``, ``status``, ``watch`` and ``cancel``."""
    submit = add_api_command(subparsers, "submit", "submit a job spec (YAML or JSON file; - reads stdin)", run_submit)
    submit.add_argument("spec", help="SPEC.yaml, SPEC.yml, SPEC.json, or - for stdin")
    submit.add_argument("--idempotency-key", help="makes a retried submit return the same job")
    submit.add_argument("-w", "--watch", action="store_true", help="watch the job after submitting it")
    submit.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="print only the job id (for scripts: JOB=$(halfcast submit -q spec.yaml))",
    )
    listing = add_api_command(subparsers, "list", "list jobs, newest first", run_list)
    listing.add_argument("--status", help="only jobs in this status")
    listing.add_argument("--limit", type=int, default=20, help="at most this many jobs (default 20)")
    listing.add_argument("--json", action="store_true", help="print the job resources as JSON")
    status = add_api_command(subparsers, "status", "show one job", run_status)
    status.add_argument("job_id")
    status.add_argument("--json", action="store_true", help="print the job resource as JSON")
    watch = add_api_command(subparsers, "watch", "follow a job live until it ends", run_watch)
    watch.add_argument("job_id")
    cancel = add_api_command(subparsers, "cancel", "cancel a job", run_cancel)
    cancel.add_argument("job_id")


def add_api_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help_text: str, handler: Handler
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(name, help=help_text)
    parser.add_argument("--url", default=None, help=f"the Halfcast API (HALFCAST_URL, default {DEFAULT_URL})")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per request (default 10)")
    parser.add_argument("--token", default=None, help="API token (HALFCAST_TOKEN, else <data dir>/token)")
    parser.set_defaults(handler=_reporting_errors(handler))
    return parser


def _reporting_errors(handler: Handler) -> Handler:
    """Turn the client's typed errors into one-line messages on stderr and an exit status."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except ValidationFailed as exc:
            for error in exc.errors:
                sys.stderr.write(f"error: {error.path}: {error.msg}\n")
            return EXIT_INVALID
        except ServerUnavailable as exc:
            sys.stderr.write(f"error: {exc}\n")
            return EXIT_UNAVAILABLE
        except Unauthorized as exc:
            sys.stderr.write(f"error: {exc}{_token_hint(args)}\n")
            return EXIT_ERROR
        except (HalfcastError, SpecFileError) as exc:
            sys.stderr.write(f"error: {exc}\n")
            return EXIT_ERROR
        except KeyboardInterrupt:
            sys.stderr.write("\ninterrupted\n")
            return 130

    return run


def _token_hint(args: argparse.Namespace) -> str:
    """Where the CLI looked for a token, when it found none (it sent the request without one)."""
    if resolve_token(getattr(args, "token", None)) is not None:
        return ""
    return f" (no token found: pass --token, set HALFCAST_TOKEN, or keep it in {token_path()})"


def client_for(args: argparse.Namespace) -> HalfcastClient:
    """A client of ``--url``, ``HALFCAST_URL`` or the default URL, with the token of :func:`resolve_token`."""
    url = args.url or os.environ.get("HALFCAST_URL") or DEFAULT_URL
    return HalfcastClient(url, timeout=args.timeout, token=resolve_token(getattr(args, "token", None)))


class SpecFileError(ValueError):
    """The spec file cannot be read or is not a YAML/JSON mapping."""


def load_spec(source: str) -> dict[str, object]:
    """The spec in ``source`` (a path, or ``-`` for stdin): JSON for ``.json``, else YAML (``yaml.safe_load``).

    Bounded by :mod:`halfcast.cli.spec_limits` (file size, alias expansion, nesting depth).
    """
    import yaml  # only ``submit`` reads a spec

    try:
        text = read_spec_text(source)
    except OSError as exc:
        raise SpecFileError(f"cannot read {source}: {exc.strerror or exc}") from exc
    except ValueError as exc:  # too large, or not UTF-8
        raise SpecFileError(str(exc) if isinstance(exc, SpecTooLarge) else f"{source} is not UTF-8 text") from exc
    try:
        spec = json.loads(text) if source.endswith(".json") else yaml.safe_load(text)
        check_expansion(spec, source)
    except SpecTooLarge as exc:
        raise SpecFileError(str(exc)) from exc
    except RecursionError as exc:
        raise SpecFileError(f"{source} is nested too deeply") from exc
    except (ValueError, yaml.YAMLError) as exc:
        raise SpecFileError(
            f"{source} is not valid {'JSON' if source.endswith('.json') else 'YAML'}: {' '.join(str(exc).split())}"
        ) from exc
    if not isinstance(spec, dict):
        raise SpecFileError(f"{source} must hold a mapping of spec fields, not {type(spec).__name__}")
    return spec


# ----------------------------------------------------------------------------- commands


def run_submit(args: argparse.Namespace) -> int:
    """POST the spec; print the new job's id and status, or only its id with ``--quiet`` (then ``--watch`` it)."""
    spec = load_spec(args.spec)
    with client_for(args) as client:
        job = client.submit(spec, idempotency_key=args.idempotency_key)
        sys.stdout.write(f"{job.id}\n" if args.quiet else f"submitted job {job.id} ({job.status})\n")
        sys.stdout.flush()
        return watch_job(client, job.id) if args.watch else 0


def run_list(args: argparse.Namespace) -> int:
    """A table of jobs, newest first."""
    with client_for(args) as client:
        jobs = client.list(status=args.status, limit=args.limit)
    if args.json:
        sys.stdout.write(json.dumps([job.model_dump(mode="json") for job in jobs], indent=2) + "\n")
        return 0
    header = ("ID", "STATUS", "STEP", "LOSS", "SCALE", "SKIPPED", "EVAL", "DURATION", "CREATED", "NAME")
    rows: list[tuple[str, ...]] = [header]
    for job in jobs:
        latest = job.latest
        skipped = latest.skipped_steps if latest is not None else None
        rows.append(
            (
                job.id,
                job.status,
                f"{job.step}/{job.max_steps}",
                format_number(latest.loss if latest else None),
                _scale_cell(job, format_number),
                "-" if skipped is None else str(skipped),
                eval_cell(job),
                duration_text(job),
                job.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                job.name or "",
            )
        )
    write_table(rows)
    return 0


def eval_cell(job: JobPublic) -> str:
    """The latest evaluation's headline metric, one word: ``acc=0.912``, ``ppl=12.3`` or ``loss=0.5``; ``-`` if none."""
    record = job.eval
    if record is None:
        return "-"
    for label, value in (("acc", record.accuracy), ("ppl", record.perplexity), ("loss", record.loss)):
        if value is not None:
            return f"{label}={format_number(value, 3)}"
    return "-"


def duration_text(job: JobPublic, now: datetime | None = None) -> str:
    """How long the job has run: from its start to its finish (or to ``now`` while it runs); ``-`` before it starts."""
    if job.started_at is None:
        return "-"
    end = job.finished_at or now or datetime.now(UTC)
    return format_duration((end - job.started_at).total_seconds())


def _sent(job: JobPublic, field: str) -> bool:
    """Whether the API sent ``field`` of the resource (an older server lacks the newer ones: their defaults stand in)."""
    return field in job.model_fields_set


def _scale_cell(job: JobPublic, shown: Callable[[Any], str]) -> str:
    """The latest loss scale as ``shown`` formats it; ``none`` for a job that does no loss scaling (fp32, bf16,
    fp8: its scale is always 1, which would read as a scale)."""
    if _sent(job, "loss_scaling") and job.loss_scaling == "none":
        return "none"
    return shown(job.latest.loss_scale if job.latest is not None else None)


#: A resource a listing shows.
Item = TypeVar("Item", bound=BaseModel)


def write_json(value: Any) -> None:
    """Print ``value`` as indented JSON."""
    sys.stdout.write(json.dumps(value, indent=2) + "\n")


def format_time(value: datetime) -> str:
    """``2025-01-31 12:00:00``: a UTC timestamp of the API to the second."""
    return value.strftime("%Y-%m-%d %H:%M:%S")


def write_table(rows: list[tuple[str, ...]]) -> None:
    """Print ``rows`` (the first is the header) as left-aligned columns two spaces apart."""
    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]))]
    for row in rows:
        sys.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() + "\n")


def write_listing(
    items: Sequence[Item],
    as_json: bool,
    empty_note: str,
    header: tuple[str, ...],
    row: Callable[[Item], tuple[str, ...]],
) -> int:
    """Print ``items`` as JSON (as the API sent them), or as a table of ``header`` and ``row(item)``; ``empty_note``
    on stderr if none."""
    if as_json:
        write_json([item.model_dump(mode="json") for item in items])
    elif not items:
        sys.stderr.write(empty_note + "\n")
    else:
        write_table([header, *(row(item) for item in items)])
    return 0


def run_status(args: argparse.Namespace) -> int:
    """One job's status, progress, latest step record, evaluation and error."""
    with client_for(args) as client:
        job = client.get(args.job_id)
    if args.json:
        sys.stdout.write(json.dumps(job.model_dump(mode="json"), indent=2) + "\n")
        return 0
    sys.stdout.write("".join(f"{key + ':':<10} {value}\n" for key, value in describe(job)))
    return 0


def describe(job: JobPublic) -> list[tuple[str, str]]:
    """``(label, text)`` lines describing a job resource."""
    latest = job.latest
    lines = [
        ("id", job.id),
        ("name", job.name or "-"),
        ("status", str(job.status)),
        ("step", f"{job.step}/{job.max_steps} (world size {job.world_size})"),
        ("precision", _precision_text(job)),
    ]
    if job.phase:
        lines.append(("phase", job.phase))
    if job.startup:
        lines.append(("start-up", _startup_text(job.startup)))
    if job.data is not None:
        lines.append(("data", _data_text(job.data)))
    if latest is not None:
        lines += [
            ("loss", format_number(latest.loss)),
            ("scale", _scale_cell(job, format_scale)),
            ("updates", _updates_text(job, latest)),
            ("samples/s", _samples_text(job, latest)),
        ]
    if job.eval is not None:
        shown = [
            (k, v) for k, v in job.eval.model_dump(exclude_unset=True).items() if k not in ("time", "type")
        ]  # as the API sent it
        lines.append(("eval", ", ".join(f"{k} {format_number(v)}" for k, v in shown)))
    if job.error:
        lines.append(("error", f"{job.error.reason}: {job.error.message}"))
    times = job.model_dump(mode="json", include={"created_at", "started_at", "finished_at"})
    lines.append(("created", times["created_at"]))
    lines.append(("started", times["started_at"] or "-"))
    lines.append(("finished", times["finished_at"] or "-"))
    lines.append(("duration", duration_text(job)))
    return lines


def _startup_text(startup: StartupTimes) -> str:
    """``launch 1.5 s, imports 6.2 s, data 0.3 s, model 0.2 s, first step 0.1 s``: the phases timed so far."""
    timed = [
        (name.removesuffix("_s").replace("_", " "), value)
        for name, value in startup.as_record().items()
        if value is not None
    ]
    return ", ".join(f"{name} {value:.1f} s" for name, value in timed) or "-"


def _updates_text(job: JobPublic, latest: StepRecord) -> str:
    """``applied N / skipped M``: the resource's counts (from the latest record on an older server)."""
    skipped = job.skipped_steps if _sent(job, "skipped_steps") else latest.skipped_steps
    applied = job.applied_steps if _sent(job, "applied_steps") else job.step - (skipped or 0)
    return f"applied {applied} / skipped {skipped}"


def _data_text(data: DataReport) -> str:
    """``1017 rows: 813 train / 203 held out; dropped 1 train, 0 held out; pad </s> (eos)``."""
    parts = [f"{data.rows} rows: {data.train_examples} train / {data.held_out_examples} held out"]
    if data.held_out_examples is not None and data.held_out_examples < HELD_OUT_MINIMUM:
        parts[0] += f" (fewer than {HELD_OUT_MINIMUM}: evaluation metrics are noisy)"
    if data.dropped_rows:
        dropped = ", ".join(f"{count} {split.replace('_', ' ')}" for split, count in data.dropped_rows.items())
        parts.append(f"dropped {dropped} (no supervised token)")
    if data.truncated:
        parts.append(f"{data.truncated} truncated")
    if data.pad_token is not None:
        parts.append(f"pad {data.pad_token.token} ({data.pad_token.source})")
    return "; ".join(parts)


def _samples_text(job: JobPublic, latest: StepRecord) -> str:
    """A succeeded job's whole-run rate (``whole run``), else the latest step record's trailing window."""
    if job.throughput is not None:
        return f"{format_number(job.throughput.samples_per_second, 5)} (whole run)"
    return format_number(latest.samples_per_second, 5)


def _precision_text(job: JobPublic) -> str:
    """The spec's precision, or ``fp16 -> bf16 at step 12 (reason; rewound to step 8)`` after a switch."""
    switches = job.precision_switches
    if not switches:
        return str(job.spec["precision"])
    last = switches[-1]
    return f"{last.from_} -> {last.to} at step {last.step} ({last.reason}; rewound to step {last.rewound_to_step})"


def run_watch(args: argparse.Namespace) -> int:
    """Follow the job's event stream until it ends."""
    with client_for(args) as client:
        return watch_job(client, args.job_id)


def watch_job(client: HalfcastClient, job_id: str) -> int:
    """Print the live view of ``job_id`` (:mod:`halfcast.cli.watch`); 0 if it succeeds, 1 if it fails or is cancelled."""
    job = client.get(job_id)
    view = WatchView(job_id, job.max_steps, scales_loss=not (_sent(job, "loss_scaling") and job.loss_scaling == "none"))
    start = max(0, job.step - 50)  # a little history for the ETA, not the whole run
    status: str = job.status
    with watch_output(sys.stdout) as output:
        for event in client.events(job_id, after_step=start):
            output.show(view, event, view.apply(event))
            if isinstance(event.data, JobPublic):
                status = event.data.status
    return 0 if status == "succeeded" else EXIT_ERROR


def run_cancel(args: argparse.Namespace) -> int:
    """Ask the API to cancel the job; print its new status."""
    with client_for(args) as client:
        job = client.cancel(args.job_id)
    sys.stdout.write(f"job {job.id}: {job.status}\n")
    return 0
