"""`vaswani-push-to-hub`: publish a trained model folder to the Hugging Face Hub with its model card, or write the
folder that would be published.

The token comes from --hub_token, else `HF_TOKEN`, else `hf auth login`. All the work is `vaswani.publishing.hub.publish`; the
card template ships with the package (`vaswani/publishing/hub_card.md`).
"""

from dataclasses import dataclass

from transformers.hf_argparser import HfArg

from .cli import command, parse_args, setup_logging

DESCRIPTION = __doc__.replace("`vaswani-push-to-hub`: p", "P", 1)

EPILOG = """\
examples:
  vaswani-push-to-hub --model_name_or_path runs/de-en/averaged --hub_model_id you/vaswani-de-en \\
      --results_json runs/de-en/test_results.json --training_summary_json runs/de-en/training_summary.json
  vaswani-push-to-hub --model_name_or_path runs/de-en/averaged --hub_model_id you/vaswani-de-en --dry_run \\
      --output_dir hub/                       (the same folder, written locally and not pushed)
"""

RENAMED = {
    "model_dir": "model_name_or_path",
    "repo_id": "hub_model_id",
    "token": "hub_token",
    "private": "hub_private_repo",
    "revision": "hub_revision",
    "tokenizer_dir": "tokenizer_name",
}


@dataclass
class PushArguments:
    _argument_group_name = "publishing"

    model_name_or_path: str = HfArg(help="The trained model folder (config.json, safetensors weights).")
    hub_model_id: str | None = HfArg(default=None, help="The Hub repo to push to, 'namespace/name'.")
    output_dir: str | None = HfArg(
        default=None,
        help="Write the published folder here (must be new or empty). Alone, it means a dry run.",
    )
    dry_run: bool = HfArg(default=False, help="Write the folder to --output_dir; push nothing.")
    tokenizer_name: str | None = HfArg(
        default=None, help="The tokenizer folder, if it is not saved in --model_name_or_path."
    )
    results_json: str | None = HfArg(
        default=None,
        help="Evaluation results (bleu, bleu_signature, chrf, ...; see vaswani.publishing.model_card).",
    )
    training_summary_json: str | None = HfArg(
        default=None,
        help="Training summary (source_lang, target_lang, steps, ...; see vaswani.publishing.model_card).",
    )
    hub_private_repo: bool = HfArg(default=False, help="Create the repo as private (if it does not exist).")
    hub_revision: str | None = HfArg(default=None, help="Branch to push to (created if missing).")
    create_pr: bool = HfArg(default=False, help="Open a pull request instead of committing.")
    hub_token: str | None = HfArg(default=None, help="Hub token; default: HF_TOKEN or the saved login.")
    commit_message: str | None = HfArg(default=None, help="Message of the upload commit.")
    license: str | None = HfArg(
        default=None,
        help="License of the weights in the card's metadata (e.g. apache-2.0, cc-by-nc-4.0). Default: none "
        "chosen ('other'), the card saying that the training data's terms apply.",
    )
    dataset_tags: list[str] | None = HfArg(
        default=None,
        help="Hub ids of the training data, for the card, when it was read from a local copy "
        "(e.g. bentrevett/multi30k for a local Multi30k folder).",
    )
    card_template: str | None = HfArg(
        default=None, help="Model card template; default: the package's hub_card.md."
    )


@command("vaswani-push-to-hub")
def main(argv):
    (args,) = parse_args(PushArguments, argv, description=DESCRIPTION, epilog=EPILOG, renamed=RENAMED)
    setup_logging()
    from ..modeling_vaswani import VaswaniForConditionalGeneration
    from ..publishing.hub import check_model_dir, publish  # torch and transformers: only when the tool runs
    from ..recipe.model_folders import load_model
    from ..recipe.tokenization import load_model_tokenizers

    check_model_dir(args.model_name_or_path, args.tokenizer_name)  # a missing or corrupt file, named
    load_model_tokenizers(args.model_name_or_path, args.tokenizer_name)  # another run's tokenizer is refused
    published = publish(
        args.model_name_or_path,
        model=load_model(
            args.model_name_or_path, VaswaniForConditionalGeneration
        ),  # mismatched weights: refused
        repo_id=args.hub_model_id,
        output_dir=args.output_dir,
        dry_run=args.dry_run,
        tokenizer_dir=args.tokenizer_name,
        results=args.results_json,
        summary=args.training_summary_json,
        private=args.hub_private_repo or None,  # None: the Hub's default visibility
        revision=args.hub_revision,
        token=args.hub_token,
        commit_message=args.commit_message,
        create_pr=args.create_pr,
        template_path=args.card_template,
        license=args.license,
        dataset_tags=args.dataset_tags,
    )
    if published.commit is None:
        print(f"Dry run: wrote the folder to publish to {published.folder}; nothing was pushed")
    else:
        if published.folder is not None:
            print(f"Built the published folder in {published.folder}")
        print(f"Pushed: {published.commit.commit_url}")
    return published


if __name__ == "__main__":
    main()
