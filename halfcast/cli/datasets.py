"""``halfcast datasets upload|list|show|delete``: registered datasets (``/datasets``).

``upload FILE --format FORMAT`` streams a JSON-lines or CSV file to the API, which checks every
row against ``FORMAT`` (``text``, ``instruction``, ``chat``, ``classification``) before it accepts
it; a bad row exits 2 with ``error: line[<n>].<field>: ...``. It prints the dataset's id (the
``dataset_id`` a job spec names) and, on stderr, its rows, size and SHA-256; uploads over a few MB
show a progress bar on stderr. Exit statuses as for the job commands (:mod:`halfcast.cli.jobs`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from halfcast.cli import registered
from halfcast.cli.checkpoints import format_size
from halfcast.cli.jobs import add_api_command, client_for, format_time, write_listing
from halfcast.contracts.registry import DatasetPublic

#: The formats a dataset's rows are checked against (the ``jsonl`` dataset's).
FORMATS = ("text", "instruction", "chat", "classification")
#: What ``halfcast datasets show`` prints.
SHOWN = ("id", "name", "owner", "format", "file_format", "rows", "bytes", "sha256", "created_at")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``datasets`` command group."""
    parser = subparsers.add_parser("datasets", help="upload, list, show and delete registered datasets")
    commands = parser.add_subparsers(dest="datasets_command", metavar="DATASETS_COMMAND", required=True)
    upload = add_api_command(commands, "upload", "upload a JSON-lines or CSV file as a dataset", run_upload)
    upload.add_argument("file", type=Path)
    upload.add_argument("--format", required=True, choices=FORMATS, help="what every row must be")
    upload.add_argument("--file-format", choices=("jsonl", "csv"), default=None, help="default: from the extension")
    upload.add_argument("--name", default=None, help="default: the file's name")
    upload.add_argument("--json", action="store_true", help="print the dataset as JSON")
    listing = add_api_command(commands, "list", "list registered datasets, newest first", run_list)
    listing.add_argument("--json", action="store_true", help="print the list as JSON")
    show = add_api_command(commands, "show", "show one registered dataset", run_show)
    show.add_argument("dataset_id")
    show.add_argument("--json", action="store_true", help="print the dataset as JSON")
    delete = add_api_command(commands, "delete", "delete a registered dataset", run_delete)
    delete.add_argument("dataset_id")


def describe(dataset: DatasetPublic) -> str:
    """One line: rows, format, size and SHA-256."""
    return (
        f"{dataset.rows} rows of {dataset.format} ({dataset.file_format}), "
        f"{format_size(dataset.bytes)}, sha256 {dataset.sha256}"
    )


def run_upload(args: argparse.Namespace) -> int:
    """Upload the file; print the dataset's id (or the dataset as JSON)."""
    return registered.run_upload(
        args,
        args.file,
        lambda client, progress: client.upload_dataset(
            args.file, args.format, name=args.name, file_format=args.file_format, progress=progress
        ),
        lambda dataset: f"dataset {dataset.name}: {describe(dataset)}",
    )


def run_list(args: argparse.Namespace) -> int:
    """Print the registered datasets (a note on stderr when there are none)."""
    with client_for(args) as client:
        found = list(client.datasets())
    header = ("ID", "NAME", "FORMAT", "ROWS", "SIZE", "CREATED")
    return write_listing(
        found,
        args.json,
        "no dataset registered",
        header,
        lambda d: (
            d.id,
            d.name,
            f"{d.format}/{d.file_format}",
            str(d.rows),
            format_size(d.bytes),
            format_time(d.created_at),
        ),
    )


def run_show(args: argparse.Namespace) -> int:
    """Print one dataset."""
    with client_for(args) as client:
        dataset = client.dataset(args.dataset_id)
    return registered.show_entry(dataset, args.json, SHOWN)


def run_delete(args: argparse.Namespace) -> int:
    """Delete a dataset (1 when a job that has not ended uses it)."""
    with client_for(args) as client:
        client.delete_dataset(args.dataset_id)
    sys.stderr.write(f"dataset {args.dataset_id} deleted\n")
    return 0
