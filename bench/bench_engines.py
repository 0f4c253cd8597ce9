"""Decoding speed and memory of the exported models next to PyTorch, at equal sizes, in one run.

Implementations, all built from one `VaswaniConfig` preset with random weights (`common.build_model`, seed 0):

- `vaswani`: `VaswaniForConditionalGeneration.generate()` with `attn_implementation="vaswani_sdpa"` (our PyTorch path);
- `marian`: transformers' `MarianMTModel.generate()`;
- `vaswani-onnx`: our ONNX export (`vaswani-export --engine onnx`) run by `vaswani.interop.engines.OnnxEngine`;
- `vaswani-ct2-<q>`: our CTranslate2 export (`vaswani-export --engine ctranslate2 --quantization <q>`);
- `marian-ct2-<q>`: CTranslate2's own converter applied to the `MarianMTModel`, same quantization.

Each decodes `--batch-size` random sources of `--src-len` tokens into exactly `--new-tokens` tokens (the end token held
back until then: `min_new_tokens`, CTranslate2's `min_decoding_length`; `--fixed-length no-eos`: PyTorch without one),
greedy and beam 4, with length penalty 1. Both CTranslate2 models run through the same `Translator.translate_batch`
call. Every implementation gets `--threads` threads; medians of `--repeats` rounds ("best" ratios compare the fastest
runs, the least disturbed on a shared machine). A round times the PyTorch jobs once each in this process, interleaved
so that machine load hits them alike, then each exported engine once in a fresh child process after a warm-up
(`in_child`: where CTranslate2 has translated, torch's GEMMs run about 1.8x slower). Memory: peak resident size of a
fresh process that loads the model and decodes one batch, and its rise during the decode.

    python -m bench.bench_engines --preset base --json bench/results/engines_base_cpu.json
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench import common

QUANTIZATIONS = ("float32", "int8")
IMPLEMENTATIONS = (
    "vaswani",
    "marian",
    "vaswani-onnx",
    *(f"{model}-ct2-{q}" for q in QUANTIZATIONS for model in ("vaswani", "marian")),
)
# Each export's peer: the implementation it is compared with.
PEERS = {"vaswani-onnx": "vaswani", **{f"vaswani-ct2-{q}": f"marian-ct2-{q}" for q in QUANTIZATIONS}}


def parse_args(argv=None) -> argparse.Namespace:
    parser = common.decoding_parser(__doc__, IMPLEMENTATIONS, batch_size=32)
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument(
        "--workdir", help="where the models are saved and exported (default: a temporary folder)"
    )
    parser.add_argument(
        "--memory-child", help=argparse.SUPPRESS
    )  # internal: one configuration in a subprocess
    parser.add_argument(
        "--engine-child", help=argparse.SUPPRESS
    )  # internal: one engine timed in a subprocess
    args = parser.parse_args(argv)
    if args.quick:
        args.preset, args.batch_size, args.src_len, args.new_tokens = "small", 2, 5, 4
        args.vocab, args.repeats, args.warmup = 1000, 1, 1
    return args


# --------------------------------------------------------------------------------------------------------------------
# Models: saved, exported, loaded
# --------------------------------------------------------------------------------------------------------------------
def prepare(args, workdir: Path) -> None:
    """Save both PyTorch models and write every export the chosen implementations need into `workdir`. A `--workdir`
    prepared before for the same preset and vocabulary is reused as it is."""
    from vaswani.interop.export import export
    from vaswani.recipe.tokenization import save_tokenizers, train_bpe_tokenizer

    stamp, sizes = (
        workdir / "models.json",
        {"preset": args.preset, "vocab": args.vocab, "impl": sorted(args.impl)},
    )
    if stamp.is_file() and json.loads(stamp.read_text()) == sizes:
        return
    config = common.vaswani_config(args.preset, args.vocab)
    vaswani = common.build_model("vaswani", config)
    vaswani.save_pretrained(workdir / "vaswani")
    # Any tokenizer with the model's special ids: the export pads its vocabulary to the embedding rows.
    tokenizer = train_bpe_tokenizer(
        iter(["a tokenizer for the export"]), min_frequency=1, show_progress=False
    )
    save_tokenizers(tokenizer, tokenizer, workdir / "vaswani")
    if "vaswani-onnx" in args.impl:
        export(workdir / "vaswani", workdir / "vaswani-onnx", "onnx", force=True)
    for q in QUANTIZATIONS:
        if f"vaswani-ct2-{q}" in args.impl:
            export(
                workdir / "vaswani", workdir / f"vaswani-ct2-{q}", "ctranslate2", quantization=q, force=True
            )
    marian_exports = [q for q in QUANTIZATIONS if f"marian-ct2-{q}" in args.impl]
    if marian_exports:
        common.build_model("marian", config).save_pretrained(workdir / "marian")
        for q in marian_exports:
            convert_marian(workdir / "marian", workdir / f"marian-ct2-{q}", q, args.vocab)
    stamp.write_text(json.dumps(sizes))


def convert_marian(folder: Path, output: Path, quantization: str, vocab_size: int) -> None:
    """CTranslate2's transformers converter (its `MarianConfig` loader) on a saved `MarianMTModel`, with a stand-in
    tokenizer: the model was never trained, so made-up tokens stand for a vocabulary. The loader takes the last token
    for the `<pad>` that transformers appends to Marian's vocabulary and drops it (a decoder that starts from a zero
    embedding needs none), so the CTranslate2 Marian has one token less than ours."""
    from ctranslate2.converters.transformers import TransformersConverter

    class Vocabulary:
        eos_token, unk_token = "</s>", "<unk>"

        def get_vocab(self):
            tokens = (
                ["<blank>", "<s>", "</s>", "<unk>"] + [f"t{i}" for i in range(4, vocab_size - 1)] + ["<pad>"]
            )
            return {token: i for i, token in enumerate(tokens)}

    class MarianConverter(TransformersConverter):
        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            return Vocabulary()

    MarianConverter(str(folder)).convert(str(output), quantization=quantization, force=True)


def load(name: str, args, workdir: Path):
    """A decoding function of one implementation: source id lists -> per sentence, the generated ids."""
    if name in ("vaswani", "marian"):
        model = common.build_model(name, common.vaswani_config(args.preset, args.vocab)).eval()
        return lambda sources, beams: generate_pytorch(model, sources, beams, args)
    if name == "vaswani-onnx":
        from vaswani.interop.engines import load_engine

        engine = load_engine(workdir / name, threads=args.threads)
        return lambda sources, beams: [
            hypotheses[0].ids
            for hypotheses in engine.generate(
                sources,
                num_beams=beams,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                length_penalty=1.0,
                length_penalty_form="power",
            )
        ]
    import ctranslate2

    translator = ctranslate2.Translator(str(workdir / name), device="cpu", intra_threads=args.threads)
    tokens = json.loads((workdir / name / "shared_vocabulary.json").read_text(encoding="utf-8"))
    return lambda sources, beams: [
        result.hypotheses[0]
        for result in translator.translate_batch(
            [[tokens[i % len(tokens)] for i in ids] for ids in sources],
            beam_size=beams,
            length_penalty=1.0,
            min_decoding_length=args.new_tokens,
            max_decoding_length=args.new_tokens,
        )
    ]


@torch.inference_mode()
def generate_pytorch(model, sources: list[list[int]], beams: int, args) -> list[list[int]]:
    """`model.generate()` of exactly `args.new_tokens` tokens a sentence, held there as `args.fixed_length` says."""
    input_ids = torch.tensor(sources)
    suppress_eos = args.fixed_length == "min-new-tokens"
    config = common.fixed_length_generation_config(beams, args.new_tokens, suppress_eos)
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


def in_child(name: str) -> bool:
    """Whether an implementation is timed in child processes: the exported engines. Once CTranslate2 has translated in
    a process, that process's torch GEMMs run at about half their speed (a 16x512x2048 float32 matmul: 260 us against
    145 us, Intel Xeon), which would put the PyTorch rows, not the engines, on trial."""
    return "ct2" in name or "onnx" in name


def child_times(module: str, name: str, args, workdir: Path) -> dict[int, dict]:
    """One timed decode of implementation `name` per beam setting, after `--warmup` untimed ones, in a fresh process
    running `module`'s `--engine-child`: {beams: {"seconds", "outputs"}}."""
    flags = {
        "--engine-child": name,
        "--workdir": workdir,
        "--preset": args.preset,
        "--vocab": args.vocab,
        "--batch-size": args.batch_size,
        "--src-len": args.src_len,
        "--new-tokens": args.new_tokens,
        "--threads": args.threads,
        "--warmup": args.warmup,
        "--fixed-length": args.fixed_length,
    }
    child = [str(part) for flag, value in flags.items() for part in (flag, value)]
    child += ["--beams", *map(str, args.beams)]
    return {int(beams): timed for beams, timed in common.run_child(module, child).items()}


