"""Training steps compiled with `torch.compile` against eager steps with the model's CPU kernels, on token-budget
batches of several shapes, same weights, jobs interleaved.

The en->de recipe's step (the `tiny` preset, vocabulary 8000, bf16 autocast, fused AdamW) on batches of about 8000
tokens of the shapes a `--max_tokens 8192` epoch holds (480 pairs of 16 + 16 tokens, 240 of 32 + 32, ...):

- eager: the model with `use_cpu_kernels` and the output projection inside the loss, as `vaswani-train` trains;
- compiled: the same model under `torch.compile` (inductor), the batch's dimensions dynamic
  (`recipe.batching.mark_batch_dynamic`), the logits into the recipe's loss, as `vaswani-train --torch_compile`
  trains.

Prints the seconds of each shape's first compiled step (compilation included), the graphs compiled, and the median
seconds per step of each job once compiled.

    python -m bench.ab_compiled_training --repeats 3 --json bench/results/compiled_training_tiny_cpu.json
"""

import argparse
import sys
import time

import torch

from bench import common
from vaswani import VaswaniConfig, VaswaniForConditionalGeneration, kernels
from vaswani.recipe import losses
from vaswani.recipe.batching import mark_batch_dynamic
from vaswani.recipe.callbacks import compiled_graphs

SHAPES = [(480, 16, 16), (240, 32, 32), (336, 24, 24), (168, 48, 40), (480, 16, 8), (240, 32, 24)]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed rounds over every shape (median reported)"
    )
    parser.add_argument("--backend", default="inductor", help="torch.compile's backend")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="tiny settings for a smoke test")
    args = parser.parse_args(argv)
    shapes = SHAPES
    config = dict(vocab_size=args.vocab, attn_implementation=common.FAST_ATTENTION)
    if args.quick:
        shapes = [(4, 6, 5), (3, 8, 7)]
        config.update(vocab_size=300, d_model=16, encoder_ffn_dim=24, decoder_ffn_dim=24)
        args.repeats = 1
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", **config))
    eager = kernels.use_cpu_kernels(model, attention=False)
    compiled = VaswaniForConditionalGeneration(eager.config)
    compiled.load_state_dict(eager.state_dict())
    kernels.use_cpu_kernels(compiled, attention=False)
    eager.train(), compiled.train()
    forward = torch.compile(compiled, backend=args.backend)
    adam = dict(lr=1e-4, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0, fused=True)
    optimizers = {"eager": torch.optim.AdamW(eager.parameters(), **adam)}
    optimizers["compiled"] = torch.optim.AdamW(compiled.parameters(), **adam)
    batches = [
        common.random_batch(b, s, t, eager.config.vocab_size, seed=i) for i, (b, s, t) in enumerate(shapes)
    ]

    def eager_step(batch) -> float:
        optimizers["eager"].zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = common.training_loss("vaswani", eager, batch, 0.1)
        loss.backward()
        optimizers["eager"].step()
        return loss.item()

    def compiled_step(batch) -> float:
        optimizers["compiled"].zero_grad(set_to_none=True)
        inputs = {
            "input_ids": batch["input_ids"],
            "attention_mask": batch["attention_mask"],
            "decoder_input_ids": compiled.prepare_decoder_input_ids_from_labels(batch["labels"]),
        }
        mark_batch_dynamic(inputs)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = losses.label_smoothed_loss(forward(**inputs), batch["labels"], epsilon=0.1)
        loss.backward()
        optimizers["compiled"].step()
        return loss.item()

    graphs_before = compiled_graphs()
    first = []
    for shape, batch in zip(shapes, batches, strict=True):
        started = time.perf_counter()
        compiled_step(batch)
        first.append({"shape": shape, "seconds": time.perf_counter() - started, "graphs": compiled_graphs()})
        print(
            f"first compiled step {shape}: {first[-1]['seconds']:.1f} s, {first[-1]['graphs']} graphs",
            flush=True,
        )
    jobs = {
        "eager": lambda: [eager_step(b) for b in batches],
        "compiled": lambda: [compiled_step(b) for b in batches],
    }
    times = common.interleaved_times(jobs, args.repeats, warmup=1)
    per_step = {name: common.median(seconds) / len(batches) for name, seconds in times.items()}
    for name, seconds in per_step.items():
        print(f"{name}: {seconds:.3f} s a step")
    print(f"eager / compiled: {per_step['eager'] / per_step['compiled']:.2f}")
    result = {
        "machine": common.machine(),
        "settings": vars(args),
        "shapes": shapes,
        "first_compiled_steps": first,
        "graphs_compiled": compiled_graphs() - graphs_before,
        "seconds_per_round": times,
        "median_s_per_step": per_step,
        "compiled_speedup": per_step["eager"] / per_step["compiled"],
    }
    common.write_json(args.json, result)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
