"""``halfcast checkpoints JOB_ID`` and ``halfcast download JOB_ID``: a job's checkpoint files, and fetching one.

``checkpoints`` prints a table (attempt, name, step, size, modified), oldest first, or
the list as JSON with ``--json``. ``download`` saves one file (by default the newest:
what ``resume_from: <job id>`` resumes from; ``--name``/``--attempt`` pick another) to
``-o PATH`` (a file, or a directory to hold ``<job id>-attempt-<n>-<name>``; default the
current directory), never leaving a partial file there, and prints the path. The file is a ``torch.save`` dict whose
``model`` entry is the model's state dict: ``torch.load(path, weights_only=True)["model"]``.
Exit statuses as for the other job commands (:mod:`server.cli.jobs`): 1 for an unknown
job or one without such a checkpoint, 3 for an unreachable server.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from server.cli.jobs import add_api_command, client_for, write_table


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``checkpoints`` and ``download``."""
    listing = add_api_command(subparsers, "checkpoints", "list a job's checkpoint files", run_checkpoints)
    listing.add_argument("job_id")
    listing.add_argument("--json", action="store_true", help="print the list as JSON")
    download = add_api_command(subparsers, "download", "download a job's checkpoint (default: the newest)", run_download)
    download.add_argument("job_id")
    download.add_argument("--name", default=None, help="final.pt or step-<N>.pt (default: the newest checkpoint)")
    download.add_argument("--attempt", type=int, default=None, help="the attempt that wrote it (default: the newest)")
    download.add_argument("-o", "--output", type=Path, default=None,
                          help="file or directory to save it to (default: ./<job id>-attempt-<n>-<name>)")  # fmt: skip


def run_checkpoints(args: argparse.Namespace) -> int:
    """Print the job's checkpoint files."""
    with client_for(args) as client:
        files = client.checkpoints(args.job_id)
    if args.json:
        sys.stdout.write(json.dumps(files, indent=2) + "\n")
        return 0
    rows = [("ATTEMPT", "NAME", "STEP", "SIZE", "MODIFIED")]
    rows += [(str(f["attempt"]), f["name"], str(f["step"]), format_size(f["size_bytes"]), f["modified_at"][:19].replace("T", " "))
             for f in files]  # fmt: skip
    write_table(rows)
    return 0


def run_download(args: argparse.Namespace) -> int:
    """Save the checkpoint and print where."""
    with client_for(args) as client:
        saved = client.download_checkpoint(args.job_id, args.output or Path.cwd(), name=args.name, attempt=args.attempt)
    sys.stderr.write(f"job {args.job_id}: {saved['name']} of attempt {saved['attempt']} (step {saved['step']}, "
                     f"{format_size(saved['size_bytes'])})\n")  # fmt: skip
    sys.stdout.write(f"{saved['path']}\n")
    return 0


def format_size(size_bytes: int) -> str:
    """``size_bytes`` in B, KiB, MiB or GiB with 3 significant digits (``1.5 MiB``)."""
    size = float(size_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size_bytes} B" if unit == "B" else f"{size:.3g} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
