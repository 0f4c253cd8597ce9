"""Decoding speed, latency and memory at equal sizes, in one run: three commands over one set of implementations,
all built from one `VaswaniConfig` preset with random weights (`common.build_model`, seed 0).

`generate`: PyTorch's decoders of the same architecture.
- `vaswani`: `VaswaniForConditionalGeneration.generate()` (attn_implementation "vaswani_sdpa");
- `marian`: transformers' `MarianMTModel.generate()`, with the same `GenerationConfig`;
- `torch`: `nn.Transformer` (`common.torch_generate`: it has no KV cache, so every step reruns the prefix).

`engines`: the exports beside PyTorch; each export's peer is `vaswani` (ONNX) or CTranslate2's Marian (ours).
- `vaswani-onnx`: our ONNX export (`vaswani-export --engine onnx`) run by `vaswani.interop.engines`;
- `vaswani-ct2-<q>`: our CTranslate2 export (`vaswani-export --engine ctranslate2 --quantization <q>`);
- `marian-ct2-<q>`: CTranslate2's own converter applied to the `MarianMTModel`, same quantization.

`int8`: one saved folder loaded through transformers' door, against `fp32` and `ct2-int8`, with the share of greedy
sentences identical to `fp32`'s and of tokens before each sentence's first difference.
- `fp32`: `AutoModelForSeq2SeqLM.from_pretrained(folder)`; `fp32-kernels`: then `vaswani.use_cpu_kernels(model)`;
- `int8`: `from_pretrained(folder, quantization_config=TorchAoConfig(Int8DynamicActivationInt8WeightConfig()))`
  (transformers keeps the tied output projection in float32); `int8-kernels`: then `use_cpu_kernels` (`Int8Linear`);
- `ct2-int8`: the folder exported by `vaswani-export --engine ctranslate2 --quantization int8`.

Each decodes `--batch-size` random sources of `--src-len` tokens into exactly `--new-tokens` tokens, greedy and beam
4, length penalty 1, `--threads` threads each, medians of `--repeats` rounds. A round times the PyTorch jobs once
each in this process, interleaved, then each exported engine once in a fresh child process after a warm-up (where
CTranslate2 has translated, torch's GEMMs run about 1.8x slower). `generate` also times one sentence alone (latency).
Memory: the peak resident size of a fresh process that loads the model and decodes one batch, and its rise during the
decode; with `generate --gpu` (bf16 weights, the static cache), the rise of `torch.cuda.max_memory_allocated`.

    python -m bench generate --preset base --repeats 5 --fixed-length no-eos --json bench/results/generate_base_cpu.json
    python -m bench engines --preset base --repeats 5 --json bench/results/engines_base_cpu.json
    python -m bench int8 --preset base --batch-size 16 --repeats 5 --fixed-length no-eos --json bench/results/int8_base_cpu.json
"""

import argparse
import collections
import functools
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench import common

CT2 = tuple(f"{model}-ct2-{q}" for q in ("float32", "int8") for model in ("vaswani", "marian"))
COMMANDS = {  # implementations, batch size, the implementations every row is compared with
    "generate": (common.IMPLEMENTATIONS, 32, ("marian", "torch")),
    "engines": (("vaswani", "marian", "vaswani-onnx", *CT2), 32, ("marian", "vaswani", *CT2[1::2])),
    "int8": (("fp32", "fp32-kernels", "int8", "int8-kernels", "ct2-int8"), 16, ("fp32", "ct2-int8")),
}


