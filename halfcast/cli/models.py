"""``halfcast models upload|register|list|show|delete``: registered Hugging Face models (``/models``).

``upload DIR`` sends the model directory as a tar it builds on the fly (no temporary file; links and
special files are refused before anything is sent); the API checks it (no pickle weights, no remote
code, a supported ``model_type``, safetensors). ``register JOB_ID`` registers a finished job's
exported model, so it can be fine-tuned again. Both print the model's id (the ``model_id`` a job spec
names). Uploads over a few MB show a progress bar on stderr. Exit statuses as for the job commands.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from halfcast.cli import registered
from halfcast.cli.checkpoints import format_size
from halfcast.cli.jobs import add_api_command, client_for, format_time, write_listing
from halfcast.contracts.registry import ModelPublic

#: What ``halfcast models show`` prints.
SHOWN = ("id", "name", "owner", "model_type", "files", "bytes", "sha256", "source_job_id", "created_at")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``models`` command group."""
    parser = subparsers.add_parser("models", help="upload, register, list, show and delete registered models")
    commands = parser.add_subparsers(dest="models_command", metavar="MODELS_COMMAND", required=True)
    upload = add_api_command(commands, "upload", "upload a Hugging Face model directory", run_upload)
    upload.add_argument("directory", type=Path)
    upload.add_argument("--name", default=None, help="default: the directory's name")
    upload.add_argument("--json", action="store_true", help="print the model as JSON")
    register_export = add_api_command(commands, "register", "register a job's exported model", run_register)
    register_export.add_argument("job_id")
    register_export.add_argument("--name", default=None, help="default: the job's name")
    register_export.add_argument("--json", action="store_true", help="print the model as JSON")
    listing = add_api_command(commands, "list", "list registered models, newest first", run_list)
    listing.add_argument("--json", action="store_true", help="print the list as JSON")
    show = add_api_command(commands, "show", "show one registered model", run_show)
    show.add_argument("model_id")
    show.add_argument("--json", action="store_true", help="print the model as JSON")
    delete = add_api_command(commands, "delete", "delete a registered model", run_delete)
    delete.add_argument("model_id")


def describe(model: ModelPublic) -> str:
    """One line: name, type, files, size and the job it came from."""
    source = f" from job {model.source_job_id}" if model.source_job_id else ""
    return f"model {model.name}: {model.model_type}, {model.files} files, {format_size(model.bytes)}{source}"


def run_upload(args: argparse.Namespace) -> int:
    """Upload the directory; print the model's id (or the model as JSON)."""
    return registered.run_upload(
        args,
        args.directory,
        lambda client, progress: client.upload_model(args.directory, name=args.name, progress=progress),
        describe,
    )


def run_register(args: argparse.Namespace) -> int:
    """Register the job's exported model; print its id."""
    with client_for(args) as client:
        model = client.register_export(args.job_id, name=args.name)
    return registered.print_entry(model, args.json, describe)


def run_list(args: argparse.Namespace) -> int:
    """Print the registered models (a note on stderr when there are none)."""
    with client_for(args) as client:
        found = list(client.models())
    header = ("ID", "NAME", "TYPE", "FILES", "SIZE", "FROM JOB", "CREATED")
    return write_listing(
        found,
        args.json,
        "no model registered",
        header,
        lambda m: (
            m.id,
            m.name,
            m.model_type,
            str(m.files),
            format_size(m.bytes),
            m.source_job_id or "-",
            format_time(m.created_at),
        ),
    )


def run_show(args: argparse.Namespace) -> int:
    """Print one model."""
    with client_for(args) as client:
        model = client.model(args.model_id)
    return registered.show_entry(model, args.json, SHOWN)


def run_delete(args: argparse.Namespace) -> int:
    """Delete a model (1 when a job that has not ended uses it)."""
    with client_for(args) as client:
        client.delete_model(args.model_id)
    sys.stderr.write(f"model {args.model_id} deleted\n")
    return 0
