"""Run health: whether a pretraining run is going somewhere, said while it happens.

    corpus       statistics of the training text, from columns the data stage caches with the tokenized
                 documents, and the baselines a curve should beat (the unigram cross-entropy, NSP's chance)
    signatures   the callback `RunHealth`: unigram plateau, NSP at chance, loss spikes, learning stopped,
                 each warned while it holds and said outgrown when it no longer does, and the overfitting
                 note; a pure function of the log rows (a resumed run replays them)
    report       run_health.json, the reference lines of training_curves.png and the model card's section

What each warning means and what to change: docs/run_health.md.
"""
