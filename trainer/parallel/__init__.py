"""Many ranks as one job: the process group (:mod:`.distributed`), DDP or FSDP2 wrapping (:mod:`.wrap`), and
gradients of sharded and replicated parameters (:mod:`.sharded`)."""