def timing_child(args, decode) -> None:
    """The child of `child_times`: its result as a JSON line."""
    result = {}
    for beams in args.beams:
        job = make_job(decode, beams, args)
        for _ in range(args.warmup):
            job()
        start = time.perf_counter()
        outputs = job()
        result[beams] = {"seconds": time.perf_counter() - start, "outputs": outputs}
    print(json.dumps(result))


def rounds_of_times(module: str, args, workdir: Path, load) -> tuple[dict, dict]:
    """Seconds per decode of each (implementation, beams) of `args.impl`, `--repeats` rounds, and the tokens each
    decoded. A round times the implementations that run in this process (`load(name, args, workdir)`) once each,
    interleaved, then each exported engine (`in_child`) once in a fresh child running `module`. Every implementation
    decodes `--warmup` times untimed first (at least once in this process, for its tokens)."""
    children = [name for name in args.impl if in_child(name)]
    decoders = {name: load(name, args, workdir) for name in args.impl if name not in children}
    jobs = {(name, beams): make_job(decoders[name], beams, args) for name in decoders for beams in args.beams}
    outputs = {key: job() for key, job in jobs.items()}  # the tokens each decodes: the first warm-up
    times = {key: [] for key in jobs} | {(name, beams): [] for name in children for beams in args.beams}
    for round_ in range(args.repeats):
        warmup = max(args.warmup - 1, 0) if round_ == 0 else 0
        for key, seconds in common.interleaved_times(jobs, 1, warmup).items():
            times[key] += seconds
        for name in children:
            for beams, timed in child_times(module, name, args, workdir).items():
                times[name, beams].append(timed["seconds"])
                outputs[name, beams] = timed["outputs"]
    return times, outputs


