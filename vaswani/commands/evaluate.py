"""`vaswani-evaluate`: score a translation file against reference file(s): sacreBLEU BLEU and chrF with their
signatures; with --moses_lang, also BLEU on lowercased Moses-tokenized text (published Multi30k figures) and the
paper's WMT BLEU (Moses-tokenized, compounds split as ##AT##-##AT##, case kept unless --lowercase: tensor2tensor's
get_ende_bleu.sh), each on its own line with its signature.

Files hold one segment a line (`.gz` allowed) and must have the same number of lines. The numbers come from
`vaswani.recipe.metrics.score_files`; see `compute_moses_bleu` and `compute_tokenized_bleu` for what `--moses_lang` adds.
"""

from dataclasses import dataclass

from transformers.hf_argparser import HfArg

from ..common.errors import UsageError, flag_errors
from ..common.fileio import check_input_file
from ..recipe.metrics import BLEU_TOKENIZERS, check_moses_lang, score_files, score_lines
from .cli import command, parse_args

DESCRIPTION = __doc__.replace("`vaswani-evaluate`: s", "S", 1)

EPILOG = """\
examples:
  vaswani-evaluate --hypotheses hyp.de --references test_2016_flickr.de.gz
  vaswani-evaluate --hypotheses hyp.de --references ref.de --moses_lang de    (+ Multi30k-style BLEU)
  vaswani-evaluate --hypotheses newstest2014.hyp.de --references newstest2014.de --moses_lang de
      (WMT14 en-de: sacreBLEU on the detokenized text, and the paper's tokenized BLEU with compounds split)
"""


@dataclass
class EvaluationArguments:
    _argument_group_name = "scoring"

    hypotheses: str = HfArg(help="File of system translations, one a line (detokenized).")
    references: list[str] = HfArg(help="One or more reference files, line-aligned with --hypotheses.")
    tokenize: str = HfArg(
        default="13a", help="sacreBLEU tokenizer for BLEU.", metadata={"choices": list(BLEU_TOKENIZERS)}
    )
    lowercase: bool = HfArg(
        default=False, help="Case-insensitive BLEU and chrF, and the tokenized BLEU of --moses_lang."
    )
    chrf_word_order: int = HfArg(default=0, help="0 for chrF, 2 for chrF++.")
    moses_lang: str | None = HfArg(
        default=None,
        help="The target language: also report lowercased, Moses-tokenized BLEU (published Multi30k "
        "style) and the paper's tokenized BLEU with compounds split (WMT 2014), each labelled.",
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
    check_input_file(args.hypotheses, "hypotheses")
    for path in args.references:
        check_input_file(path, "references")
    record = score_files(
        args.hypotheses, args.references, args.tokenize, args.lowercase, args.chrf_word_order, args.moses_lang
    )
    for line in score_lines(record, args.moses_lang):
        print(line)
    return record


if __name__ == "__main__":
    main()
