"""Translate a file (or standard input), one sentence a line, with the paper's decoding (§6.1).

    python scripts/translate.py --model runs/base/averaged --input test.de --output test.hyp.en
    echo "Ein Hund läuft." | python scripts/translate.py --model runs/base/averaged
    python scripts/translate.py --model runs/base/averaged --input test.de --output hyp.en --references test.en

Beam size 4, length penalty 0.6 and at most (longest source of the batch) + 50 new tokens unless overridden.
Sentences are sorted by length for speed and written back in input order; empty lines stay empty. The
tokenizer is read from the model folder (joint, or `source/` + `target/`) unless --tokenizer is given.
With --references, BLEU and chrF (sacreBLEU) go to standard error, so they never mix with translations;
--moses_lang adds BLEU on lowercased Moses-tokenized text (published Multi30k figures), and --results_json writes
the scores where `scripts/push_to_hub.py --results_json` reads them:

    python scripts/translate.py --model runs/en-de/averaged --input test_2016_flickr.en.gz --output hyp.de \
        --references test_2016_flickr.de.gz --moses_lang de --results_json runs/en-de/test_results.json \
        --dataset multi30k --split test_2016_flickr
"""

import json
import logging
import sys
from dataclasses import dataclass, field

from transformers import HfArgumentParser

from vaswani.generation_vaswani import LENGTH_PENALTY_FORMS
from vaswani.tokenization import lowercases
from vaswani.translation import (
    LENGTH_PENALTY,
    NUM_BEAMS,
    length_penalty_form_of,
    load_translation_model,
    read_sentences,
    score_translations,
    translate,
    write_sentences,
)


@dataclass
class TranslationArguments:
    model: str = field(metadata={"help": "Model folder (a checkpoint or an averaged model)."})
    tokenizer: str | None = field(
        default=None,
        metadata={"help": "Tokenizer folder, if not the model folder (joint or source/ + target/)."},
    )
    input: str = field(
        default="-", metadata={"help": "Source file, one sentence a line (.gz allowed); - for stdin."}
    )
    output: str = field(default="-", metadata={"help": "Output file; - for stdout."})
    batch_size: int = field(default=64, metadata={"help": "At most this many sentences per batch."})
    max_tokens: int | None = field(
        default=None, metadata={"help": "Also at most this many padded source tokens per batch."}
    )
    num_beams: int = field(default=NUM_BEAMS, metadata={"help": "Beam size (§6.1: 4)."})
    length_penalty: float = field(
        default=LENGTH_PENALTY, metadata={"help": "Length penalty alpha (§6.1: 0.6)."}
    )
    length_penalty_form: str | None = field(
        default=None,
        metadata={
            "help": "gnmt: ((5 + |Y|) / 6) ** alpha, the form §6.1 cites; power: transformers' |Y| ** alpha. "
            "Default: the model's generation config (gnmt for this package's models).",
            "choices": list(LENGTH_PENALTY_FORMS),
        },
    )
    max_new_tokens: int | None = field(
        default=None,
        metadata={"help": "Fixed output limit instead of the batch's longest source + 50 (§6.1)."},
    )
    device: str | None = field(
        default=None, metadata={"help": "cuda, cpu, cuda:1...; default: cuda if available."}
    )
    bf16: bool = field(default=False, metadata={"help": "Run the model in bfloat16."})
    references: list[str] | None = field(
        default=None, metadata={"help": "Reference file(s): also report BLEU and chrF on standard error."}
    )
    moses_lang: str | None = field(
        default=None,
        metadata={
            "help": "With --references: also BLEU on lowercased, Moses-tokenized text of this language."
        },
    )
    results_json: str | None = field(
        default=None,
        metadata={"help": "With --references: write the scores here (the format push_to_hub.py reads)."},
    )
    dataset: str | None = field(default=None, metadata={"help": "Dataset name recorded in --results_json."})
    split: str = field(default="test", metadata={"help": "Split name recorded in --results_json."})
    progress: bool = field(default=True, metadata={"help": "Show a progress bar (--no_progress to hide it)."})


def main(argv: list[str] | None = None) -> None:
    (args,) = HfArgumentParser(TranslationArguments).parse_args_into_dataclasses(args=argv)
    if (args.moses_lang or args.results_json) and not args.references:
        raise SystemExit("--moses_lang and --results_json score the translations: they need --references.")
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    model, source_tokenizer, target_tokenizer = load_translation_model(
        args.model, args.tokenizer, device=args.device, bf16=args.bf16
    )
    translations = translate(
        read_sentences(args.input),
        model,
        source_tokenizer,
        target_tokenizer,
        batch_size=args.batch_size,
        max_tokens=args.max_tokens,
        num_beams=args.num_beams,
        length_penalty=args.length_penalty,
        length_penalty_form=args.length_penalty_form,
        max_new_tokens=args.max_new_tokens,
        show_progress=args.progress,
    )
    write_sentences(translations, args.output)
    if args.references:
        # A model whose tokenizer lowercases writes lowercase only: its raw-text scores are case-insensitive
        # (signature case:lc), never a case-sensitive score it cannot earn.
        lowercase = lowercases(target_tokenizer)
        scores = score_translations(
            translations, args.references, moses_lang=args.moses_lang, lowercase=lowercase
        )
        print(f"BLEU = {scores['bleu']:.2f}\t{scores['bleu_signature']}", file=sys.stderr)
        print(f"chrF = {scores['chrf']:.2f}\t{scores['chrf_signature']}", file=sys.stderr)
        if args.moses_lang:
            print(
                f"BLEU (lowercased, Moses-tokenized, {args.moses_lang}) = "
                f"{scores['bleu_lowercase_moses_tokenized']:.2f}\t"
                f"{scores['bleu_lowercase_moses_tokenized_signature']}",
                file=sys.stderr,
            )
        if args.results_json:
            record = {
                **scores,
                "dataset": args.dataset,
                "split": args.split,
                "num_beams": args.num_beams,
                "length_penalty": args.length_penalty,
                "length_penalty_form": length_penalty_form_of(model, args.length_penalty_form),
                "model": args.model,
                "input": args.input,
                "references": args.references,
            }
            with open(args.results_json, "w", encoding="utf-8") as f:
                json.dump(record, f, indent=2)


if __name__ == "__main__":
    main()
