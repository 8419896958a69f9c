"""BERT pretraining (masked LM + next sentence prediction) with accelerate, as a package of stages, one module
each, in the order data flows through them:

    settings     the run's flags, in groups (corpus, data, model, optimization, run)
    data         corpus -> documents -> tokenizer -> model config -> NSP instances (cached by datasets, or
                 with --streaming a fixed validation set and each process's share of a stream)
    stream       --streaming: training instances made from a stream of documents in windows, by loader
                 workers, with each worker's position for an exact resume
    batches      the batch plan, the loaders and the one collator (padding, masking, the static form)
    precision    the precision and the Accelerator
    optimization optimizer, schedule and budget, prepared by accelerate; the checkpointed TrainingState
    evaluation   held-out evaluation, the metrics' sums, model FLOPs and MFU (used by the loop)
    callbacks    the events the loop calls besides the step
    loop         fit and train_step: step, log, evaluate, checkpoint; preemption
    finish       the final folder (model, tokenizer, card, curves, samples) and the push
    samples      the final folder's samples.md, from the weights in memory
    run          pretrain(settings): the model built and every stage composed, in one function
    cli          run_pretraining.py's flags -> main -> pretrain (also `python -m hfbert.pretraining`,
                 __main__, and the console script hfbert-pretrain)
    recipes      --recipe: a file of run_pretraining.py's flags (hfbert/recipes/), read before the command line's

No stage imports a later one. This file imports nothing, so that reading the settings (as
hfbert.corpus does) loads none of the rest. See docs/architecture.md.
"""
