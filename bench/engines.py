"""Decoding speed and memory of the exported models beside PyTorch, at equal sizes, in one run.

Implementations, all built from one `VaswaniConfig` preset with random weights (`common.build_model`, seed 0):

- `vaswani`: `VaswaniForConditionalGeneration.generate()` (attn_implementation "vaswani_sdpa");
- `marian`: transformers' `MarianMTModel.generate()`;
- `vaswani-onnx`: our ONNX export (`vaswani-export --engine onnx`) run by `vaswani.interop.engines`;
- `vaswani-ct2-<q>`: our CTranslate2 export (`vaswani-export --engine ctranslate2 --quantization <q>`);
- `marian-ct2-<q>`: CTranslate2's own converter applied to the `MarianMTModel`, same quantization.

Each decodes `--batch-size` random sources into exactly `--new-tokens` tokens (CTranslate2: `min_decoding_length`),
greedy and beam 4, length penalty 1, `--threads` threads each; medians of `--repeats` rounds ("best": the fastest
runs, the least disturbed on a shared machine). A round times the PyTorch jobs once each in this process,
interleaved, then each exported engine once in a fresh child process after a warm-up (where CTranslate2 has
translated, torch's GEMMs run about 1.8x slower). Memory: the peak resident size of a fresh process that loads the
model and decodes one batch, and its rise during the decode.

    python -m bench engines --preset base --repeats 5 --json bench/results/engines_base_cpu.json
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench import common, train

QUANTIZATIONS = ("float32", "int8")
CT2 = tuple(f"{model}-ct2-{q}" for q in QUANTIZATIONS for model in ("vaswani", "marian"))
IMPLEMENTATIONS = ("vaswani", "marian", "vaswani-onnx", *CT2)
PEERS = {"vaswani-onnx": "vaswani", **{f"vaswani-ct2-{q}": f"marian-ct2-{q}" for q in QUANTIZATIONS}}


def parser(what: str, doc: str, implementations: tuple[str, ...], batch_size: int) -> argparse.ArgumentParser:
    """The flags of a command that times exported engines: `engines` and `int8`."""
    parser = common.parser(what, doc)
    common.model_flags(parser, implementations, "base")
    common.decoding_flags(parser, batch_size)
    parser.add_argument(
        "--threads", type=int, default=torch.get_num_threads(), help="threads of every engine"
    )
    parser.add_argument(
        "--workdir", help="where the models are saved and exported (default: a temporary folder)"
    )
    parser.add_argument("--engine-child", help=argparse.SUPPRESS)  # one engine timed in a subprocess
    return parser


QUICK = {"preset": "small", "batch_size": 2, "src_len": 5, "new_tokens": 4, "vocab": 1000, "repeats": 1}


def prepare(args, workdir: Path, implementations) -> None:
    """Save the PyTorch models and write every export `implementations` need into `workdir`; a `--workdir` prepared
    before for the same preset, vocabulary and implementations is reused as it is."""
    from vaswani.interop.export import export
    from vaswani.recipe.tokenization import save_tokenizers, train_bpe_tokenizer

    stamp, sizes = (
        workdir / "models.json",
        {"preset": args.preset, "vocab": args.vocab, "impl": sorted(implementations)},
    )
    if stamp.is_file() and json.loads(stamp.read_text()) == sizes:
        return
    config = common.vaswani_config(args.preset, args.vocab)
    common.build_model("vaswani", config).save_pretrained(workdir / "vaswani")
    # Any tokenizer with the model's special ids: the export pads its vocabulary to the embedding rows.
    tokenizer = train_bpe_tokenizer(
        iter(["a tokenizer for the export"]), min_frequency=1, show_progress=False
    )
    save_tokenizers(tokenizer, tokenizer, workdir / "vaswani")
    if "vaswani-onnx" in implementations:
        export(workdir / "vaswani", workdir / "vaswani-onnx", "onnx", force=True)
    for q in QUANTIZATIONS:
        if f"vaswani-ct2-{q}" in implementations:
            export(
                workdir / "vaswani", workdir / f"vaswani-ct2-{q}", "ctranslate2", quantization=q, force=True
            )
        if f"marian-ct2-{q}" in implementations:
            common.build_model("marian", config).save_pretrained(workdir / "marian")
            convert_marian(workdir / "marian", workdir / f"marian-ct2-{q}", q, args.vocab)
    stamp.write_text(json.dumps(sizes))


def convert_marian(folder: Path, output: Path, quantization: str, vocab_size: int) -> None:
    """CTranslate2's transformers converter on a saved `MarianMTModel`, with made-up tokens for the vocabulary of the
    untrained model. The converter takes the last token for the `<pad>` transformers appends to Marian's vocabulary
    and drops it, so the CTranslate2 Marian has one token less than ours."""
    from ctranslate2.converters.transformers import TransformersConverter

    class Vocabulary:
        eos_token, unk_token = "</s>", "<unk>"

        def get_vocab(self):
            tokens = [
                "<blank>",
                "<s>",
                "</s>",
                "<unk>",
                *(f"t{i}" for i in range(4, vocab_size - 1)),
                "<pad>",
            ]
            return {token: i for i, token in enumerate(tokens)}

    class MarianConverter(TransformersConverter):
        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            return Vocabulary()

    MarianConverter(str(folder)).convert(str(output), quantization=quantization, force=True)


def load(name: str, args, workdir: Path):
    """A decoding function of one implementation: (source id lists, beams) -> per sentence, the generated ids."""
    if name in ("vaswani", "marian"):
        model = common.build_model(name, common.vaswani_config(args.preset, args.vocab)).eval()
        return lambda sources, beams: generate_pytorch(model, sources, beams, args)
    if name == "vaswani-onnx":
        from vaswani.interop.engines import load_engine

        engine = load_engine(workdir / name, threads=args.threads)
        options = {
            "max_new_tokens": args.new_tokens,
            "min_new_tokens": args.new_tokens,
            "length_penalty": 1.0,
        }
        return lambda sources, beams: [
            hypotheses[0].ids
            for hypotheses in engine.generate(
                sources, num_beams=beams, length_penalty_form="power", **options
            )
        ]
    import ctranslate2

    translator = ctranslate2.Translator(str(workdir / name), device="cpu", intra_threads=args.threads)
    tokens = json.loads((workdir / name / "shared_vocabulary.json").read_text(encoding="utf-8"))
    options = {
        "min_decoding_length": args.new_tokens,
        "max_decoding_length": args.new_tokens,
        "length_penalty": 1.0,
    }
    return lambda sources, beams: [
        result.hypotheses[0]
        for result in translator.translate_batch(
            [[tokens[i % len(tokens)] for i in ids] for ids in sources], beam_size=beams, **options
        )
    ]


@torch.inference_mode()
def generate_pytorch(model, sources: list[list[int]], beams: int, args) -> list[list[int]]:
    """`model.generate()` of exactly `--new-tokens` tokens a sentence, held there as `--fixed-length` says."""
    input_ids = torch.tensor(sources)
    config = common.fixed_length_generation_config(
        beams, args.new_tokens, args.fixed_length == "min-new-tokens"
    )
    out = model.generate(
        input_ids=input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config
    )
    return out[:, 1:].tolist()


def make_job(decode, beams: int, args):
    """A closure decoding one batch; checks that exactly `--new-tokens` tokens came out for every sentence."""
    sources = common.random_batch(args.batch_size, args.src_len, 1, args.vocab, seed=beams)[
        "input_ids"
    ].tolist()

    def job():
        outputs = decode(sources, beams)
        if [len(output) for output in outputs] != [args.new_tokens] * args.batch_size:
            raise RuntimeError(
                f"expected {args.new_tokens} tokens per sentence, got {[len(o) for o in outputs]}"
            )
        return outputs

    return job


def engine_child(args, decode) -> None:
    """Subprocess: `--warmup` untimed decodes, then one timed, per beam setting; with `--memory`, the peak resident
    memory of one decode instead. A JSON line."""
    result = {}
    for beams in args.beams:
        job = make_job(decode, beams, args)
        if getattr(args, "memory", False):
            result[beams] = common.peak_rss_during(job)
            continue
        for _ in range(args.warmup):
            job()
        start = time.perf_counter()
        outputs = job()
        result[beams] = {"seconds": time.perf_counter() - start, "outputs": outputs}
    print(json.dumps(result))


def rounds_of_times(what: str, args, workdir: Path, load) -> tuple[dict, dict]:
    """Seconds per decode of each (implementation, beams), `--repeats` rounds, and the tokens each decoded. A round
    times the PyTorch implementations (`load(name, args, workdir)`) once each, interleaved, then each exported engine
    once in a fresh child running `python -m bench what`."""
    children = [name for name in args.impl if "ct2" in name or "onnx" in name]
    decoders = {name: load(name, args, workdir) for name in args.impl if name not in children}
    jobs = {(name, beams): make_job(decoders[name], beams, args) for name in decoders for beams in args.beams}
    outputs = {key: job() for key, job in jobs.items()}  # the tokens each decodes: the first warm-up
    times = {(name, beams): [] for name in args.impl for beams in args.beams}
    for round_ in range(args.repeats):
        for key, seconds in common.interleaved_times(
            jobs, 1, max(args.warmup - 1, 0) * (round_ == 0)
        ).items():
            times[key] += seconds
        for name in children:
            child = common.run_child(what, [*args.argv, "--engine-child", name, "--workdir", workdir])
            for beams, timed in child.items():
                times[name, int(beams)].append(timed["seconds"])
                outputs[name, int(beams)] = timed["outputs"]
    return times, outputs


def rows_of(args, times: dict) -> list[dict]:
    rows = []
    for (name, beams), seconds in times.items():
        row = {"preset": args.preset, "impl": name, "decoding": "greedy" if beams == 1 else f"beam-{beams}"}
        row |= {"beams": beams, "batch_s_all": seconds}
        row["tokens_per_s"] = args.batch_size * args.new_tokens / statistics.median(seconds)
        row["best_tokens_per_s"] = args.batch_size * args.new_tokens / min(seconds)
        rows.append(row)
    return rows


def versions(*packages: str) -> dict[str, str | None]:
    found = {}
    for package in packages:
        try:
            found[package] = __import__(package).__version__
        except ImportError:
            found[package] = None
    return found


def main(argv) -> dict:
    main_parser = parser("engines", __doc__, IMPLEMENTATIONS, batch_size=32)
    main_parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    main_parser.add_argument("--memory", action="store_true", help=argparse.SUPPRESS)  # the memory child
    args = common.parse(main_parser, argv, **QUICK)
    torch.set_num_threads(args.threads)
    if args.engine_child:
        return engine_child(args, load(args.engine_child, args, Path(args.workdir)))
    with tempfile.TemporaryDirectory() as temporary:
        workdir = Path(args.workdir or temporary)
        workdir.mkdir(parents=True, exist_ok=True)
        prepare(args, workdir, args.impl)
        rows = rows_of(args, rounds_of_times("engines", args, workdir, load)[0])
        for row in [] if args.no_memory else rows:
            child = [*args.argv, "--engine-child", row["impl"], "--workdir", workdir, "--memory"]
            memory = common.run_child("engines", [*child, "--beams", row["beams"]])[str(row["beams"])]
            row["peak_rss_mib"], row["mem_rise_mib"] = memory["peak_rss_mib"], memory["rise_mib"]
    train.add_ratios(rows, ("beams",), ("marian", "vaswani"))
    for row in rows:
        peer = next(
            (r for r in rows if (r["impl"], r["beams"]) == (PEERS.get(row["impl"]), row["beams"])), None
        )
        row["peer"] = peer and peer["impl"]
        row["vs_peer"] = peer and row["tokens_per_s"] / peer["tokens_per_s"]
        row["best_vs_peer"] = peer and row["best_tokens_per_s"] / peer["best_tokens_per_s"]
    columns = [("decoding", "decoding", ""), ("impl", "impl", ""), ("tokens_per_s", "tok/s", ".0f")]
    columns += [
        ("vs_marian", "x marian", ".2f"),
        ("vs_peer", "x peer", ".2f"),
        ("best_vs_peer", "best x peer", ".2f"),
    ]
    columns += [
        ("peer", "peer", ""),
        ("peak_rss_mib", "peak RSS MiB", ".0f"),
        ("mem_rise_mib", "rise MiB", ".0f"),
    ]
    title = (
        f"decoding, preset {args.preset}: batch {args.batch_size}, source {args.src_len}, exactly {args.new_tokens} "
        f"new tokens, {args.threads} threads each, median of {args.repeats}"
    )
    packages = versions("ctranslate2", "onnxruntime", "onnx", "onnxscript")
    return common.report(args, title, rows, columns, versions=packages)
