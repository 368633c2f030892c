"""``halfcast checkpoints JOB_ID`` and ``halfcast download JOB_ID``: a job's checkpoint files, and fetching one.

``checkpoints`` prints a table (attempt, name, step, size, modified), oldest first, or
the list as JSON with ``--json``. ``download`` saves one file (by default the newest:
what ``resume_from: <job id>`` resumes from; ``--name``/``--attempt`` pick another) to
``-o PATH`` (a file, or a directory, existing or ending in ``/``, to hold
``<job id>-attempt-<n>-<name>``; default the current directory), never leaving a partial
file there, and prints the path; a target that cannot be written is a one-line error. The file is a ``torch.save`` dict whose
``model`` entry is the model's state dict: ``torch.load(path, weights_only=True)["model"]``;
``trainer.export.load_trained_model(path)`` rebuilds the trained model itself.
Exit statuses as for the other job commands (:mod:`halfcast.cli.jobs`): 1 for an unknown
job or one without such a checkpoint, 3 for an unreachable server.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from halfcast.cli.jobs import EXIT_ERROR, add_api_command, client_for, format_time, write_listing


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``checkpoints`` and ``download``."""
    listing = add_api_command(subparsers, "checkpoints", "list a job's checkpoint files", run_checkpoints)
    listing.add_argument("job_id")
    listing.add_argument("--json", action="store_true", help="print the list as JSON")
    download = add_api_command(
        subparsers, "download", "download a job's checkpoint (default: the newest)", run_download
    )
    download.add_argument("job_id")
    download.add_argument("--name", default=None, help="final.pt or step-<N>.pt (default: the newest checkpoint)")
    download.add_argument("--attempt", type=int, default=None, help="the attempt that wrote it (default: the newest)")
    download.add_argument(
        "-o",
        "--output",
        default=None,
        help="file, or directory (existing, or ending in /) to save it in as <job id>-attempt-<n>-<name> (default: .)",
    )


def run_checkpoints(args: argparse.Namespace) -> int:
    """Print the job's checkpoint files (a note on stderr when it has none yet)."""
    with client_for(args) as client:
        files = client.checkpoints(args.job_id)
    header = ("ATTEMPT", "NAME", "STEP", "SIZE", "MODIFIED")
    return write_listing(
        files,
        args.json,
        f"job {args.job_id} has no checkpoint yet",
        header,
        lambda f: (str(f.attempt), f.name, str(f.step), format_size(f.size_bytes), format_time(f.modified_at)),
    )


def run_download(args: argparse.Namespace) -> int:
    """Save the checkpoint and print where."""
    target = _target(args.output)
    with client_for(args) as client:
        try:
            saved = client.download_checkpoint(args.job_id, target, name=args.name, attempt=args.attempt)
        except OSError as exc:  # the target cannot be written (BrokenPipeError never comes from here)
            sys.stderr.write(f"error: cannot save to {target}: {exc.strerror or exc}\n")
            return EXIT_ERROR
    file = saved.checkpoint
    sys.stderr.write(
        f"job {args.job_id}: {file.name} of attempt {file.attempt} (step {file.step}, {format_size(file.size_bytes)})\n"
    )
    sys.stdout.write(f"{saved.path}\n")
    return 0


def _target(output: str | None) -> Path:
    """Where ``-o`` says (default: the current directory); a path ending in ``/`` is a directory, created if need be."""
    if output is None:
        return Path.cwd()
    target = Path(output)
    if output.endswith(("/", os.sep)):
        target.mkdir(parents=True, exist_ok=True)
    return target


def format_size(size_bytes: int) -> str:
    """``size_bytes`` in B, KiB, MiB or GiB with 3 significant digits (``1.5 MiB``)."""
    size = float(size_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size_bytes} B" if unit == "B" else f"{size:.3g} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
