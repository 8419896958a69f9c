import tracemalloc
from types import SimpleNamespace

import datasets
import pytest
import torch
from torch.utils.data import DataLoader

from hfbert.pretraining.batches import (
    DRAW_KEY,
    DataCollatorForPretraining,
    EpochDraws,
    InstanceDraws,
    default_max_predictions,
)


def make_features(tokenizer, lengths, seed=0):
    """NSP-shaped rows: [CLS] A [SEP] B [SEP] with random non-special ids, A and B of about equal length."""
    generator = torch.Generator().manual_seed(seed)
    special_ids = set(tokenizer.all_special_ids)
    vocabulary = [i for i in range(len(tokenizer)) if i not in special_ids]
    features = []
    for index, length in enumerate(lengths):
        ids = [vocabulary[i] for i in torch.randint(len(vocabulary), (length - 3,), generator=generator)]
        half = len(ids) // 2
        input_ids = [
            tokenizer.cls_token_id,
            *ids[:half],
            tokenizer.sep_token_id,
            *ids[half:],
            tokenizer.sep_token_id,
        ]
        token_type_ids = [0] * (half + 2) + [1] * (len(ids) - half + 1)
        features.append(
            {"input_ids": input_ids, "token_type_ids": token_type_ids, "next_sentence_label": index % 2}
        )
    return features


def test_signature_matches_contract(sample_tokenizer):
    collator = DataCollatorForPretraining(sample_tokenizer)
    assert (collator.mlm_probability, collator.mask_replace_prob, collator.random_replace_prob) == (
        0.15,
        0.8,
        0.1,
    )
    assert collator.pad_to_multiple_of == 8
    assert (collator.pad_to_length, collator.pad_to_batch_size, collator.max_predictions_per_seq) == (None,) * 3


def test_padding_layout(sample_tokenizer):
    lengths = [5, 13, 9]
    features = make_features(sample_tokenizer, lengths)
    batch = DataCollatorForPretraining(sample_tokenizer)(features)
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "labels", "next_sentence_label"}
    assert all(tensor.dtype == torch.long for tensor in batch.values())
    assert batch["input_ids"].shape == (3, 16)  # longest row 13, rounded up to a multiple of 8
    assert batch["attention_mask"].sum(dim=1).tolist() == lengths
    assert batch["next_sentence_label"].tolist() == [0, 1, 0]
    for row, (feature, length) in enumerate(zip(features, lengths, strict=True)):
        assert batch["token_type_ids"][row, :length].tolist() == feature["token_type_ids"]
        padding = slice(length, None)
        assert (batch["input_ids"][row, padding] == sample_tokenizer.pad_token_id).all()
        assert (batch["token_type_ids"][row, padding] == 0).all()
        assert (batch["labels"][row, padding] == -100).all()

    unrounded = DataCollatorForPretraining(sample_tokenizer, pad_to_multiple_of=None)(features)
    assert unrounded["input_ids"].shape == (3, 13)


def test_masking_statistics(sample_tokenizer):
    """~200k eligible tokens, ~30k chosen. Binomial sds: rate 0.0008, [MASK] share 0.0023, random and
    unchanged shares 0.0017; the tolerances are >= 5 sd, so the fixed seed cannot flake."""
    features = make_features(sample_tokenizer, [128, 128, 128, 77] * 450)
    original = DataCollatorForPretraining(sample_tokenizer, mlm_probability=0.0)(features)["input_ids"]
    torch.manual_seed(1234)
    batch = DataCollatorForPretraining(sample_tokenizer)(features)
    inputs, labels = batch["input_ids"], batch["labels"]

    special = torch.isin(original, torch.tensor(sample_tokenizer.all_special_ids))
    chosen = labels != -100
    assert not (chosen & special).any()
    assert torch.equal(inputs[special], original[special])
    assert torch.equal(labels[chosen], original[chosen])
    assert torch.equal(inputs[~chosen], original[~chosen])

    eligible = int((~special).sum())
    assert eligible > 190_000
    assert abs(int(chosen.sum()) / eligible - 0.15) < 0.005

    chosen_inputs, chosen_originals = inputs[chosen], original[chosen]
    is_mask = chosen_inputs == sample_tokenizer.mask_token_id
    is_unchanged = chosen_inputs == chosen_originals
    is_random = ~is_mask & ~is_unchanged
    count = len(chosen_inputs)
    assert abs(int(is_mask.sum()) / count - 0.8) < 0.012
    assert abs(int(is_random.sum()) / count - 0.1) < 0.009
    assert abs(int(is_unchanged.sum()) / count - 0.1) < 0.009
    # Random replacements come from the non-special vocabulary only (~3000 draws; 5 specials in 1000 ids
    # would show up ~15 times if they were allowed).
    assert not torch.isin(chosen_inputs[is_random], torch.tensor(sample_tokenizer.all_special_ids)).any()


