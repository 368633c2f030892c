"""The optimizer step: Halfcast's device-skipping optimizers (:mod:`trainer.optim.skipping`) and what builds them,
with the learning-rate schedule, from the job spec (:mod:`trainer.optim.build`)."""
