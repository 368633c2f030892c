"""The benchmark's results as a markdown table (for docs/benchmarks.md) and as JSON-ready machine facts."""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

COLUMNS = (
    "path",
    "asked",
    "ran in",
    "loss scaling",
    "optimizer",
    "ms/step (median)",
    "× hand loop (range)",
    "best ms/step",
    "best ×",
    "syncs/step",
    "syncs/flush",
)


def machine_info() -> dict[str, Any]:
    """CPU model, logical cores, torch version and threads, CPU kernel capability, Python version."""
    return {
        "cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "python": platform.python_version(),
    }


def _cpu_model() -> str:
    """``model name`` from ``/proc/cpuinfo`` (Linux), else ``platform.processor()``."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


#: An extra table column: its header and the cell of one path's result.
Column = tuple[str, Callable[[Mapping[str, Any]], str]]


def markdown_table(peers: Mapping[str, Mapping[str, Any]], extra: Sequence[Column] = ()) -> str:
    """One row per path of ``peers`` (the ``"peers"`` block of the JSON result), as a markdown table,
    with the ``extra`` columns after the standard ones."""
    headers = [*COLUMNS, *(header for header, _ in extra)]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for result in peers.values():
        lines.append("| " + " | ".join([*_row(result), *(cell(result) for _, cell in extra)]) + " |")
    return "\n".join(lines) + "\n"


def _row(result: Mapping[str, Any]) -> list[str]:
    info = result["info"]
    if result["status"] != "ok":
        return [info["label"], info["requested"], result["status"], *["—"] * (len(COLUMNS) - 3)]
    ratio = f"{result['ratio']:.3f} ({result['ratio_min']:.3f}–{result['ratio_max']:.3f})"
    flush = result["syncs_per_flush"]
    flush_text = f"{max(flush)} per {result['flush_interval']} steps" if flush else "—"
    return [
        info["label"],
        info["requested"],
        info["compute_dtype"],
        info["loss_scaling"],
        info["optimizer"],
        f"{result['median_ms']:.2f}",
        ratio,
        f"{result['best_ms']:.2f}",
        f"{result['best_ratio']:.3f}",
        str(result["steady_syncs"]),
        flush_text,
    ]


def notes(peers: Mapping[str, Mapping[str, Any]]) -> str:
    """A bullet per path whose run differs from what was asked, or whose library warned."""
    lines = []
    for result in peers.values():
        info = result["info"]
        if result["status"] != "ok":
            lines.append(f"- {info['label']}: {result['status']} ({result.get('error', '')})")
            continue
        asked = info["requested"].split()[0]
        ran = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}.get(info["compute_dtype"], "?")
        if ran != asked:
            lines.append(f"- {info['label']}: asked for {info['requested']}, computed in {info['compute_dtype']}.")
        lines += [f"- {info['label']} warned: {note}" for note in info["notes"]]
    return "\n".join(lines) + ("\n" if lines else "")
