"""Hugging Face models in Halfcast jobs: safe loading from the model roots, the wrapper the loop
trains, LoRA adapters through PEFT, and the exports a finished job writes.

Nothing here imports ``transformers`` or ``peft`` at import time: they are imported inside the
functions that need them, so the API process and :mod:`halfcast.contracts.spec` never load them.
"""
