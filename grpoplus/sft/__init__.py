"""The supervised stage (``run.stage=sft``, ``grpoplus sft``): demonstrations read, checked and rendered as a rollout
of them holds them (:mod:`.demos`), where they come from (:mod:`.source`), and the learner's batches and held-out
loss made of them (:mod:`.collect`)."""
