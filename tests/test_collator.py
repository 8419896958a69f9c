import pytest
import torch

from hfbert.collator import DataCollatorForPretraining


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
    with pytest.raises(TypeError):
        DataCollatorForPretraining(sample_tokenizer, seed=1)  # randomness is torch's global RNG only


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