def parse_args(what, argv):
    implementations, batch_size, _ = COMMANDS[what]
    parser = common.parser(what, __doc__)
    common.model_flags(parser, implementations, "base")
    # what every decoding command decodes: `--beams`, `--batch-size` sources of `--src-len` tokens, each into
    # exactly `--new-tokens` tokens, held there as `--fixed-length` says
    parser.add_argument("--beams", nargs="+", type=int, default=[1, 4], help="1 is greedy")
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--src-len", type=int, default=20)
    parser.add_argument("--new-tokens", type=int, default=30)
    parser.add_argument(
        "--fixed-length",
        choices=["min-new-tokens", "no-eos"],
        default="min-new-tokens",
        help="how a PyTorch generate() makes every sentence exactly --new-tokens long: `min-new-tokens` keeps the EOS "
        "id and adds generate()'s MinNewTokensLength processor (a vocabulary-wide mask per step, work of the "
        "benchmark, not of the model); `no-eos` decodes without an EOS id. Exported engines hold their end token back "
        "with their own minimum length either way",
    )
    parser.add_argument(
        "--threads", type=int, default=torch.get_num_threads(), help="threads of every engine"
    )
    if what != "int8":  # int8 measures speed and agreement only
        parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    if what == "generate":
        parser.add_argument(
            "--gpu", action="store_true", help="GPU mode: bf16 weights, the static cache; needs CUDA"
        )
    parser.add_argument(
        "--workdir", help="where the models are saved and exported (default: a temporary folder)"
    )
    parser.add_argument("--engine-child", help=argparse.SUPPRESS)  # one implementation in a subprocess
    parser.add_argument("--memory", action="store_true", help=argparse.SUPPRESS)  # the child measures memory
    parser.set_defaults(gpu=False, no_memory=what == "int8")
    quick = {"preset": "small", "batch_size": 2, "src_len": 5, "new_tokens": 4, "vocab": 1000, "repeats": 1}
    args = common.parse(parser, argv, **quick)
    args.device = "cuda" if args.gpu else "cpu"
    return args


