"""Push a finished run folder to the Hub without retraining.

    python -m hfbert.push runs/hfbert-mini-wikitext --hub_model_id your-name/hfbert-mini-wikitext

Uploads the final model, tokenizer, model card and curves (never checkpoints), as `--push_to_hub` does.
"""

from __future__ import annotations

from pathlib import Path

from hfbert.errors import Refusal
from hfbert.files import publish_files
from hfbert.flags import RefusingHfArgumentParser
from hfbert.model_card import check_hub_model_id, push_to_hub


def main(argv: list[str] | None = None) -> None:
    parser = RefusingHfArgumentParser(description=__doc__)
    parser.add_argument("run_dir", type=Path, help="output folder of a finished run_pretraining.py run")
    parser.add_argument("--hub_model_id", required=True, help="Hub repo id, e.g. your-name/hfbert-mini")
    parser.add_argument("--hub_token", default=None, help="Hub token (default: the logged-in one)")
    parser.add_argument("--private", action="store_true", help="create the repo as private")
    args = parser.parse_args(argv)
    check_hub_model_id(args.hub_model_id)  # before publish_files, which may finish an interrupted publication
    if not args.run_dir.is_dir():
        raise Refusal(f"{args.run_dir} is not a folder; pass the --output_dir of a finished run")
    publish_files(args.run_dir)  # completes a final folder whose publication was interrupted
    print(push_to_hub(args.run_dir, args.hub_model_id, token=args.hub_token, private=args.private))


if __name__ == "__main__":
    from hfbert.errors import run_cli

    run_cli(main, prog="python -m hfbert.push")
