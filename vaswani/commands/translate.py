"""`vaswani-translate`: translate a file (or standard input), one sentence a line, with the paper's decoding (§6.1).

Beam size 4, length penalty 0.6 and at most (longest source of the batch) + 50 new tokens unless overridden. Sentences
are sorted by length for speed and written back in input order; empty lines stay empty. The tokenizer is read from the
model folder (joint, or `source/` + `target/`) unless --tokenizer_name is given. The output file is written whole or
not at all. With --references, BLEU and chrF (sacreBLEU) go to standard error, never mixed with translations; with
--moses_lang too, the paper's tokenized BLEU with compounds split (WMT 2014) beside them, each line labelled.
"""

import functools
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from transformers.hf_argparser import HfArg

from ..common.errors import UsageError, flag_errors, require_positive
from ..common.fileio import check_input_file, check_input_folder, write_json
from ..common.flag_choices import LENGTH_PENALTY_FORMS, PAPER_LENGTH_PENALTY, PAPER_NUM_BEAMS
from ..recipe.metrics import check_moses_lang, score_lines
from .cli import command, parse_args, setup_logging

# The model, the engines and the decoding (torch, transformers) are imported where they are used: `--help` loads
# none of them.

logger = logging.getLogger(__name__)

DESCRIPTION = __doc__.replace("`vaswani-translate`: t", "T", 1)

EPILOG = """\
examples:
  vaswani-translate --model_name_or_path runs/de-en/averaged --input test_2016_flickr.de.gz --output hyp.en
  echo "Ein Hund läuft." | vaswani-translate --model_name_or_path runs/de-en/averaged
  vaswani-translate --model_name_or_path runs/de-en/averaged --input test_2016_flickr.de.gz --n_best 4  (index, score, text)
  vaswani-translate --model_name_or_path runs/de-en/averaged --interactive                (a line in, a line out)
  vaswani-translate --model_name_or_path runs/de-en/averaged --quantization int8 --input test_2016_flickr.de.gz
  vaswani-translate --model_name_or_path runs/de-en/ct2-int8 --engine ctranslate2 --interactive   (an export)
  vaswani-translate --model_name_or_path runs/en-de/averaged --input test_2016_flickr.en.gz --output hyp.de \\
      --references test_2016_flickr.de.gz --moses_lang de --results_json runs/en-de/test_results.json \\
      --dataset_name multi30k --split test_2016_flickr
"""

RENAMED = {"model": "model_name_or_path", "tokenizer": "tokenizer_name", "dataset": "dataset_name"}


