"""Multi-node jobs: one gang of workers, one node each, training as one torchrun job (docs/worker.md, "Multi-node
jobs").

- :mod:`.entry`: where a task's message leads: claim as node 0, join a gang, or neither;
- :mod:`.formation`: the gang's formation and the peer verdicts, and a member's self-fencing lease;
- :mod:`.attempt`: node 0's attempt, the one-node attempt plus its gang;
- :mod:`.member`: a node other than node 0: wait for the gang, run its torchrun, end with the attempt;
- :mod:`.plan`: the launch file node 0 writes for the others (``<run_dir>/gang.json``);
- :mod:`.launch`: a node's torchrun command and the addresses it is reached at.
"""
