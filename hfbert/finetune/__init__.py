"""Fine-tune a finished model folder on a labelled text-classification set, over several seeds, and compare it
with the same architecture from random initialisation (or with another folder).

The model is loaded as `AutoModelForSequenceClassification` and trained by transformers' `Trainer`; the data
comes from the Hub (`--dataset_name`, e.g. GLUE, whose columns and metrics are known) or from local
csv/jsonl/parquet files. Every check on the data and the folders runs before any training. Unless
--learning_rate is a number, each model's rate (the comparison's too) is chosen on folds of the training rows,
never on the evaluation split; the epochs follow the model's size. A fit that collapsed is named, and the gain
is paired per seed with a 95% interval that says whether it is beyond the seed-to-seed noise.

    python -m hfbert.finetune runs/hfbert-tiny-wikitext --train_file train.csv --validation_file test.csv \\
        --max_train_samples 200 --compare random_init
    python -m hfbert.finetune runs/bert-base --dataset_name nyu-mll/glue --dataset_config_name mrpc \\
        --compare random_init --seeds 1 2 3

The steps, one module each: settings (the flags, in typed groups), data (the labelled rows), models (the
folders and the classifiers built from them), fit (one Trainer run), selection (the rate), report (the
results, the plot, the model card), run (the command).
"""