def prepare(args, workdir):
    """Save the model and write every export the implementations need into `workdir`; a `--workdir` prepared before
    for the same preset, vocabulary and implementations is reused as it is."""
    from vaswani.interop.export import export
    from vaswani.recipe.tokenization import save_tokenizers, train_bpe_tokenizer

    stamp, sizes = (
        workdir / "models.json",
        {"preset": args.preset, "vocab": args.vocab, "impl": sorted(args.impl)},
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
    exports = {"vaswani-ct2-int8" if name == "ct2-int8" else name for name in args.impl}
    if "vaswani-onnx" in exports:
        export(workdir / "vaswani", workdir / "vaswani-onnx", "onnx", force=True)
    for name in exports & set(CT2):
        quantization = name.split("-")[-1]
        if name.startswith("vaswani"):
            export(workdir / "vaswani", workdir / name, "ctranslate2", quantization=quantization, force=True)
        else:
            common.build_model("marian", config).save_pretrained(workdir / "marian")
            convert_marian(workdir / "marian", workdir / name, quantization, args.vocab)
    stamp.write_text(json.dumps(sizes))


def convert_marian(folder, output, quantization, vocab_size):
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


def load(name, args, workdir):
    """A decoding function of one implementation: (source id lists, beams) -> per sentence, the generated ids."""
    if name in common.IMPLEMENTATIONS:
        model = (
            common.build_model(name, common.vaswani_config(args.preset, args.vocab)).eval().to(args.device)
        )
        model = model.bfloat16() if args.gpu else model
        if name == "torch":
            return lambda sources, beams: common.torch_generate(
                model, *tensors(sources, args.device), beams, args.new_tokens
            )[:, 1:].tolist()
        return lambda sources, beams: generate_pytorch(model, sources, beams, args)
    if name.startswith(("fp32", "int8")):
        return load_folder(name, args, workdir)
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

    folder = workdir / ("vaswani-ct2-int8" if name == "ct2-int8" else name)
    translator = ctranslate2.Translator(str(folder), device="cpu", intra_threads=args.threads)
    tokens = json.loads((folder / "shared_vocabulary.json").read_text(encoding="utf-8"))
    ids = {token: i for i, token in enumerate(tokens)}

    def decode(sources, beams):
        """The tokens of each sentence; for `ct2-int8`, compared with PyTorch's, their ids."""
        results = translator.translate_batch(
            [[tokens[i % len(tokens)] for i in source] for source in sources],
            beam_size=beams,
            min_decoding_length=args.new_tokens,
            max_decoding_length=args.new_tokens,
            length_penalty=1.0,
        )
        outputs = [result.hypotheses[0] for result in results]
        return [[ids[token] for token in out] for out in outputs] if name == "ct2-int8" else outputs

    return decode


def load_folder(name, args, workdir):
    """`fp32`, `int8` and their `-kernels` forms: the saved folder through `AutoModelForSeq2SeqLM`."""
    from transformers import AutoModelForSeq2SeqLM

    import vaswani

    kwargs = {}
    if name.startswith("int8"):
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig
        from transformers import TorchAoConfig

        kwargs = {
            "quantization_config": TorchAoConfig(Int8DynamicActivationInt8WeightConfig()),
            "device_map": "cpu",
        }
    model = AutoModelForSeq2SeqLM.from_pretrained(workdir / "vaswani", **kwargs).eval()
    if name.endswith("-kernels"):
        vaswani.use_cpu_kernels(model)
    return lambda sources, beams: generate_pytorch(model, sources, beams, args)


def tensors(sources, device):
    input_ids = torch.tensor(sources, device=device)
    return input_ids, torch.ones_like(input_ids)


@torch.inference_mode()
def generate_pytorch(model, sources, beams, args):
    """`model.generate()` of exactly `--new-tokens` tokens a sentence, greedy (`beams` 1) or beam search, length
    penalty 1, held there as `--fixed-length` says: the EOS id kept and suppressed by `min_new_tokens`, or no EOS id
    at all."""
    from transformers import GenerationConfig

    suppress_eos = args.fixed_length == "min-new-tokens"
    config = GenerationConfig(
        num_beams=beams,
        max_new_tokens=args.new_tokens,
        min_new_tokens=args.new_tokens if suppress_eos else None,
        do_sample=False,
        length_penalty=1.0,
        use_cache=True,
        bos_token_id=common.BOS,
        eos_token_id=common.EOS if suppress_eos else None,
        pad_token_id=common.PAD,
        decoder_start_token_id=common.BOS,
        cache_implementation="static" if args.gpu else None,
    )
    input_ids, attention_mask = tensors(sources, args.device)
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    return out[:, 1:].tolist()


def make_job(decode, beams, batch_size, args):
    """A closure decoding one batch; checks that exactly `--new-tokens` tokens came out for every sentence."""
    sources = common.random_batch(batch_size, args.src_len, 1, args.vocab, seed=beams)["input_ids"].tolist()

    def job():
        outputs = decode(sources, beams)
        if [len(output) for output in outputs] != [args.new_tokens] * batch_size:
            raise RuntimeError(
                f"expected {args.new_tokens} tokens per sentence, got {[len(o) for o in outputs]}"
            )
        return outputs

    return job


def engine_child(args, workdir):
    """Subprocess: per beam setting, `--warmup` untimed decodes then one timed; or with `--memory` (and one beam
    setting) the peak resident memory of one decode, the model loaded. A JSON line."""
    decode, result = load(args.engine_child, args, workdir), {}
    if args.memory:
        result = common.peak_rss_during(make_job(decode, args.beams[0], args.batch_size, args))
    else:
        for beams in args.beams:
            job = make_job(decode, beams, args.batch_size, args)
            for _ in range(args.warmup):
                job()
            start = time.perf_counter()
            result[beams] = {"outputs": job(), "seconds": time.perf_counter() - start}
    print(json.dumps(result))


def rounds_of_times(args, workdir):
    """Seconds per decode of each (implementation, beams, batch size), `--repeats` rounds; the tokens each decoded;
    the in-process jobs. A round times the in-process jobs once each, interleaved, then each exported engine once in
    a fresh child. `generate` times one sentence alone too."""
    children = [name for name in args.impl if "ct2" in name or "onnx" in name]
    sizes = [args.batch_size, 1] if args.bench == "generate" else [args.batch_size]
    decoders = {name: load(name, args, workdir) for name in args.impl if name not in children}
    jobs = {(n, b, s): make_job(decoders[n], b, s, args) for n in decoders for b in args.beams for s in sizes}
    outputs = {key: job() for key, job in jobs.items()}  # the tokens each decodes: the first warm-up
    times = collections.defaultdict(list)
    for round_ in range(args.repeats):
        warmup = max(args.warmup - 1, 0) if round_ == 0 else 0
        for key, seconds in common.interleaved_times(jobs, 1, warmup, args.device).items():
            times[key] += seconds
        for name in children:
            child = common.run_child(args.bench, [*args.argv, "--engine-child", name, "--workdir", workdir])
            child = json.loads(child.splitlines()[-1])
            for beams, timed in child.items():
                times[name, int(beams), args.batch_size].append(timed["seconds"])
                outputs[name, int(beams), args.batch_size] = timed["outputs"]
    return times, outputs, jobs


def measure(args, workdir):
    """One row per implementation and beam setting: tokens per second, latency, memory, agreement with `fp32`."""
    times, outputs, jobs = rounds_of_times(args, workdir)
    rows = []
    for name in args.impl:
        for beams in args.beams:
            key = name, beams, args.batch_size
            row = {
                "preset": args.preset,
                "impl": name,
                "beams": beams,
                "batch_s_all": times[key],
                "decoding": "greedy" if beams == 1 else f"beam-{beams}",
                "tokens_per_s": args.batch_size * args.new_tokens / statistics.median(times[key]),
            }
            if (name, beams, 1) in times:
                row["latency_s"] = statistics.median(times[name, beams, 1])
            reference = outputs.get(("fp32", beams, args.batch_size))
            if reference:
                row["same_sentences_as_fp32"], row["same_tokens_as_fp32"] = agreement(outputs[key], reference)
            # on a GPU, how far allocated memory rises over the weights and the data
            common.measure_memory(
                args,
                row,
                jobs.get(key),  # the in-process jobs: a GPU runs no exported engine
                "--engine-child",
                name,
                "--workdir",
                workdir,
                "--memory",
                "--beams",
                beams,
            )
            rows.append(row)
    return rows


def agreement(outputs, reference):
    """The share of sentences identical to the reference's, and of tokens identical before each first difference
    (after it, a greedy decoder continues another prefix)."""
    same_sentences = sum(a == b for a, b in zip(outputs, reference, strict=True)) / len(reference)
    prefix = sum(
        next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(b))
        for a, b in zip(outputs, reference, strict=True)
    )
    return same_sentences, prefix / sum(len(b) for b in reference)


