"""The paper's training step at the paper's scale on one GPU: `base` and `big` on updates of about 25,000 target
tokens (§5.1), bf16 autocast, with and without `torch.compile`, beside transformers' `MarianMTModel` at the same sizes
in the same run. Prints target tokens per second, model FLOPs utilisation and peak GPU memory per job, and the
GPU-hours the paper's schedule (100k updates for base, 300k for big, §5.2) would take at the measured speed.

A step is the forward pass, the label-smoothed loss (ε_ls 0.1), the backward pass and a fused Adam step on one batch
of `--batch_tokens` target tokens (pairs of `--length` tokens a side, WMT's average); each job runs for
`--seconds` after `--warmup` untimed steps, jobs interleaved in rounds so that they meet the machine alike. MFU is
6 x parameters x target tokens per second over the bf16 matmul peak measured in the same run (attention scores
left out; at 25 tokens they add about 2%). The compiled jobs compile as `vaswani-train --torch_compile` does: the
batch's sentences and tokens dynamic (`recipe.batching.mark_batch_dynamic`), one graph for every batch shape.

    python -m bench.gpu_wmt_throughput --json bench/results/gpu_wmt_h200.json          # one GPU, ~6 minutes
    python -m bench.gpu_wmt_throughput --device cpu --preset tiny --batch_tokens 512 --seconds 1 --vocab 1000

On a machine without CUDA the first form says so and exits; the second runs the same code on the CPU with a tiny
configuration, as the tests do.
"""

import argparse
import sys
import time

import torch

from bench import common
from vaswani.recipe.batching import mark_batch_dynamic

PAPER_UPDATES = {"base": 100_000, "big": 300_000}  # §5.2: 100k steps (12 h on 8 P100) and 300k (3.5 days)
IMPLEMENTATIONS = ("vaswani", "marian")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", nargs="+", default=["base", "big"], help="VaswaniConfig presets")
    parser.add_argument("--impl", nargs="+", default=list(IMPLEMENTATIONS), choices=IMPLEMENTATIONS)
    parser.add_argument("--compile", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"])
    parser.add_argument("--batch_tokens", type=int, default=25000, help="target tokens per update (§5.1)")
    parser.add_argument("--length", type=int, default=25, help="tokens per sentence, both sides")
    parser.add_argument("--vocab", type=int, default=37000, help="shared vocabulary (§5.1: about 37000)")
    parser.add_argument("--seconds", type=float, default=30.0, help="timed seconds per job")
    parser.add_argument(
        "--warmup", type=int, default=3, help="untimed steps per job first (compilation included)"
    )
    parser.add_argument("--device", default="cuda", help="cuda, or cpu to check the script")
    parser.add_argument("--json", help="write the results here")
    return parser.parse_args(argv)


def build_job(name: str, preset: str, compiled: bool, args, device: str):
    """A closure running one training step of a fresh model, and the model."""
    config = common.vaswani_config(preset, args.vocab, attn_implementation="sdpa")
    model = common.build_model(name, config).to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
    forward = torch.compile(model) if compiled else model
    pairs = max(1, args.batch_tokens // args.length)
    batch = common.random_batch(pairs, args.length, args.length, args.vocab, device=device)
    if compiled:  # the graph `vaswani-train --torch_compile` compiles: one for every batch shape
        mark_batch_dynamic(batch)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = common.training_loss(name, forward, batch, 0.1)
        loss.backward()
        optimizer.step()

    return step, model, pairs * args.length


def timed(step, seconds: float, device: str) -> tuple[int, float]:
    """Steps run and seconds taken, running `step` until `seconds` have passed."""
    common.synchronize(device)
    started, steps = time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        step()
        steps += 1
    common.synchronize(device)
    return steps, time.perf_counter() - started


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("skipped: no CUDA device on this machine (--device cpu checks the script)")
        result = {"machine": common.machine(), "skipped": "no CUDA device", "results": []}
        common.write_json(args.json, result)
        return result
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    peak = common.matmul_peak(device=device) if device == "cuda" else common.matmul_peak((512, 256, 256), 3)
    print(f"bf16 matmul peak: {peak['bf16'] / 1e3:.0f} TFLOP/s")
    rows = []
    for preset in args.preset:
        for compiled in [c == "compiled" for c in args.compile]:
            jobs = {name: build_job(name, preset, compiled, args, device) for name in args.impl}
            for step, _, _ in jobs.values():
                for _ in range(args.warmup):
                    step()
            totals = {name: [0, 0.0] for name in jobs}
            rounds = 3  # interleaved thirds of each job's time
            peak_memory = {}
            for _ in range(rounds):
                for name, (step, _, _) in jobs.items():
                    if device == "cuda":
                        torch.cuda.reset_peak_memory_stats()
                    steps, seconds = timed(step, args.seconds / rounds, device)
                    totals[name][0] += steps
                    totals[name][1] += seconds
                    if device == "cuda":
                        peak_memory[name] = max(
                            peak_memory.get(name, 0.0), torch.cuda.max_memory_allocated() / 2**30
                        )
            for name, (_, model, tokens) in jobs.items():
                steps, seconds = totals[name]
                tokens_per_s = steps * tokens / seconds
                params = common.num_parameters(model)
                row = {
                    "preset": preset,
                    "impl": name,
                    "compile": compiled,
                    "params_m": params / 1e6,
                    "tokens_per_update": tokens,
                    "step_s": seconds / steps,
                    "tokens_per_s": tokens_per_s,
                    "mfu": 6 * params * tokens_per_s / (peak["bf16"] * 1e9),
                    "peak_memory_gib": peak_memory.get(name),
                }
                updates = PAPER_UPDATES.get(preset)
                if updates:  # the paper's schedule at 25,000 tokens an update, at this speed
                    row["paper_gpu_hours"] = updates * args.batch_tokens / tokens_per_s / 3600
                rows.append(row)
            del jobs
            if device == "cuda":
                torch.cuda.empty_cache()
    for row in rows:
        marian = next(
            (
                r
                for r in rows
                if (r["preset"], r["impl"], r["compile"]) == (row["preset"], "marian", row["compile"])
            ),
            None,
        )
        row["vs_marian"] = row["tokens_per_s"] / marian["tokens_per_s"] if marian else None
    columns = [
        ("preset", "preset", ""),
        ("impl", "impl", ""),
        ("compile", "compile", ""),
        ("params_m", "params M", ".1f"),
        ("step_s", "step s", ".3f"),
        ("tokens_per_s", "tgt tok/s", ".0f"),
        ("mfu", "MFU", ".1%"),
        ("peak_memory_gib", "peak GiB", ".1f"),
        ("vs_marian", "x marian", ".2f"),
        ("paper_gpu_hours", "GPU-h, paper schedule", ".1f"),
    ]
    print(
        f"\n{args.batch_tokens} target tokens an update, {args.length} tokens a sentence, bf16 autocast, {device}"
    )
    print(common.table(rows, columns))
    result = {
        "machine": common.machine(),
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "matmul_peak_gflops": peak,
        "flop_formula": "6 * parameters * target tokens per second",
        "results": rows,
    }
    common.write_json(args.json, result)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