@dataclass
class TranslationArguments:
    _argument_group_name = "translation"

    model_name_or_path: str = HfArg(help="Model folder (a checkpoint, an averaged model) or Hub id.")
    tokenizer_name: str | None = HfArg(
        default=None, help="Tokenizer folder, if not the model folder (joint or source/ + target/)."
    )
    input: str = HfArg(default="-", help="Source file, one sentence a line (.gz allowed); - for stdin.")
    output: str = HfArg(default="-", help="Output file (written whole at the end); - for stdout.")
    batch_size: int = HfArg(default=64, help="At most this many sentences per batch.")
    max_tokens: int | None = HfArg(
        default=None, help="Also at most this many padded source tokens per batch."
    )
    num_beams: int = HfArg(
        default=PAPER_NUM_BEAMS, aliases=["--beam"], help="Beam size (§6.1: 4; fairseq: --beam)."
    )
    length_penalty: float | None = HfArg(
        default=None,
        help="Length penalty alpha. Default: the model's generation config (§6.1's 0.6 for a model "
        "vaswani-train wrote, unless its --length_penalty chose another on validation). fairseq's --lenpen A "
        "is --length_penalty A --length_penalty_form power.",
    )
    length_penalty_form: str | None = HfArg(
        default=None,
        help="gnmt: ((5 + |Y|) / 6) ** alpha, the form §6.1 cites; power: transformers' |Y| ** alpha. "
        "Default: the model's generation config (gnmt for this package's models).",
        metadata={"choices": list(LENGTH_PENALTY_FORMS)},
    )
    max_new_tokens: int | None = HfArg(
        default=None, help="Fixed output limit instead of the batch's longest source + 50 (§6.1)."
    )
    max_source_length: int | None = HfArg(
        default=None, help="Truncate sources to this many tokens (default: none is cut)."
    )
    n_best: int | None = HfArg(
        default=None,
        aliases=["--nbest"],
        help="Write the N best translations of each sentence with their scores, as lines "
        "'index<TAB>score<TAB>translation', best first (N <= --num_beams; the score is the beam's "
        "log-probability divided by the length penalty; fairseq: --nbest).",
    )
    interactive: bool = HfArg(
        default=False,
        help="Translate each line of standard input as soon as it is read (fairseq-interactive).",
    )
    source_lang: str | None = HfArg(
        default=None,
        help="The source language code, a flag of every vaswani tool. Checked against the languages the "
        "model folder records (its configs, tokenizer config, the run's training_summary.json, its model card), "
        "and that an --input named <name>.<lang>[.gz] is not in --target_lang.",
    )
    target_lang: str | None = HfArg(
        default=None,
        help="The target language code, checked against the model's as --source_lang is; the default of "
        "--moses_lang when scoring (--references).",
    )
    device: str | None = HfArg(default=None, help="cuda, cpu, cuda:1...; default: cuda if available.")
    bf16: bool = HfArg(default=False, help="Run the model in bfloat16.")
    quantization: str | None = HfArg(
        default=None,
        help="int8: load the linear layers in int8 through transformers' torchao quantization and decode "
        "with int8 GEMMs on the CPU (pip install vaswani-transformer[int8]); an exported folder keeps "
        "the quantization vaswani-export gave it.",
        metadata={"choices": ["int8"]},
    )
    attn_implementation: str | None = HfArg(
        default=None, help="Attention kernel (default: vaswani_sdpa on the CPU, sdpa elsewhere)."
    )
    progress: bool = HfArg(default=True, help="Show a progress bar (--no_progress to hide it).")
    engine: str = HfArg(
        default="pytorch",
        help="pytorch (the model folder), or ctranslate2 / onnx (a folder written by vaswani-export; "
        "pip install vaswani-transformer[ctranslate2] or [onnx]).",
        metadata={"choices": ["pytorch", "ctranslate2", "onnx"]},
    )
    threads: int = HfArg(default=0, help="CPU threads of an exported engine (0: its default).")

    def __post_init__(self):
        from ..recipe.arguments import check_languages
        from ..recipe.translation import check_decoding

        with flag_errors("num_beams"):
            check_decoding(self.num_beams, PAPER_LENGTH_PENALTY)
        if self.length_penalty is not None:
            with flag_errors("length_penalty"):
                check_decoding(self.num_beams, self.length_penalty)
        check_languages(self.source_lang, self.target_lang)
        suffix = Path(self.input).name.removesuffix(".gz").rpartition(".")[2]  # "de" of test.de.gz
        if self.source_lang and self.target_lang and suffix == self.target_lang:
            raise UsageError(
                f"--input {self.input} is named as {self.target_lang} text, the target language "
                f"(--target_lang {self.target_lang}): give a file of --source_lang {self.source_lang} text"
            )
        require_positive(self, "batch_size", "max_tokens", "max_new_tokens", "max_source_length")
        if self.n_best is not None and not 1 <= self.n_best <= self.num_beams:
            raise UsageError(
                f"--n_best must be between 1 and --num_beams ({self.num_beams}), got {self.n_best}"
            )
        if self.interactive and self.input != "-":
            raise UsageError("--interactive reads standard input: drop --input")
        if self.engine != "pytorch":
            for name in ("bf16", "quantization", "attn_implementation", "tokenizer_name") + (
                ("device",) if self.engine == "onnx" else ()
            ):
                if getattr(self, name):
                    raise UsageError(f"--{name} applies to --engine pytorch, not {self.engine}")
        if self.quantization and self.bf16:
            raise UsageError("--quantization int8 decodes in float32 around its int8 products: drop --bf16")
        if self.quantization and self.device not in (None, "cpu"):
            raise UsageError(f"--quantization int8 runs on the CPU, not --device {self.device}")
        if self.engine == "ctranslate2" and self.length_penalty_form not in (None, "power"):
            raise UsageError(
                f"--length_penalty_form {self.length_penalty_form}: CTranslate2 divides beam scores by |Y|^alpha "
                "only (power); --engine onnx or pytorch decodes with the other form"
            )
        if self.threads < 0:
            raise UsageError(f"--threads must be 0 or more, got {self.threads}")


@dataclass
class ScoringArguments:
    _argument_group_name = "scoring (with --references)"

    references: list[str] | None = HfArg(
        default=None, help="Reference file(s): also report BLEU and chrF on standard error."
    )
    moses_lang: str | None = HfArg(
        default=None,
        help="The target language: also BLEU on lowercased, Moses-tokenized text (published Multi30k) "
        "and the paper's tokenized BLEU with compounds split (WMT 2014), each labelled.",
    )
    results_json: str | None = HfArg(
        default=None, help="Write the scores here (the format vaswani-push-to-hub --results_json reads)."
    )
    dataset_name: str | None = HfArg(default=None, help="Dataset name recorded in --results_json.")
    split: str = HfArg(default="test", help="Split name recorded in --results_json.")

    def __post_init__(self):
        if (self.moses_lang or self.results_json) and not self.references:
            raise UsageError(
                "--moses_lang and --results_json score the translations: they need --references."
            )
        if self.moses_lang is not None:
            with flag_errors("moses_lang"):
                check_moses_lang(self.moses_lang)


