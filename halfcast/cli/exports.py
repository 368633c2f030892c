"""``halfcast exports JOB_ID`` and ``halfcast export JOB_ID KIND``: a job's exported model, and fetching one.

``exports`` prints a table (kind, attempt, files, size, modified), or the list as JSON
with ``--json``. ``export`` downloads the ``adapter`` (a PEFT adapter) or ``model`` (a
merged Hugging Face model directory) and unpacks it as the directory ``-o DIR`` (default
``./<job id>-<kind>``), which must not exist or be empty unless ``--overwrite``; it is
never left half-unpacked (:meth:`halfcast.client.HalfcastClient.download_export`). It
prints the directory; a target that cannot be written is a one-line error. Exit
statuses as for the other job commands (:mod:`halfcast.cli.jobs`): 1 for an unknown job,
one without such an export, or a refused archive, 3 for an unreachable server.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from halfcast.cli.checkpoints import format_size
from halfcast.cli.jobs import EXIT_ERROR, add_api_command, client_for, format_time, write_listing
from halfcast.files.export_files import ExportKind


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``exports`` and ``export``."""
    listing = add_api_command(subparsers, "exports", "list a job's exports (adapter, model)", run_exports)
    listing.add_argument("job_id")
    listing.add_argument("--json", action="store_true", help="print the list as JSON")
    export = add_api_command(subparsers, "export", "download a job's export and unpack it as a directory", run_export)
    export.add_argument("job_id")
    export.add_argument(
        "kind", choices=[k.value for k in ExportKind], help="adapter (PEFT) or model (merged Hugging Face)"
    )
    export.add_argument("--attempt", type=int, default=None, help="the attempt that wrote it (default: the newest)")
    export.add_argument("-o", "--output", default=None, help="directory to unpack it as (default: ./<job id>-<kind>)")
    export.add_argument("--overwrite", action="store_true", help="replace the directory if it exists and is not empty")


def run_exports(args: argparse.Namespace) -> int:
    """Print the job's exports (a note on stderr when it has none)."""
    with client_for(args) as client:
        found = client.exports(args.job_id)
    header = ("KIND", "ATTEMPT", "FILES", "SIZE", "MODIFIED")
    return write_listing(
        found,
        args.json,
        f"job {args.job_id} has no export",
        header,
        lambda e: (
            e.kind.value,
            str(e.attempt),
            str(len(e.files)),
            format_size(e.size_bytes),
            format_time(e.modified_at),
        ),
    )


def run_export(args: argparse.Namespace) -> int:
    """Download and unpack the export; print its directory."""
    target = Path(args.output) if args.output else Path.cwd() / f"{args.job_id}-{args.kind}"
    with client_for(args) as client:
        try:
            saved = client.download_export(args.job_id, args.kind, target, args.attempt, overwrite=args.overwrite)
        except FileExistsError:
            sys.stderr.write(f"error: cannot save to {target}: it exists and is not empty (pass --overwrite)\n")
            return EXIT_ERROR
        except OSError as exc:
            sys.stderr.write(f"error: cannot save to {target}: {exc.strerror or exc}\n")
            return EXIT_ERROR
    files = [p for p in saved.rglob("*") if p.is_file()]
    size = format_size(sum(p.stat().st_size for p in files))
    sys.stderr.write(f"job {args.job_id}: {args.kind} export, {len(files)} files ({size})\n")
    sys.stdout.write(f"{saved}\n")
    return 0
