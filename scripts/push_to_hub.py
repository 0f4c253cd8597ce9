"""Publish a trained model folder to the Hugging Face Hub, or write the folder that would be published.

    python scripts/push_to_hub.py --model_dir runs/de-en --repo_id you/vaswani-de-en \
        --results_json runs/de-en/test_results.json --training_summary_json runs/de-en/training_summary.json

    # the same folder, written locally and not pushed:
    python scripts/push_to_hub.py --model_dir runs/de-en --repo_id you/vaswani-de-en --dry_run --output_dir hub/

The token comes from `--token`, else `HF_TOKEN`, else `hf auth login`. All the work is `vaswani.hub.publish`.
"""

import logging
import sys
from dataclasses import dataclass, field

from transformers import HfArgumentParser

from vaswani.hub import Published, publish

logger = logging.getLogger("push_to_hub")


@dataclass
class PushArguments:
    model_dir: str = field(metadata={"help": "The trained model folder (config.json, safetensors weights)."})
    repo_id: str | None = field(default=None, metadata={"help": "The Hub repo to push to, 'namespace/name'."})
    output_dir: str | None = field(
        default=None,
        metadata={
            "help": "Write the published folder here (must be new or empty). Alone, it means a dry run."
        },
    )
    dry_run: bool = field(default=False, metadata={"help": "Write the folder to --output_dir; push nothing."})
    tokenizer_dir: str | None = field(
        default=None, metadata={"help": "The tokenizer folder, if it is not saved in --model_dir."}
    )
    results_json: str | None = field(
        default=None,
        metadata={"help": "Evaluation results (bleu, bleu_signature, chrf, ...; see vaswani.hub)."},
    )
    training_summary_json: str | None = field(
        default=None,
        metadata={"help": "Training summary (source_lang, target_lang, steps, ...; see vaswani.hub)."},
    )
    private: bool = field(
        default=False, metadata={"help": "Create the repo as private (if it does not exist)."}
    )
    revision: str | None = field(default=None, metadata={"help": "Branch to push to (created if missing)."})
    create_pr: bool = field(default=False, metadata={"help": "Open a pull request instead of committing."})
    token: str | None = field(
        default=None, metadata={"help": "Hub token; default: HF_TOKEN or the saved login."}
    )
    commit_message: str | None = field(default=None, metadata={"help": "Message of the upload commit."})
    license: str = field(default="apache-2.0", metadata={"help": "License in the model card metadata."})
    card_template: str | None = field(
        default=None, metadata={"help": "Model card template; default hub_card.md."}
    )


def main(argv: list[str] | None = None) -> Published:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    (args,) = HfArgumentParser(PushArguments).parse_args_into_dataclasses(args=argv)
    published = publish(
        args.model_dir,
        repo_id=args.repo_id,
        output_dir=args.output_dir,
        dry_run=args.dry_run,
        tokenizer_dir=args.tokenizer_dir,
        results=args.results_json,
        summary=args.training_summary_json,
        private=args.private or None,  # None: the Hub's default visibility
        revision=args.revision,
        token=args.token,
        commit_message=args.commit_message,
        create_pr=args.create_pr,
        template_path=args.card_template,
        license=args.license,
    )
    if published.folder is not None:
        logger.info("Published folder: %s", published.folder)
    if published.commit is not None:
        logger.info("Pushed: %s", published.commit.commit_url)
    return published


if __name__ == "__main__":
    main(sys.argv[1:])
