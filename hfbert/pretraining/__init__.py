"""BERT pretraining (masked LM + next sentence prediction) with accelerate, as a package of stages, one module
each, in the order data flows through them:

    settings      the run's flags, in groups (corpus, data, model, optimization, output)
    precision     the precision and the Accelerator
    process_group the processes of a launch: their group formed and ended, the main process's checks
                  given to every rank, a worker that stops with its launcher
    source_model  --model_name_or_path: the weights a run starts from
    data          corpus -> documents -> tokenizer -> model config -> NSP instances (cached by datasets, or
                  with --streaming a fixed validation set and each process's share of a stream)
    instances     tokenized documents -> NSP pairs or MLM segments
    stream        --streaming: training instances made from a stream of documents in windows, by loader
                  workers, with each worker's position for an exact resume
    batches       the loaders and the one collator (padding, masking, the static form)
    flops         the model FLOPs per token and the datasheet peaks behind the logged MFU
    evaluation    held-out evaluation and the metrics' sums
    training      Training, the one owner of model, optimizer, schedule, budget and progress: the step, the
                  update, the log interval, the checkpoint and the resume
    callbacks     the events the loop calls besides the step
    loop          fit: step, log, evaluate, checkpoint on their schedules; preemption
    finish        the final folder (model, tokenizer, card, curves) and the push
    run           pretrain(settings): the model built and every stage composed, in one function; it
                  ends the process group
    cli           run_pretraining.py's flags and recipes -> main -> pretrain (also `python -m
                  hfbert.pretraining`, __main__, and the console script hfbert-pretrain)
    extras/       the optional parts, attached by run and cli alone: run health, the dry run's plan,
                  resharding, the checks of several processes and nodes, attention shaping, samples

No stage imports a later one, nor an extra (pyproject.toml's import contracts, `lint-imports`). This file
imports nothing, so that reading the settings (as hfbert.corpus does) loads none of the rest. See
docs/architecture.md.
"""
