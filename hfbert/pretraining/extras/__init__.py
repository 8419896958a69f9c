"""The optional parts of a pretraining run, each attached by the composition root (`hfbert.pretraining.run`,
`hfbert.pretraining.cli`) alone, as a callback or a check before work; no stage of the pipeline imports them:
run health (`health`), the dry run's plan (`plan`), resumes on another process count (`reshard`), the checks of
a launch of several processes and nodes (`cluster`), the attention shaping of the structured start
(`attention_shaping`) and the final folder's samples (`samples`)."""
