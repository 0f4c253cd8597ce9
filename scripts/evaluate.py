"""Score a translation file against reference file(s): sacreBLEU BLEU and chrF with their signatures.

    python scripts/evaluate.py --hypotheses hyp.de --references test_2016_flickr.de.gz
    python scripts/evaluate.py --hypotheses hyp.de --references ref.de --moses_lang de   # + Multi30k-style BLEU

Files hold one segment a line (`.gz` allowed) and must have the same number of lines. The numbers come from
`vaswani.metrics.score_files`; see `compute_moses_bleu` for what `--moses_lang` adds.
"""

from dataclasses import dataclass, field

from transformers import HfArgumentParser

from vaswani.metrics import score_files


@dataclass
class EvaluationArguments:
    hypotheses: str = field(metadata={"help": "File of system translations, one a line (detokenized)."})
    references: list[str] = field(
        metadata={"help": "One or more reference files, line-aligned with --hypotheses."}
    )
    tokenize: str = field(
        default="13a", metadata={"help": "sacreBLEU tokenizer for BLEU: 13a, intl, char, none..."}
    )
    lowercase: bool = field(default=False, metadata={"help": "Case-insensitive BLEU and chrF."})
    chrf_word_order: int = field(default=0, metadata={"help": "0 for chrF, 2 for chrF++."})
    moses_lang: str | None = field(
        default=None,
        metadata={
            "help": "Also report lowercased, Moses-tokenized BLEU for this language (published Multi30k style)."
        },
    )


def main(argv: list[str] | None = None) -> None:
    (args,) = HfArgumentParser(EvaluationArguments).parse_args_into_dataclasses(args=argv)
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


if __name__ == "__main__":
    main()