def test_replacement_probabilities_are_honoured(sample_tokenizer):
    features = make_features(sample_tokenizer, [128] * 50)
    only_mask = DataCollatorForPretraining(sample_tokenizer, mask_replace_prob=1.0, random_replace_prob=0.0)(
        features
    )
    chosen = only_mask["labels"] != -100
    assert chosen.any() and (only_mask["input_ids"][chosen] == sample_tokenizer.mask_token_id).all()

    only_random = DataCollatorForPretraining(
        sample_tokenizer, mask_replace_prob=0.0, random_replace_prob=1.0
    )(features)
    chosen = only_random["labels"] != -100
    assert not (only_random["input_ids"] == sample_tokenizer.mask_token_id).any()
    changed = only_random["input_ids"][chosen] != only_random["labels"][chosen]
    assert changed.float().mean() > 0.98  # a random draw can equal the original token (1 in 995)


def test_randomness_comes_from_torch_global_rng(sample_tokenizer):
    features = make_features(sample_tokenizer, [64] * 16)
    collator = DataCollatorForPretraining(sample_tokenizer)
    torch.manual_seed(7)
    first = collator(features)
    state = torch.get_rng_state()
    second = collator(features)
    torch.manual_seed(7)
    assert torch.equal(collator(features)["input_ids"], first["input_ids"])
    torch.set_rng_state(state)
    assert torch.equal(collator(features)["labels"], second["labels"])
    assert not torch.equal(first["labels"], second["labels"])


def test_invalid_probabilities_are_rejected(sample_tokenizer):
    with pytest.raises(ValueError, match="should not exceed 1"):
        DataCollatorForPretraining(sample_tokenizer, mask_replace_prob=0.8, random_replace_prob=0.3)
    with pytest.raises(ValueError, match="pad_to_multiple_of 0"):
        DataCollatorForPretraining(sample_tokenizer, pad_to_multiple_of=0)
    with pytest.raises(ValueError, match=r"mlm_probability 1\.5"):
        DataCollatorForPretraining(sample_tokenizer, mlm_probability=1.5)
    with pytest.raises(ValueError, match="longer than pad_to_length 8"):
        DataCollatorForPretraining(sample_tokenizer, pad_to_length=8)(make_features(sample_tokenizer, [9]))


def with_draws(features, draws):
    return [{**feature, DRAW_KEY: draw} for feature, draw in zip(features, draws, strict=True)]


def test_draw_ids_decide_the_masks_and_the_global_rng_is_untouched(sample_tokenizer):
    features = with_draws(make_features(sample_tokenizer, [64] * 16), range(100, 116))
    collator = DataCollatorForPretraining(sample_tokenizer, seed=3)
    state = torch.get_rng_state()
    first = collator(features)
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(99)  # whatever the global RNG holds
    assert all(torch.equal(first[key], value) for key, value in collator(features).items())
    other_draws = collator(with_draws(features, range(200, 216)))
    other_seed = DataCollatorForPretraining(sample_tokenizer, seed=4)(features)
    assert not torch.equal(first["labels"], other_draws["labels"])
    assert not torch.equal(first["labels"], other_seed["labels"])


def test_columns_give_the_same_batch_as_rows(sample_tokenizer):
    rows = with_draws(make_features(sample_tokenizer, [20, 64, 33]), [5, 6, 7])
    columns = {key: [row[key] for row in rows] for key in rows[0]}
    collator = DataCollatorForPretraining(sample_tokenizer, max_predictions_per_seq=12)
    from_rows, from_columns = collator(rows), collator(columns)
    assert all(torch.equal(from_rows[key], from_columns[key]) for key in from_rows)


