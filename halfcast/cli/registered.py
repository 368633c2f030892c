"""What ``halfcast datasets`` and ``halfcast models`` share: an upload with its progress bar, printing one entry."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from halfcast.cli.jobs import EXIT_ERROR, client_for
from halfcast.cli.progress import UploadProgress
from halfcast.client import HalfcastClient
from halfcast.contracts.registry import DatasetPublic, ModelPublic

#: A registered entry as the API answers it.
Entry = TypeVar("Entry", DatasetPublic, ModelPublic)
#: Sends ``path`` with a progress callback; the registered entry the API answered.
Upload = Callable[[HalfcastClient, UploadProgress], Entry]


def run_upload(args: argparse.Namespace, path: Path, upload: Upload[Entry], summary: Callable[[Entry], str]) -> int:
    """Upload ``path`` (a progress bar on stderr), then print the entry: :func:`print_entry`; exit 1 if unreadable."""
    progress = UploadProgress(f"uploading {path.name}")
    try:
        with client_for(args) as client:
            entry = upload(client, progress)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"error: cannot upload {path}: {getattr(exc, 'strerror', None) or exc}\n")
        return EXIT_ERROR
    finally:
        progress.close()
    return print_entry(entry, args.json, summary)


def print_entry(entry: Entry, as_json: bool, summary: Callable[[Entry], str]) -> int:
    """The entry as JSON, or ``summary(entry)`` on stderr and its id on stdout (what a job spec names)."""
    if as_json:
        sys.stdout.write(json.dumps(entry.model_dump(mode="json"), indent=2) + "\n")
        return 0
    sys.stderr.write(summary(entry) + "\n")
    sys.stdout.write(f"{entry.id}\n")
    return 0


def show_entry(entry: Entry, as_json: bool, fields: Sequence[str]) -> int:
    """The entry as JSON, or one ``field: value`` line per field, aligned."""
    body = entry.model_dump(mode="json")
    if as_json:
        sys.stdout.write(json.dumps(body, indent=2) + "\n")
        return 0
    width = max(len(key) for key in fields) + 1  # the longest key and its colon
    sys.stdout.write("".join(f"{key + ':':<{width}} {body[key]}\n" for key in fields))
    return 0