def memory_child(args) -> None:
    """Subprocess: peak resident memory of loading one implementation and decoding one batch, as a JSON line."""
    name, beams, workdir = args.memory_child.split(",", 2)
    torch.set_num_threads(args.threads)
    decode = load(name, args, Path(workdir))
    memory = common.peak_rss_during(make_job(decode, int(beams), args))
    print(json.dumps(memory))


# --------------------------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------------------------
def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.memory_child:
        memory_child(args)
        return {}
    torch.set_num_threads(args.threads)
    if args.engine_child:
        timing_child(args, load(args.engine_child, args, Path(args.workdir)))
        return {}
    with tempfile.TemporaryDirectory() as temporary:
        workdir = Path(args.workdir or temporary)
        workdir.mkdir(parents=True, exist_ok=True)
        prepare(args, workdir)
        times, _ = rounds_of_times("bench.bench_engines", args, workdir, load)
        rows = []
        for (name, beams), seconds in times.items():
            row = {
                "preset": args.preset,
                "impl": name,
                "decoding": "greedy" if beams == 1 else f"beam-{beams}",
                "beams": beams,
                "batch_s": common.median(seconds),
                "batch_s_all": seconds,
                "tokens_per_s": args.batch_size * args.new_tokens / common.median(seconds),
                # the least disturbed run: on a shared machine, the closest to the engine's own speed
                "best_tokens_per_s": args.batch_size * args.new_tokens / min(seconds),
            }
            if not args.no_memory:
                child = ["--memory-child", f"{name},{beams},{workdir}", "--preset", args.preset]
                child += ["--batch-size", str(args.batch_size), "--src-len", str(args.src_len)]
                child += ["--new-tokens", str(args.new_tokens), "--vocab", str(args.vocab)]
                child += ["--threads", str(args.threads), "--fixed-length", args.fixed_length]
                memory = common.run_child("bench.bench_engines", child)
                row["peak_rss_mib"], row["mem_rise_mib"] = memory["peak_rss_mib"], memory["rise_mib"]
            rows.append(row)
    add_ratios(rows)
    columns = [
        ("decoding", "decoding", ""),
        ("impl", "impl", ""),
        ("tokens_per_s", "tok/s", ".0f"),
        ("vs_marian", "x marian", ".2f"),
        ("vs_vaswani", "x vaswani", ".2f"),
        ("vs_peer", "x peer", ".2f"),
        ("best_vs_peer", "best x peer", ".2f"),
        ("peer", "peer", ""),
        ("peak_rss_mib", "peak RSS MiB", ".0f"),
        ("mem_rise_mib", "rise MiB", ".0f"),
    ]
    print(
        f"\ndecoding, preset {args.preset}: batch {args.batch_size}, source {args.src_len}, exactly {args.new_tokens} new "
        f"tokens, vocab {args.vocab}, {args.threads} threads each, median of {args.repeats}"
    )
    print(common.table(rows, columns))
    result = {
        "machine": common.machine(),
        "versions": versions(),
        "settings": {
            k: v
            for k, v in vars(args).items()
            if k not in ("json", "memory_child", "engine_child", "workdir")
        },
        "memory_measure": "VmHWM of a fresh process that loads the model and decodes one batch; rise = during the decode",
        "results": rows,
    }
    common.write_json(args.json, result)
    return result


def add_ratios(rows: list[dict]) -> None:
    """Throughput ratios: against MarianMTModel.generate(), our PyTorch path, and each export's named peer."""
    by_key = {(row["impl"], row["beams"]): row for row in rows}
    for row in rows:
        for column, other in (("vs_marian", "marian"), ("vs_vaswani", "vaswani")):
            peer = by_key.get((other, row["beams"]))
            row[column] = row["tokens_per_s"] / peer["tokens_per_s"] if peer and peer is not row else None
        peer_name = PEERS.get(row["impl"])
        peer = by_key.get((peer_name, row["beams"]))
        row["peer"] = peer_name if peer else None
        row["vs_peer"] = row["tokens_per_s"] / peer["tokens_per_s"] if peer else None
        row["best_vs_peer"] = row["best_tokens_per_s"] / peer["best_tokens_per_s"] if peer else None


def versions() -> dict[str, str]:
    found = {}
    for package in ("ctranslate2", "onnxruntime", "onnx", "onnxscript"):
        try:
            found[package] = __import__(package).__version__
        except ImportError:
            found[package] = None
    return found


if __name__ == "__main__":
    main(sys.argv[1:])
