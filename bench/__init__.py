"""Benchmarks of Halfcast's training step against its peers (issue 3).

``python -m bench.compare_peers`` times one optimizer step of Halfcast's trainer, a
hand-written PyTorch AMP loop, Hugging Face Accelerate and Lightning Fabric on the same
model, data and precision, in one interleaved run, and counts the host synchronisations
each makes per steady-state step. ``bench/gpu_checks.py`` is the CUDA counterpart.
``python -m bench.api_load`` measures the API under many concurrent pollers (issue 11).
See ``bench/README.md``.
"""