def main(what, argv):
    from transformers.utils import logging as transformers_logging

    args = parse_args(what, argv)
    transformers_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    if args.gpu:
        if skipped := common.cuda_or_skip(args):
            return skipped
        args.no_memory = True
    with tempfile.TemporaryDirectory() as temporary:
        workdir = Path(args.workdir or temporary)
        if args.engine_child:
            return engine_child(args, workdir)
        if set(args.impl) - set(common.IMPLEMENTATIONS):
            workdir.mkdir(parents=True, exist_ok=True)
            prepare(args, workdir)
        rows = measure(args, workdir)
    peers = [peer for peer in COMMANDS[what][2] if peer in args.impl]
    columns = [  # latency: `generate` only
        ("tokens_per_s", "tok/s", ".0f"),
        ("latency_s", "latency s", ".3f"),
        *common.add_ratios(rows, ("beams",), peers),
        ("same_sentences_as_fp32", "sentences = fp32", ".2f"),
        ("same_tokens_as_fp32", "tokens = fp32", ".2f"),
        ("peak_rss_mib", "peak RSS MiB", ".0f"),
        ("mem_rise_mib", "mem rise MiB", ".0f"),
    ]
    columns = ["decoding", "impl", *(c for c in columns if any(row.get(c[0]) is not None for row in rows))]
    title = (
        f"decoding, preset {args.preset}: batch {args.batch_size}, source {args.src_len}, exactly {args.new_tokens} "
        f"new tokens ({args.fixed_length}), {args.threads} threads each, median of {args.repeats}"
    )
    versions = {}
    for package in ("ctranslate2", "onnxruntime", "onnx", "onnxscript", "torchao"):
        try:
            versions[package] = __import__(package).__version__
        except ImportError:
            versions[package] = None
    return common.report(args, title, rows, columns, versions=versions)


generate, engines, int8 = (functools.partial(main, what) for what in COMMANDS)  # the three commands
