"""Recipes (issue 43 item 1): every shipped recipe parses and passes the checks before work on the shipped
sample, the command line overrides a recipe, a bad recipe is refused in one line naming the file and the key,
--list_recipes lists them, and a run records its recipe."""

import json
import logging
import re
import shlex
from pathlib import Path

import pytest
import yaml
from accelerate.state import AcceleratorState, GradientState
from conftest import tiny_config

from hfbert.corpus_arguments import SHIPPED_SAMPLE_DIR, SHIPPED_SAMPLE_FILES
from hfbert.errors import Refusal
from hfbert.modeling_hfbert import HfBertForPreTraining
from hfbert.pretraining.cli import RECIPES_DIR, main, parse_args, recipe_summary, shipped_recipes

REPO = Path(__file__).resolve().parents[1]
SAMPLE = [
    "--train_file", str(SHIPPED_SAMPLE_DIR / SHIPPED_SAMPLE_FILES["train"]),
    "--validation_file", str(SHIPPED_SAMPLE_DIR / SHIPPED_SAMPLE_FILES["validation"]),
]  # fmt: skip
HEADER_LINES = ("Reproduces", "Measured", "Command")


def readme_command(marker: str) -> list[str]:
    """The run_pretraining.py flags of the README's command that follows `marker`."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = text[text.index(marker) :]
    line = next(line for line in block.splitlines() if "run_pretraining.py" in line)
    words = shlex.split(line)
    return words[words.index("run_pretraining.py") + 1 :]


@pytest.fixture(scope="module")
def source_folder(tmp_path_factory, run_inputs, sample_tokenizer) -> Path:
    """A tiny model folder with its tokenizer, for the recipes that start from weights (not trained: the checks
    before work read its files, not what it learned)."""
    folder = tmp_path_factory.mktemp("source") / "model"
    HfBertForPreTraining(tiny_config(vocab_size=len(sample_tokenizer), max_position_embeddings=512)).save_pretrained(folder)
    sample_tokenizer.save_pretrained(folder)
    return folder


def test_the_recipes_are_shipped_and_each_has_a_header():
    assert set(shipped_recipes()) >= {
        "quick-start", "quality-10min", "bert-base-phase1", "bert-base-phase2", "bert-large-phase1",
        "bert-large-phase2", "roberta-mlm", "continued-pretraining", "own-text",
    }  # fmt: skip
    for name, path in shipped_recipes().items():
        header = [line for line in path.read_text().splitlines() if line.startswith("#")]
        assert recipe_summary(path) != "(no header comment)", name
        for word in HEADER_LINES:
            assert any(line.startswith(f"# {word}") for line in header), f"{name}: no '# {word}' line"
        assert any("not run here" in line or "Measured: a " in line for line in header), name


@pytest.mark.parametrize("name", sorted(shipped_recipes()))
def test_every_shipped_recipe_parses_and_passes_a_dry_run(name, tmp_path, run_inputs, source_folder, capsys):
    """A recipe that names a Hub corpus is checked on the shipped sample, given on the command line (which
    replaces the recipe's corpus); one that names a tokenizer or a source folder gets the test's own."""
    values = yaml.safe_load((RECIPES_DIR / f"{name}.yaml").read_text())
    argv = ["--recipe", name, "--output_dir", str(tmp_path / "run")]
    if "dataset_name" in values or "train_file" in values:
        argv += SAMPLE
    if "tokenizer_name" in values:
        argv += ["--tokenizer_name", str(run_inputs["tokenizer"])]
    if "model_name_or_path" in values:
        argv += ["--model_name_or_path", str(source_folder)]
    settings = parse_args(argv)
    assert settings.output.recipe == name
    overridden = {"dataset_name", "dataset_config_name", "tokenizer_name", "model_name_or_path"}
    flat = settings.to_dict()
    for key, value in values.items():
        if key not in overridden:
            assert flat[key] == (str(value) if key == "checkpointing_steps" else value), key
    try:
        main([*argv, "--dry_run"])  # every check before work, then the plan
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
    plan = capsys.readouterr().out
    steps = settings.optimization.max_train_steps
    assert plan.startswith("Plan (--dry_run") and ("updates: " if steps is None else f"updates: {steps:,};") in plan
    assert "resume: none, a fresh start" in plan  # resume 'auto' on a new folder
    assert not (tmp_path / "run").exists()  # nothing written


@pytest.mark.parametrize(
    ("recipe", "marker"),
    [("quick-start", "<!-- doc-test: tiny"), ("quality-10min", "<!-- doc-test: parse")],
)
def test_the_readme_recipes_are_the_readmes_commands(recipe, marker):
    """The README's two commands are the quick-start and quality recipes, with an output folder only."""
    command = readme_command(marker)
    assert command[:2] == ["--recipe", recipe] and command[2] == "--output_dir" and len(command) == 4


def header_command(path: Path) -> list[str]:
    """The run_pretraining.py arguments of a recipe file's "# Command:" header line."""
    (line,) = [line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("# Command:")]
    words = shlex.split(line.removeprefix("# Command:"))
    assert "run_pretraining.py" in words, f"{path.name}: its '# Command:' line runs no run_pretraining.py: {line}"
    return words[words.index("run_pretraining.py") + 1 :]


@pytest.mark.parametrize("name", sorted(shipped_recipes()))
def test_every_recipe_header_command_is_the_recipe_itself(name):
    """A recipe's "# Command:" line names the recipe (so it cannot drift from the file) and overrides none of
    its values; the flags it adds (the output folder, a corpus to give) parse."""
    path = shipped_recipes()[name]
    arguments = header_command(path)
    assert arguments[:2] == ["--recipe", name], f"{path.name}: '# Command:' should start --recipe {name}: {arguments}"
    settings = parse_args(arguments)
    assert settings.output.recipe == name
    flat = settings.to_dict()
    for key, value in yaml.safe_load(path.read_text()).items():
        if f"--{key}" not in arguments:
            assert flat[key] == (str(value) if key == "checkpointing_steps" else value), f"{path.name}: {key}"
        else:
            assert key in {"train_file", "dataset_name"}, f"{path.name}: '# Command:' overrides the recipe's {key}"


def test_the_own_text_recipe_is_the_quick_starts_flags():
    """What benchmarks/results/own_text.md measured and the README says: the quick start's run on another corpus."""
    own, quick = (yaml.safe_load((RECIPES_DIR / f"{name}.yaml").read_text()) for name in ("own-text", "quick-start"))
    assert own == quick and "train_file" not in own  # the corpus is the user's --train_file


def test_every_recipe_from_the_structured_start_is_named_where_the_start_is_explained():
    """--attention_init's help and docs/pretraining.md's Initialisation item list the recipes that start there (they
    listed quick-start and quality-10min after own-text, a third, had come)."""
    from hfbert.pretraining.cli import build_parser

    structured = sorted(
        name for name, path in shipped_recipes().items() if yaml.safe_load(path.read_text()).get("attention_init") == "structured"
    )
    (action,) = [action for action in build_parser()._actions if "--attention_init" in action.option_strings]
    doc = (Path(__file__).resolve().parents[1] / "docs" / "pretraining.md").read_text()
    (item,) = [block for block in doc.split("\n- ") if block.startswith("**Initialisation.**")]
    assert len(structured) >= 3
    for name in structured:
        assert name in " ".join(action.help.split()), f"--attention_init's help does not name {name}"
        assert f"`{name}`" in item or f"{name} " in item, f"docs/pretraining.md's Initialisation does not name {name}"


def test_the_command_line_overrides_the_recipe():
    settings = parse_args(["--recipe", "quick-start", "--output_dir", "o", "--learning_rate", "2e-3", "--max_train_steps=10"])
    assert settings.optimization.learning_rate == 2e-3 and settings.optimization.max_train_steps == 10
    assert settings.optimization.num_warmup_steps == 200  # the recipe's
    # a corpus on the command line replaces the recipe's whole corpus (its --dataset_config_name too)
    settings = parse_args(["--recipe", "bert-base-phase1", "--output_dir", "o", *SAMPLE])
    assert settings.corpus.dataset_name is None and settings.corpus.dataset_config_name is None
    assert settings.corpus.train_file == SAMPLE[1] and settings.model.model_size == "base"


def test_a_recipe_file_as_the_one_argument_is_the_same_as_recipe(tmp_path):
    """As transformers' examples take `python run_mlm.py args.json`; JSON too."""
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"model_size": "tiny", "learning_rate": 1e-3, "output_dir": str(tmp_path / "run")}))
    positional, flagged = parse_args([str(path)]), parse_args(["--recipe", str(path)])
    assert positional.to_dict() == flagged.to_dict()
    assert positional.output.recipe == str(path) and positional.model.model_size == "tiny"
    assert positional.optimization.learning_rate == 1e-3 and positional.output.output_dir == str(tmp_path / "run")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("learning_rate: 1.0e-3\nlerning_rate: 3\n", "{path}: key lerning_rate is not a run_pretraining.py flag"),
        ("learning_rate: -1\n", "{path}, key learning_rate: --learning_rate -1.0 must be > 0"),
        ("max_train_steps: 1.5\n", "{path}, key max_train_steps: argument --max_train_steps/--max-train-steps: invalid int value: '1.5'"),
        ("model_size: huge\n", "{path}, key model_size: argument --model_size/--model-size: invalid choice: 'huge'"),
        ("learning_rate: null\n", "{path}: key learning_rate: null, and --learning_rate cannot be unset"),
        ("recipe: quick-start\n", "{path}: key recipe: a recipe cannot name another recipe"),
        ("- model_size\n", "{path}: holds no mapping of flag names to values"),
    ],
)
def test_a_bad_recipe_is_refused_in_one_line_naming_the_file_and_the_key(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(Refusal) as error:
        parse_args(["--recipe", str(path), "--output_dir", "o"])
    assert message.format(path=path) in str(error.value) and "\n" not in str(error.value)


def test_a_recipe_that_is_not_utf8_text_is_refused_in_one_line_naming_it(tmp_path):
    """It ended in a UnicodeDecodeError traceback."""
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00b")
    with pytest.raises(Refusal) as error:
        parse_args(["--recipe", str(path), "--output_dir", "o"])
    assert str(error.value).startswith(f"recipe {path}: not valid YAML: 'utf-8' codec can't decode byte 0xff")
    assert "\n" not in str(error.value)


# A billion laughs cut to 9**4 leaves: its value, printed expanded, was a 53 KB line (the 442-byte one
# ran 52 s into a MemoryError traceback), though the file is 188 bytes.
YAML_BOMB = (
    "learning_rate: [&a [lol, lol, lol, lol, lol, lol, lol, lol, lol], &b [*a, *a, *a, *a, *a, *a, *a, *a, *a],\n"
    "  &c [*b, *b, *b, *b, *b, *b, *b, *b, *b], [*c, *c, *c, *c, *c, *c, *c, *c, *c]]\n"
)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("bomb.yaml", YAML_BOMB, "{path}: line 1: YAML anchors and aliases (&name, *name) are not read in a recipe "
         "(an alias can expand a small file to gigabytes); write each value out"),
        ("alias.yaml", "learning_rate: &rate 1.0e-3\nweight_decay: *rate\n", "{path}: line 1: YAML anchors "
         "and aliases (&name, *name) are not read in a recipe (an alias can expand a small file to gigabytes); write "
         "each value out"),
        ("deep.yaml", "learning_rate: " + "[" * 100_000 + "]" * 100_000 + "\n",
         "{path}: line 1: nested deeper than a recipe's values go (a recipe maps flag names to single values)"),
        ("deep.json", '{"learning_rate": ' + "[" * 100_000 + "]" * 100_000 + "}",
         "{path}: nested deeper than Python's JSON parser reads (a recipe maps flag names to single values)"),
        ("long.yaml", "learning_rate: [" + "1, " * 1000 + "1]\n", "{path}: key learning_rate: [1, 1, 1, 1, 1, 1, "
         "...] is not a single value"),
    ],
)  # fmt: skip
def test_a_recipe_of_aliases_deep_nesting_or_a_long_list_is_refused_in_one_short_line(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(Refusal) as error:
        parse_args(["--recipe", str(path), "--output_dir", "o"])
    assert str(error.value) == "recipe " + message.format(path=path)


def test_a_tokenizer_on_the_command_line_replaces_the_recipe_s_and_both_in_one_place_are_refused(tmp_path):
    """As a corpus source does: --tokenizer_name replaces a recipe's --vocab_size (a tokenizer to train), and
    --vocab_size a recipe's --tokenizer_name; both given in the recipe, or both on the command line, are refused."""
    settings = parse_args(["--recipe", "quick-start", "--output_dir", "o", "--tokenizer_name", "tok"])
    assert settings.data.tokenizer_name == "tok" and settings.data.vocab_size is None
    settings = parse_args(["--recipe", "bert-base-phase1", "--output_dir", "o", "--vocab_size", "8192", *SAMPLE])
    assert settings.data.tokenizer_name is None and settings.data.vocab_size == 8192
    path = tmp_path / "both.yaml"
    path.write_text("tokenizer_name: tok\nvocab_size: 8192\n")
    with pytest.raises(Refusal, match=rf"^recipe {path}, key vocab_size, tokenizer_name: --vocab_size 8192 only sizes"):
        parse_args(["--recipe", str(path), "--output_dir", "o"])


def test_an_out_of_range_value_on_the_command_line_is_not_blamed_on_the_recipe():
    with pytest.raises(Refusal) as error:
        parse_args(["--recipe", "quick-start", "--output_dir", "o", "--learning_rate", "-1"])
    assert str(error.value) == "--learning_rate -1.0 must be > 0"


def test_an_unknown_recipe_is_refused_listing_the_shipped_ones():
    with pytest.raises(Refusal) as error:
        parse_args(["--recipe", "bert-huge", "--output_dir", "o"])
    assert str(error.value).startswith("--recipe bert-huge is neither a shipped recipe (")
    assert all(name in str(error.value) for name in shipped_recipes())
    with pytest.raises(Refusal, match=re.escape("--recipe missing.yaml: no such file")):
        parse_args(["--recipe", "missing.yaml", "--output_dir", "o"])


def test_list_recipes_prints_one_a_line_its_name_first(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--list_recipes"])
    assert exit_info.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(shipped_recipes())
    for line, path in zip(lines, shipped_recipes().values(), strict=True):
        assert line.endswith(recipe_summary(path)) and len(recipe_summary(path)) > 20


@pytest.mark.slow
def test_the_quick_recipe_runs_cut_short_and_records_its_recipe(tmp_path):
    """The quick start's recipe at the README doc-test's budget; training_args.json and the model card name it."""
    output_dir = tmp_path / "run"
    cut_short = ["--max_train_steps", "2", "--eval_steps", "2", "--checkpointing_steps", "2"]
    try:
        main(["--recipe", "quick-start", "--output_dir", str(output_dir), "--mixed_precision", "no", *cut_short])
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
    recorded = json.loads((output_dir / "training_args.json").read_text())
    assert recorded["recipe"] == "quick-start"
    assert recorded["max_train_steps"] == 2 and recorded["structured_attention_fade"] == 1.0  # override, recipe
    assert "| recipe | `quick-start` |" in (output_dir / "README.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize(("shape", "articles"), [("folder", 12), ("glob", 8)])
def test_the_own_text_recipe_trains_a_few_files_with_the_default_split(tmp_path, sample_documents, caplog, shape, articles):
    """The README's own-text command on a first try with a dozen articles (a folder) or 8 (a glob), at the doc
    test's budget: 5% rounds to one document, NSP needs two, so two are held out (one INFO line) and it trains."""
    texts = tmp_path / "my_texts"
    texts.mkdir()
    for number, row in enumerate(sample_documents["train"].select(range(articles))):
        (texts / f"article{number:02}.txt").write_text("\n".join(row["paragraphs"]) + "\n", encoding="utf-8")
    if shape == "glob":
        (texts / "notes.md").write_text("Not a text of the glob.\n", encoding="utf-8")
    corpus = f"{texts}/" if shape == "folder" else f"{texts}/*.txt"
    output_dir = tmp_path / "run"
    cut_short = ["--max_train_steps", "2", "--eval_steps", "2", "--checkpointing_steps", "2"]
    try:
        with caplog.at_level(logging.INFO, "hfbert"):
            main(["--recipe", "own-text", "--train_file", corpus, "--output_dir", str(output_dir), *cut_short])
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
    assert json.loads((output_dir / "eval_results.json").read_text())["step"] == 2
    assert f"holds out 1 of the {articles} documents" in caplog.text
    assert f"so 2 are held out for validation and {articles - 2} train" in caplog.text
    statistics = json.loads((output_dir / "run_health.json").read_text())["statistics"]
    assert statistics["documents"] == articles - 2
