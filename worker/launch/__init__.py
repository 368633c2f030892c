"""Starting and stopping a run's processes: the torchrun tree, its ranks' logs, exits and the OOM killer's count."""
