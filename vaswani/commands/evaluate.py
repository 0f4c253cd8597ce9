"""`vaswani-evaluate`: score a translation file against reference file(s): sacreBLEU BLEU and chrF with their
signatures.

Files hold one segment a line (`.gz` allowed) and must have the same number of lines. The numbers come from
`vaswani.metrics.score_files`; see `compute_moses_bleu` for what `--moses_lang` adds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..cli import command, parse_args
from ..errors import UsageError, flag_errors
from ..metrics import BLEU_TOKENIZERS, check_moses_lang, score_files

DESCRIPTION = __doc__.replace("`vaswani-evaluate`: s", "S", 1)

EPILOG = """\
examples:
  vaswani-evaluate --hypotheses hyp.de --references test_2016_flickr.de.gz
  vaswani-evaluate --hypotheses hyp.de --references ref.de --moses_lang de    (+ Multi30k-style BLEU)
"""


@dataclass
class EvaluationArguments:
    _argument_group_name = "scoring"

    hypotheses: str = field(metadata={"help": "File of system translations, one a line (detokenized)."})
    references: list[str] = field(
        metadata={"help": "One or more reference files, line-aligned with --hypotheses."}
    )
    tokenize: str = field(
        default="13a",
        metadata={"help": "sacreBLEU tokenizer for BLEU.", "choices": list(BLEU_TOKENIZERS)},
    )
    lowercase: bool = field(default=False, metadata={"help": "Case-insensitive BLEU and chrF."})
    chrf_word_order: int = field(default=0, metadata={"help": "0 for chrF, 2 for chrF++."})
    moses_lang: str | None = field(
        default=None,
        metadata={
            "help": "Also report lowercased, Moses-tokenized BLEU for this language (published Multi30k style)."
        },
    )

    def __post_init__(self):
        if self.chrf_word_order < 0:
            raise UsageError(
                f"--chrf_word_order must be 0 (chrF) or more (2: chrF++), got {self.chrf_word_order}"
            )
        if self.moses_lang is not None:
            with flag_errors("moses_lang"):
                check_moses_lang(self.moses_lang)


@command("vaswani-evaluate")
def main(argv):
    (args,) = parse_args(EvaluationArguments, argv, description=DESCRIPTION, epilog=EPILOG)
    scores = score_files(
        args.hypotheses, args.references, args.tokenize, args.lowercase, args.chrf_word_order, args.moses_lang
    )
    plain = scores["sacrebleu"]
    print(f"BLEU = {plain['bleu']:.2f}\t{plain['bleu_signature']}")
    print(f"chrF = {plain['chrf']:.2f}\t{plain['chrf_signature']}")
    if "moses" in scores:
        moses = scores["moses"]
        print(
            f"BLEU (lowercased, Moses-tokenized, {args.moses_lang}) = {moses['bleu']:.2f}\t{moses['bleu_signature']}"
        )
    return scores


if __name__ == "__main__":
    main()