def test_static_shapes_pad_rows_and_fill_the_batch(sample_tokenizer):
    features = with_draws(make_features(sample_tokenizer, [20, 64, 33]), [0, 1, 2])
    collator = DataCollatorForPretraining(
        sample_tokenizer, pad_to_length=128, pad_to_batch_size=5, max_predictions_per_seq=20
    )
    batch = collator(features)
    assert batch["input_ids"].shape == (5, 128)
    assert batch["masked_positions"].shape == batch["labels"].shape == (5, 20)
    assert batch["next_sentence_label"].tolist() == [0, 1, 0, -100, -100]
    assert batch["attention_mask"].sum(dim=1).tolist() == [20, 64, 33, 0, 0]
    assert (batch["labels"][3:] == -100).all() and (batch["input_ids"][3:] == sample_tokenizer.pad_token_id).all()
    # The static form is the dynamic masks gathered at their positions (no row here has more than 20).
    dynamic = DataCollatorForPretraining(sample_tokenizer, pad_to_length=128, pad_to_batch_size=5)(features)
    masked = batch["labels"] != -100
    assert masked.sum() == (dynamic["labels"] != -100).sum()
    gathered = dynamic["labels"].gather(1, batch["masked_positions"])
    assert torch.equal(gathered[masked], batch["labels"][masked])
    assert torch.equal(dynamic["input_ids"], batch["input_ids"])


def test_default_static_slots_cover_almost_every_masked_token():
    assert default_max_predictions(128, 0.15) == 32
    assert default_max_predictions(512, 0.15) == 104
    assert default_max_predictions(16, 0.5) == 16  # never more slots than tokens


def test_epoch_draws_are_a_permutation_per_epoch_and_evaluation_draws_never_change():
    sampler = EpochDraws(10, seed=1)
    first = list(sampler)
    assert sorted(first) == list(range(10)) and first == list(sampler)
    sampler.set_epoch(2)
    third = list(sampler)
    assert sorted(third) == list(range(20, 30)) and [d - 20 for d in third] != first
    fixed = EpochDraws(10, seed=1, shuffle=False)
    fixed.set_epoch(3)
    assert list(fixed) == list(range(10))


