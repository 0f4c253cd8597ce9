"""Train the byte-pair encoding vocabulary of §5.1 on the training split of a parallel corpus.

Joint vocabulary (the paper's "shared source-target vocabulary"), Multi30k German-English:

    python scripts/train_tokenizer.py --source /work/shared/data/multi30k --src_lang de --tgt_lang en \\
        --vocab_size 8000 --output_dir runs/tokenizer-multi30k

WMT 2014 English-German from the Hub (§5.1: about 37000 tokens):

    python scripts/train_tokenizer.py --source wmt14 --dataset_config de-en --src_lang en --tgt_lang de \\
        --vocab_size 37000 --output_dir runs/tokenizer-wmt14

`--separate_vocab` writes one vocabulary per language to `<output_dir>/source` and `<output_dir>/target`.
Load the result with `vaswani.tokenization.load_tokenizers(output_dir)`.
"""

import logging
from dataclasses import dataclass, field

from transformers import HfArgumentParser

from vaswani.data import iter_text, load_parallel_dataset
from vaswani.tokenization import save_tokenizers, train_bpe_tokenizer, train_separate_tokenizers

logger = logging.getLogger("train_tokenizer")


@dataclass
class TokenizerTrainingArguments:
    source: str = field(
        metadata={
            "help": "Directory of {split}.{lang}[.gz] files, JSON-lines file or directory, or Hub dataset id."
        }
    )
    src_lang: str = field(metadata={"help": "Source language code, e.g. 'de'."})
    tgt_lang: str = field(metadata={"help": "Target language code, e.g. 'en'."})
    output_dir: str = field(metadata={"help": "Folder to write the tokenizer(s) to."})
    train_split: str = field(default="train", metadata={"help": "Name of the training split in the source."})
    dataset_config: str | None = field(
        default=None, metadata={"help": "Hub dataset configuration, e.g. 'de-en'."}
    )
    vocab_size: int = field(
        default=37000, metadata={"help": "Vocabulary size (§5.1: about 37000 shared tokens for WMT EN-DE)."}
    )
    separate_vocab: bool = field(
        default=False, metadata={"help": "One vocabulary per language instead of the paper's shared one."}
    )
    target_vocab_size: int | None = field(
        default=None,
        metadata={"help": "With --separate_vocab: target vocabulary size (default: --vocab_size)."},
    )
    min_frequency: int = field(default=2, metadata={"help": "Merge only pairs seen at least this often."})
    lowercase: bool = field(
        default=False,
        metadata={
            "help": "A tokenizer that lowercases what it encodes, learned on lowercased text (not the paper)."
        },
    )
    model_max_length: int = field(default=1024, metadata={"help": "Length above which transformers warns."})
    cache_dir: str | None = field(default=None, metadata={"help": "Cache folder of the datasets library."})


def main(argv: list[str] | None = None) -> None:
    (args,) = HfArgumentParser(TokenizerTrainingArguments).parse_args_into_dataclasses(args=argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    train = load_parallel_dataset(
        args.source,
        args.src_lang,
        args.tgt_lang,
        splits={"train": args.train_split},
        config_name=args.dataset_config,
        cache_dir=args.cache_dir,
    )["train"]
    if args.separate_vocab:
        src_tok, tgt_tok = train_separate_tokenizers(
            iter_text(train, [args.src_lang]),
            iter_text(train, [args.tgt_lang]),
            vocab_size=args.vocab_size,
            target_vocab_size=args.target_vocab_size,
            min_frequency=args.min_frequency,
            model_max_length=args.model_max_length,
            lowercase=args.lowercase,
        )
    else:
        src_tok = tgt_tok = train_bpe_tokenizer(
            iter_text(train, [args.src_lang, args.tgt_lang]),
            vocab_size=args.vocab_size,
            min_frequency=args.min_frequency,
            model_max_length=args.model_max_length,
            lowercase=args.lowercase,
        )
    save_tokenizers(src_tok, tgt_tok, args.output_dir)
    logger.info(
        "Vocabulary size: source %d, target %d (%s) from %d sentence pairs",
        len(src_tok),
        len(tgt_tok),
        "separate" if args.separate_vocab else "joint",
        len(train),
    )


if __name__ == "__main__":
    main()
