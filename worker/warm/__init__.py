"""Warm start: a standby Python with torch and the trainer imported, which forks a CPU job's ranks (issue 17).

A cold launch pays for two interpreters that import torch one after the other (torchrun's,
then each rank's: seconds each). The worker instead keeps one *standby* ready
(:mod:`worker.warm.pool`): ``python -m worker.warm.standby``, started like any run (in a
session of its own, through :mod:`worker.launch.deathsig`), that has imported torch, the trainer
and the libraries its datasets and models use, and then waits. A CPU job of the trainer (one
node's share of a multi-node job too) is handed to it (:class:`~worker.warm.assignment.Assignment`); it forks a launcher for it
(:mod:`worker.warm.forkserver`) and stays ready for the next. The launcher takes the job's
environment and directory and runs it (:mod:`worker.warm.agent`): it forks one rank
per process, each with torchrun's environment, its own session and its own log, and
supervises them as torchrun does (on node 0 of a gang it hosts the rendezvous store at the gang's
endpoint, as torchrun's static rendezvous does). GPU jobs and any command that is not the
trainer's keep the cold path (torchrun), as do jobs that find no standby ready.
"""