def test_epoch_draws_keep_torchs_permutation_without_a_python_list_of_every_index():
    sampler = EpochDraws(2_000_000, seed=7)
    sampler.set_epoch(1)
    tracemalloc.start()
    try:
        draws = iter(sampler)
        first = [next(draws) for _ in range(1000)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # A list of 2M Python ints is ~70 MB of Python objects; torch's int64 tensor is not Python memory.
    assert peak < 10_000_000
    # The same order as before (batches of a given seed are unchanged): torch.randperm seeded by seed + epoch.
    expected = torch.randperm(2_000_000, generator=torch.Generator().manual_seed(8))[:1000] + 2_000_000
    assert first == expected.tolist() and all(type(draw) is int for draw in first)
    assert sorted(EpochDraws(100_003, seed=1)) == list(range(100_003))


def test_a_loader_with_workers_builds_the_same_batches(sample_tokenizer):
    features = make_features(sample_tokenizer, [30, 64, 128, 90, 17, 50, 77, 128, 64, 33] * 3)
    instances = datasets.Dataset.from_list(features)
    assert InstanceDraws(instances)[31] == {**features[1], DRAW_KEY: 31}

    def batches(num_workers):
        sampler = EpochDraws(len(instances), seed=5)
        sampler.set_epoch(1)
        loader = DataLoader(
            InstanceDraws(instances),
            batch_size=8,
            sampler=sampler,
            num_workers=num_workers,
            collate_fn=DataCollatorForPretraining(sample_tokenizer, seed=5),
        )
        return list(loader)

    in_process, in_workers = batches(0), batches(2)
    assert len(in_process) == 4
    for one, other in zip(in_process, in_workers, strict=True):
        assert all(torch.equal(one[key], other[key]) for key in one)


def built_loaders(tokenizer, data, optimization, device: str):
    """What `build_loaders` makes for `device` (a device object: no GPU needed) from 64 short documents' drawn
    instances and a few written ones."""
    from hfbert.pretraining.batches import build_loaders
    from hfbert.pretraining.data import tokenize_documents
    from hfbert.pretraining.instances import InstanceRecipe, draw_training_instances

    paragraph = " ".join(["The cat sat on the mat . It was warm there ."] * 10)
    tokenized = tokenize_documents(datasets.Dataset.from_dict({"paragraphs": [[paragraph]] * 64}), tokenizer)
    recipe = InstanceRecipe("mlm+nsp", tokenizer.cls_token_id, tokenizer.sep_token_id, data.max_seq_length)
    train = draw_training_instances(tokenized, recipe, passes=1)
    evaluation = datasets.Dataset.from_list(make_features(tokenizer, [20] * 4))
    return build_loaders(data, optimization, 16, torch.device(device), tokenizer, train, evaluation)


def test_the_loaders_decide_every_shape_once(sample_tokenizer):
    from hfbert.pretraining.settings import DataSettings, OptimizationSettings

    def plan(data, optimization, device):
        batches, eval_loader = built_loaders(sample_tokenizer, data, optimization, device)
        loader, collator = batches.loader, batches.loader.collate_fn
        assert len(batches.loader.dataset) >= optimization.per_device_train_batch_size  # a full batch to keep
        return SimpleNamespace(
            max_predictions_per_seq=collator.max_predictions_per_seq,
            pad_to_length=collator.pad_to_length,
            drop_last=loader.drop_last,
            num_workers=loader.num_workers,
            pin_memory=loader.pin_memory,
            fill_eval_batches=eval_loader.collate_fn.pad_to_batch_size == 16,
        )

    data = DataSettings(max_seq_length=128)
    plain = plan(data, OptimizationSettings(per_device_train_batch_size=8), "cpu")
    assert (plain.max_predictions_per_seq, plain.pad_to_length, plain.drop_last, plain.num_workers) == (None, None, False, 0)
    assert not plain.fill_eval_batches and not plain.pin_memory
    compiled = plan(data, OptimizationSettings(torch_compile=True), "cpu")
    assert (compiled.max_predictions_per_seq, compiled.pad_to_length) == (32, 128)  # static slots, full rows
    assert compiled.drop_last and compiled.fill_eval_batches
    on_gpu = plan(data, OptimizationSettings(), "cuda")
    assert on_gpu.max_predictions_per_seq == 32 and on_gpu.pin_memory and on_gpu.num_workers >= 1
    assert on_gpu.pad_to_length == 128 and on_gpu.drop_last  # the update compiles by default on CUDA
    eager_gpu = plan(data, OptimizationSettings(torch_compile=False), "cuda")
    assert eager_gpu.max_predictions_per_seq == 32 and eager_gpu.pad_to_length is None  # static slots, dynamic lengths
    asked_for = DataSettings(max_predictions_per_seq=20, dataloader_num_workers=2)
    asked = plan(asked_for, OptimizationSettings(), "cpu")
    assert (asked.max_predictions_per_seq, asked.num_workers) == (20, 2)


# ------------------------------------------------------------------------------------- whole-word masking


def word_rows(tokenizer, rows=64, words_per_row=30, seed=0):
    """Hand-made rows of whole words ([CLS] words [SEP] words [SEP]), some of several '##' pieces, and the
    word of every position (-1 for special tokens)."""
    vocabulary = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    pieces = [i for i, token in enumerate(vocabulary) if token.startswith("##")]
    heads = [
        i for i, token in enumerate(vocabulary) if token.isalpha() and i not in tokenizer.all_special_ids
    ]
    generator = torch.Generator().manual_seed(seed)
    features, words = [], []
    for _ in range(rows):
        ids, word_of = [tokenizer.cls_token_id], [-1]
        for word in range(words_per_row):
            length = 1 + int(torch.randint(3, (1,), generator=generator))  # 1 to 3 tokens
            ids.append(heads[int(torch.randint(len(heads), (1,), generator=generator))])
            ids += [
                pieces[int(torch.randint(len(pieces), (1,), generator=generator))] for _ in range(length - 1)
            ]
            word_of += [word] * length
            if word == words_per_row // 2 - 1:
                ids.append(tokenizer.sep_token_id)
                word_of.append(-1)
        ids.append(tokenizer.sep_token_id)
        word_of.append(-1)
        half = ids.index(tokenizer.sep_token_id) + 1
        features.append({"input_ids": ids, "token_type_ids": [0] * half + [1] * (len(ids) - half)})
        words.append(word_of)
    return features, words


def chosen_words(labels, words):
    """Per row, {word: [chosen?] for each of its tokens}."""
    per_row = []
    for row, word_of in zip(labels.tolist(), words, strict=True):
        tokens = {}
        for label, word in zip(row, word_of, strict=False):  # rows are padded past their words
            if word >= 0:
                tokens.setdefault(word, []).append(label != -100)
        per_row.append(tokens)
    return per_row


def test_whole_word_masking_chooses_whole_words_at_the_rate(sample_tokenizer):
    features, words = word_rows(sample_tokenizer, rows=400)
    collator = DataCollatorForPretraining(sample_tokenizer, whole_word_masking=True, pad_to_multiple_of=None)
    batch = collator(with_draws(features, range(400)))
    per_row = chosen_words(batch["labels"], words)
    # A word's continuations are masked exactly when its first token is.
    assert all(len(set(tokens)) == 1 for row in per_row for tokens in row.values())
    chosen = [tokens[0] for row in per_row for tokens in row.values()]
    assert abs(sum(chosen) / len(chosen) - 0.15) < 0.015  # 12,000 words: binomial sd 0.003
    assert any(sum(tokens) > 1 for row in per_row for tokens in row.values())  # multi-token words masked
    # 80/10/10 per token: [MASK], a random token, unchanged.
    ids = torch.nn.utils.rnn.pad_sequence([torch.tensor(f["input_ids"]) for f in features], batch_first=True)
    labelled = batch["labels"] != -100
    as_mask = (batch["input_ids"][labelled] == sample_tokenizer.mask_token_id).float().mean()
    unchanged = (batch["input_ids"][labelled] == ids[labelled]).float().mean()
    assert abs(as_mask - 0.8) < 0.03 and 0.07 < unchanged < 0.15
    # Token-level masking of the same rows splits words.
    token_level = DataCollatorForPretraining(sample_tokenizer, pad_to_multiple_of=None)(
        with_draws(features, range(400))
    )
    assert any(
        len(set(tokens)) > 1 for row in chosen_words(token_level["labels"], words) for tokens in row.values()
    )


def test_whole_word_masks_are_reproduced_by_draw_id(sample_tokenizer):
    features, _ = word_rows(sample_tokenizer, rows=16)
    collator = DataCollatorForPretraining(sample_tokenizer, whole_word_masking=True, seed=3)
    first = collator(with_draws(features, range(16)))
    torch.manual_seed(99)
    again = collator(with_draws(features, range(16)))
    assert all(torch.equal(first[key], again[key]) for key in first)
    other = collator(with_draws(features, range(16, 32)))
    assert not torch.equal(first["labels"], other["labels"])


def test_static_slots_drop_whole_words(sample_tokenizer):
    features, words = word_rows(sample_tokenizer, rows=64)
    draws = with_draws(features, range(64))
    collator = DataCollatorForPretraining(
        sample_tokenizer, whole_word_masking=True, mlm_probability=0.5, max_predictions_per_seq=8
    )
    batch = collator(draws)
    assert batch["masked_positions"].shape == (64, 8)
    dense = torch.full(batch["input_ids"].shape, -100)
    dense.scatter_(1, batch["masked_positions"], batch["labels"])
    dense[:, 0] = -100  # empty slots point at position 0 ([CLS]) with label -100
    per_row = chosen_words(dense, words)
    assert all(len(set(tokens)) == 1 for row in per_row for tokens in row.values())
    kept = (batch["labels"] != -100).sum(dim=1)
    assert kept.max() <= 8 and kept.float().mean() > 5  # about half of 45 tokens chosen: the slots fill up
    # A dropped word is shown unchanged; the kept ones are the dynamic path's masks.
    dynamic = DataCollatorForPretraining(sample_tokenizer, whole_word_masking=True, mlm_probability=0.5)(
        draws
    )
    masked = dense != -100
    assert torch.equal(batch["input_ids"][masked], dynamic["input_ids"][masked])
    ids = torch.nn.utils.rnn.pad_sequence([torch.tensor(f["input_ids"]) for f in features], batch_first=True)
    ids = torch.nn.functional.pad(ids, (0, batch["input_ids"].shape[1] - ids.shape[1]))
    assert torch.equal(
        batch["input_ids"][~masked & (batch["attention_mask"] == 1)],
        ids[~masked & (batch["attention_mask"] == 1)],
    )
