"""The pieces of ``bench/gpu_checks.py``: settings, workloads, FLOPs, the Halfcast and hand-written paths, DDP."""
