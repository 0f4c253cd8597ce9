"""The paper's training step at the paper's scale on one GPU: `base` and `big` on updates of about 25,000 target
tokens (§5.1), bf16 autocast, eager and compiled (as `vaswani-train --torch_compile`: the batch's dimensions dynamic,
one graph for every shape), beside transformers' `MarianMTModel` at the same sizes. Prints target tokens per second,
model FLOPs utilisation (6 x parameters x target tokens over the bf16 matmul peak of the same run; attention scores
left out, about 2% at 25 tokens), peak GPU memory, and the GPU-hours of the paper's schedule (100k updates for base,
300k for big, §5.2) at the measured speed. Each job runs `--seconds` after `--warmup` untimed steps, in three
interleaved rounds so that the jobs meet the machine alike.

    python -m bench gpu-wmt --preset base --seconds 4 --warmup 2 --json bench/results/gpu_wmt_base_h200.json
    python -m bench gpu-wmt --quick --compile eager

Without CUDA the first form says so and exits; the second runs the same code on the CPU at a tiny size.
"""

import collections
import time

import torch

from bench import common, train
from vaswani.recipe.batching import mark_batch_dynamic

PAPER_UPDATES = {"base": 100_000, "big": 300_000}  # §5.2: 100k steps (12 h on 8 P100) and 300k (3.5 days)


def parse_args(argv):
    parser = common.parser("gpu-wmt", __doc__, repeats=3)
    common.model_flags(parser, ("vaswani", "marian"), ["base", "big"])
    parser.set_defaults(warmup=3)
    parser.add_argument("--compile", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"])
    parser.add_argument("--batch-tokens", type=int, default=25000, help="target tokens per update (§5.1)")
    parser.add_argument("--length", type=int, default=25, help="tokens per sentence, both sides")
    parser.add_argument("--seconds", type=float, default=30.0, help="timed seconds per job")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu to check the command")
    quick = {"preset": ["tiny"], "batch_tokens": 200, "length": 10, "vocab": 300, "seconds": 0.3, "warmup": 1}
    args = common.parse(parser, argv, device="cpu", **quick)
    args.attention = "sdpa"
    return args


def timed(step, seconds, device):
    """Steps run and seconds taken, running `step` until `seconds` have passed."""
    common.synchronize(device)
    started, steps = time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        step()
        steps += 1
    common.synchronize(device)
    return steps, time.perf_counter() - started


def measure(args, preset, compiled, peak):
    """One row per implementation: `--repeats` rounds of `--seconds` / `--repeats` each, interleaved."""
    pairs, device = max(1, args.batch_tokens // args.length), args.device
    jobs, steps_run, seconds_run, memory = {}, collections.Counter(), collections.Counter(), {}
    for name in args.impl:
        batch = common.random_batch(pairs, args.length, args.length, args.vocab, device=device)
        if compiled:  # as `vaswani-train --torch_compile` compiles: one graph for every batch shape
            mark_batch_dynamic(batch)
        model, optimizer, forward = train.build(name, preset, args, device, compiled)
        jobs[name] = model, train.make_step(name, forward, optimizer, batch, "bf16", device)
        for _ in range(args.warmup):
            jobs[name][1]()
    for _ in range(args.repeats):
        for name, (_, step) in jobs.items():
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            steps, seconds = timed(step, args.seconds / args.repeats, device)
            steps_run[name] += steps
            seconds_run[name] += seconds
            if device == "cuda":
                memory[name] = max(memory.get(name, 0.0), torch.cuda.max_memory_allocated() / 2**30)
    rows = []
    for name, (model, _) in jobs.items():
        steps, seconds = steps_run[name], seconds_run[name]
        params, tokens_per_s = common.num_parameters(model), steps * pairs * args.length / seconds
        row = {
            "preset": preset,
            "impl": name,
            "compile": compiled,
            "params_m": params / 1e6,
            "tokens_per_update": pairs * args.length,
            "step_s": seconds / steps,
            "tokens_per_s": tokens_per_s,
            "mfu": 6 * params * tokens_per_s / (peak["bf16"] * 1e9),
            "peak_memory_gib": memory.get(name),
        }
        if preset in PAPER_UPDATES:  # the paper's schedule at this speed
            row["paper_gpu_hours"] = PAPER_UPDATES[preset] * args.batch_tokens / tokens_per_s / 3600
        rows.append(row)
    return rows


def main(argv):
    args = parse_args(argv)
    if args.device == "cuda":
        if skipped := common.cuda_or_skip(args):
            return skipped
        torch.backends.cuda.matmul.allow_tf32 = True
    peak = common.matmul_peak(None if args.device == "cuda" else (512, 256, 256), device=args.device)
    rows = []
    for preset in args.preset:
        for compiled in [c == "compiled" for c in args.compile]:
            rows += measure(args, preset, compiled, peak)
            if args.device == "cuda":
                torch.cuda.empty_cache()
    columns = [
        "preset",
        "impl",
        "compile",
        ("step_s", "step s", ".3f"),
        ("tokens_per_s", "tgt tok/s", ".0f"),
        ("mfu", "MFU", ".1%"),
        ("peak_memory_gib", "peak GiB", ".1f"),
        *common.add_ratios(rows, ("preset", "compile"), ("marian",)),
        ("paper_gpu_hours", "GPU-h, paper schedule", ".1f"),
    ]
    title = (
        f"{args.batch_tokens} target tokens an update, {args.length} a sentence, bf16 autocast, {args.device}"
    )
    return common.report(args, title, rows, columns, matmul_peak_gflops=peak)
