"""What a worker can place a job on: its CPU slots and GPUs, and the wait for one before claiming a job."""
