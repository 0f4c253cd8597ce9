"""`vaswani-train-tokenizer`: train the byte-pair encoding vocabulary of §5.1 on the training split of a parallel
corpus.

The paper's vocabulary is joint ("shared source-target vocabulary"); `--separate_vocabularies` writes one per
language to `<output_dir>/source` and `<output_dir>/target`. Load the result with
`vaswani.recipe.tokenization.load_tokenizers(output_dir)`, or pass it to `vaswani-train --tokenizer_name`.
"""

import logging
from dataclasses import dataclass

from transformers.hf_argparser import HfArg

from ..common.errors import UsageError, require_positive
from ..recipe.arguments import DataArguments
from .cli import command, parse_args, setup_logging

logger = logging.getLogger(__name__)

DESCRIPTION = __doc__.replace("`vaswani-train-tokenizer`: t", "T", 1)

EPILOG = """\
examples:
  vaswani-train-tokenizer --dataset_name ../shared/data/multi30k --source_lang de --target_lang en \\
      --vocab_size 8000 --output_dir runs/tokenizer-multi30k
  vaswani-train-tokenizer --dataset_name wmt14 --dataset_config_name de-en --source_lang en --target_lang de \\
      --vocab_size 37000 --output_dir runs/tokenizer-wmt14          (§5.1: about 37000 tokens)
  vaswani-train-tokenizer ... --max_tokenizer_samples 1000000      (on 1M of the 4.5M pairs, drawn at random)
"""

RENAMED = {
    "source": "dataset_name",
    "src_lang": "source_lang",
    "tgt_lang": "target_lang",
    "dataset_config": "dataset_config_name",
    "separate_vocab": "separate_vocabularies",
}


@dataclass
class TokenizerArguments:
    _argument_group_name = "tokenizer"

    output_dir: str = HfArg(help="Folder to write the tokenizer(s) to.")
    target_vocab_size: int | None = HfArg(
        default=None, help="With --separate_vocabularies: target vocabulary size (default: --vocab_size)."
    )
    min_frequency: int = HfArg(default=2, help="Merge only pairs seen at least this often.")
    model_max_length: int = HfArg(default=1024, help="Length above which transformers warns.")

    def __post_init__(self):
        require_positive(self, "target_vocab_size", "min_frequency", "model_max_length")


@command("vaswani-train-tokenizer")
def main(argv):
    data_args, args = parse_args(
        [DataArguments, TokenizerArguments],
        argv,
        description=DESCRIPTION,
        epilog=EPILOG,
        renamed=RENAMED,
    )
    if not data_args.dataset_name and not data_args.train_file:
        raise UsageError("No training text: give --dataset_name or --train_file")
    setup_logging()
    from ..recipe.run import load_split, train_new_tokenizers  # datasets, tokenizers: only when the tool runs
    from ..recipe.tokenization import save_tokenizers

    train = load_split(data_args, "train")
    if data_args.max_train_samples:
        train = train.select(range(min(data_args.max_train_samples, len(train))))
    src_tok, tgt_tok = train_new_tokenizers(
        data_args,
        train,
        target_vocab_size=args.target_vocab_size,
        min_frequency=args.min_frequency,
        model_max_length=args.model_max_length,
    )
    save_tokenizers(src_tok, tgt_tok, args.output_dir)
    logger.info(
        "Vocabulary size: source %d, target %d (%s) from %d sentence pairs, saved to %s",
        len(src_tok),
        len(tgt_tok),
        "separate" if data_args.separate_vocabularies else "joint",
        min(len(train), data_args.max_tokenizer_samples or len(train)),
        args.output_dir,
    )
    return src_tok, tgt_tok


if __name__ == "__main__":
    main()
