"""A run, from its first step to its last record: the loop (:mod:`.loop`) and its stages.

- :mod:`.step`: one attempted step; :mod:`.telemetry` and :mod:`.flushing`: its rows, gathered on the device and
  written as records;
- :mod:`.guard`, :mod:`.end_check`, :mod:`.fallback`: divergence found during and after the run, and the one
  switch from fp16 to bf16;
- :mod:`.evaluate`, :mod:`.best`, :mod:`.early_stopping`: evaluations, the best checkpoint, stopping early;
- :mod:`.checkpoint`, :mod:`.resume`: checkpoints written and read back.
"""
