"""`vaswani-train`: train the Transformer with the paper's recipe (§5), then average, translate the test split and
score it (§6.1). `vaswani-train --help` lists every flag by group: the recipe's first, then the rest of
Seq2SeqTrainingArguments', all of which work."""

from ..recipe.arguments import (
    RENAMED,
    DataArguments,
    FinishArguments,
    ModelArguments,
    ModelConfigArguments,
    PaperTrainingArguments,
    config_overrides,
)
from .cli import command, parse_args, setup_logging

DESCRIPTION = """\
Train the Transformer of "Attention Is All You Need" with the paper's recipe (§5: joint BPE, token-budget batches,
Adam with warm-up, label smoothing), then average the last checkpoints, translate the test split with beam search and
score it (§6.1). The paper's values are the defaults; any VaswaniConfig field is a flag (--d_model 256 --dropout 0.3).
"""

EPILOG = """\
examples:
  vaswani-train --dataset_name ../shared/data/multi30k --validation_split val --test_split test_2016_flickr \\
      --source_lang de --target_lang en --preset small --vocab_size 8000 --max_train_minutes 10 --average_last 5 \\
      --output_dir runs/de-en
  vaswani-train run.yaml --seed 2               (flags from a YAML or JSON file; flags given here override it)
  torchrun --nproc_per_node 8 -m vaswani.commands.train recipes/wmt14_en_de_base.yaml
                                                (the paper's WMT 2014 en-de base run; recipes/README.md)
"""

# The Hub's WMT 2014 datasets, whose test split is the paper's newstest2014.
WMT14 = ("wmt14", "wmt/wmt14")


def comparable_to(scores):
    """What the lowercased Moses-tokenized BLEU and the paper's tokenized BLEU of a run's test scores can be compared
    with, from the data they were computed on (`dataset`, `split` of `test_results.json`): published Multi30k figures
    only on Multi30k, the paper's Table 2 only on WMT 2014's whole test split; otherwise the same measure of the same
    test pairs."""
    dataset, split = str(scores.get("dataset") or ""), str(scores.get("split") or "")
    same = f"comparable only with the same measure on {split} of {dataset}"
    multi30k = "multi30k" in dataset.lower() and "[" not in split
    moses = (
        f"the convention of published Multi30k figures, comparable with them on {split}" if multi30k else same
    )
    newstest2014 = dataset.lower() in WMT14 and split == "test"
    paper = "comparable with its newstest2014 figures" if newstest2014 else same
    return moses, f"the paper's measure, {paper}; never with sacreBLEU"


@command("vaswani-train")
def main(argv):
    # --help lists the groups in this order: the model, the data, the recipe, what follows training; the common
    # flags; then the rest of the Trainer's flags.
    model_args, config_args, data_args, training_args, finish_args = parse_args(
        [ModelArguments, ModelConfigArguments, DataArguments, PaperTrainingArguments, FinishArguments],
        argv,
        description=DESCRIPTION,
        epilog=EPILOG,
        renamed=RENAMED,
    )
    setup_logging(main_process=training_args.process_index == 0)
    # the training code (datasets, the model, the Trainer): only when the tool runs, not for --help
    from ..recipe.finish import degenerate_translations_warning, finish
    from ..recipe.run import train_main
    from ..recipe.run_folder import release_output_dir

    try:
        trainer = train_main(model_args, data_args, training_args, config_overrides(config_args), finish_args)
        scores = finish(trainer, data_args, finish_args)
    finally:  # the run's lock on its folder (run_folder.lock_output_dir)
        release_output_dir(training_args.output_dir)
    if scores:
        print(
            f"\n{scores['split']}: BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}  (sacreBLEU, detokenized)"
        )
        print(f"  {scores['bleu_signature']}")
        moses, paper = comparable_to(scores)
        if "bleu_lowercase_moses_tokenized" in scores:
            print(
                f"  lowercased Moses-tokenized BLEU ({moses}): {scores['bleu_lowercase_moses_tokenized']:.2f}"
            )
        if "bleu_tokenized" in scores:
            print(f"  tokenized BLEU, compounds split ({paper}): {scores['bleu_tokenized']:.2f}")
            print(f"  {scores['bleu_tokenized_signature']}")
        print(f"  translations: {scores['hypotheses']}")
        if warning := degenerate_translations_warning(scores):
            print(f"  warning: {warning}")
    return trainer


if __name__ == "__main__":
    main()
