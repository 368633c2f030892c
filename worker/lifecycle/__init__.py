"""An attempt's life on its job: the lease, the deadline, how it ended, and recovering one that lost its worker."""