@command("vaswani-translate")
def main(argv):
    args, scoring = parse_args(
        [TranslationArguments, ScoringArguments],
        argv,
        description=DESCRIPTION,
        epilog=EPILOG,
        renamed=RENAMED,
    )
    if args.interactive and scoring.references:
        raise UsageError("--interactive translates as lines arrive: --references needs a whole --input")
    _check_files(args, scoring)
    setup_logging()
    from ..recipe import translation
    from ..recipe.model_folders import check_model_languages

    check_model_languages(args.model_name_or_path, args.source_lang, args.target_lang)
    if scoring.references and scoring.moses_lang is None and args.target_lang:
        try:
            check_moses_lang(args.target_lang)
            scoring.moses_lang = args.target_lang
        except ValueError as error:
            logger.warning(
                "No lowercased Moses-tokenized BLEU for --target_lang %s: %s", args.target_lang, error
            )
    model, source_tokenizer, target_tokenizer = _load(args)
    with_scores = args.n_best is not None  # n-best lines: index<TAB>score<TAB>translation
    decode = functools.partial(
        translation.translate_n_best,
        model=model,
        source_tokenizer=source_tokenizer,
        target_tokenizer=target_tokenizer,
        n_best=args.n_best or 1,
        batch_size=args.batch_size,
        max_tokens=args.max_tokens,
        num_beams=args.num_beams,
        length_penalty=args.length_penalty,
        length_penalty_form=args.length_penalty_form,
        max_new_tokens=args.max_new_tokens,
        max_source_length=args.max_source_length,
        with_scores=with_scores,
    )
    if args.interactive:
        # fairseq-interactive: each line is written (flushed) before the next is read, a conversation through pipes
        if sys.stdin.isatty():
            print("Type a sentence and press return (Ctrl-D ends):", file=sys.stderr)
        for index, line in enumerate(translation.stdin_lines()):
            _write(decode([line], show_progress=False), "-", with_scores, first_index=index)
        return None
    if args.input == "-" and sys.stdin.isatty():
        print(
            "vaswani-translate: reading sentences from standard input, one a line; Ctrl-D ends them "
            "(--input FILE reads a file, --interactive answers each line at once)",
            file=sys.stderr,
        )
    results = decode(translation.read_sentences(args.input), show_progress=args.progress)
    translations = _write(results, args.output, with_scores)
    if scoring.references:
        _score(translations, scoring, args, model, target_tokenizer)
    return translations


def _load(args):
    """`(model, source_tokenizer, target_tokenizer)`: the PyTorch model, or an exported one that decodes the same
    way by CTranslate2 or ONNX Runtime (`vaswani.interop.engines`)."""
    if args.engine != "pytorch":
        from ..interop.engines import load_exported

        options = {"device": args.device} if args.device else {}
        return load_exported(args.model_name_or_path, args.engine, threads=args.threads, **options)
    from ..recipe.translation import load_translation_model

    return load_translation_model(
        args.model_name_or_path,
        args.tokenizer_name,
        device=args.device,
        bf16=args.bf16,
        int8=args.quantization == "int8",
        attn_implementation=args.attn_implementation,
    )


def _check_files(args, scoring):
    """What is read and written, checked before the model loads: a typo costs no minute of loading, and a missing
    reference file is not found after the whole translation."""
    check_input_file(args.input, "input")
    for path in scoring.references or ():
        check_input_file(path, "references")
    check_input_folder(args.tokenizer_name, "tokenizer_name")
    for flag, path in (("output", args.output), ("results_json", scoring.results_json)):
        if path and path != "-" and Path(path).is_dir():
            raise UsageError(f"--{flag} {path} is a folder: give a file")


def _write(results, output, with_scores, first_index=0):
    """Write the best translation of each source, or with `with_scores` its n-best list (lines numbered from
    `first_index`), to `output`; returns the best translations."""
    from ..recipe.translation import write_sentences

    translations = [hypotheses[0].text for hypotheses in results]
    # an n-best line: index<TAB>score<TAB>translation, best first
    n_best = [
        f"{i}\t{h.score:.4f}\t{h.text}"
        for i, hypotheses in enumerate(results, first_index)
        for h in hypotheses
    ]
    write_sentences(n_best if with_scores else translations, output)
    return translations


def _score(translations, scoring, args, model, target_tokenizer):
    # A model whose tokenizer lowercases writes lowercase only: its raw-text scores are case-insensitive
    # (signature case:lc), never a case-sensitive score it cannot earn.
    from ..recipe.tokenization import lowercases
    from ..recipe.translation import length_penalty_form_of, length_penalty_of, score_translations

    scores = score_translations(
        translations,
        scoring.references,
        moses_lang=scoring.moses_lang,
        lowercase=lowercases(target_tokenizer),
    )
    for line in score_lines(scores, scoring.moses_lang):
        print(line, file=sys.stderr)
    if scoring.results_json:
        write_json(
            scoring.results_json,
            {
                **scores,
                "dataset": scoring.dataset_name,
                "split": scoring.split,
                "num_beams": args.num_beams,
                # what ran: the flags, else the model's generation config (an export keeps it); CTranslate2 has only
                # |Y| ** alpha
                "length_penalty": length_penalty_of(model, args.length_penalty),
                "length_penalty_form": "power"
                if args.engine == "ctranslate2"
                else length_penalty_form_of(model, args.length_penalty_form),
                "engine": args.engine,
                "model": args.model_name_or_path,
                "input": args.input,
                "references": scoring.references,
            },
        )


if __name__ == "__main__":
    main()
