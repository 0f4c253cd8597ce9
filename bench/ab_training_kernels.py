"""Whole training steps with the model's CPU kernels for dropout and the loss against torch's own functions, same
model, same batch, jobs interleaved.

The two kernels of `vaswani.kernels` that a CPU training step spends its time in besides matrix products:

- dropout: `kernels.Dropout` (a bit mask, four elements per 64-bit draw) at every dropout site of the model, against
  torch's `nn.Dropout` (a `bernoulli_` mask);
- the label-smoothed loss: `kernels.label_smoothed_cross_entropy` (one softmax per chunk of rows, the
  gradient written in the forward pass), against `F.cross_entropy(logits.float(), ..., label_smoothing=0.1)`.

Four jobs switch them on in every combination. A fifth, under autocast only (as the trainer does), adds the output
projection fused into the loss (`kernels.linear_label_smoothed_cross_entropy`, through
`losses.fused_output_loss`), which never holds the logits: what the recipe trains with; a sixth runs that step
with the for-loop AdamW (transformers' `adamw_torch` on the CPU) instead of the fused one (`adamw_torch_fused`). Two more
take one kernel of the recipe's step away each: `kernels.StackedProjections` (an attention layer's projections of
one input in one product; without it, one product and one input cast per projection), and the softmax rows that
`kernels.matmul_attention` pads to `SOFTMAX_MIN_KEYS` where there are fewer keys (`--length` below 16; without it,
torch's slow softmax over a short last dimension). By default the shape of
the en->de run of RESULTS.md (the `tiny` preset: d_model 128, 4+4 layers, 4 heads, d_ff 256, P_drop 0.3; an
8000-token vocabulary) on a batch of 480 pairs of 17 + 17 tokens (8160 tokens a side, one of its 8192-token
batches), bf16 autocast as it trains. A step is the forward pass, the label-smoothed loss (mean over target tokens),
the backward pass and a fused Adam step. Prints the median seconds per step of each job and its speed against
torch's functions for both.

    python -m bench.ab_training_kernels --repeats 10 --json bench/results/training_kernels_tiny_cpu.json
"""

import argparse
import sys

import torch
import torch.nn.functional as F
from torch import nn

from bench import common
from vaswani import VaswaniConfig, VaswaniForConditionalGeneration, kernels
from vaswani.recipe import losses

REFERENCE = "F.dropout + F.cross_entropy"
FUSED = "both kernels, fused projection"
LOOP_ADAM = "the same, for-loop AdamW"
UNSTACKED = "the same, projections one by one"
UNPADDED = "the same, softmax rows not padded"


def use_dropout(model: nn.Module, kind: type) -> None:
    """Every dropout module of `model` becomes `kind` (`nn.Dropout` or `kernels.Dropout`), in place."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.__class__ = kind


def torch_loss(logits: torch.Tensor, labels: torch.Tensor, epsilon: float = 0.0) -> torch.Tensor:
    """The reference that `label_smoothed_cross_entropy` names."""
    return F.cross_entropy(
        logits.flatten(0, -2).float(),
        labels.flatten(),
        ignore_index=-100,
        reduction="sum",
        label_smoothing=epsilon,
    )


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4, help="encoder and decoder layers each")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=256)
    parser.add_argument("--dropout", type=float, default=0.3)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--batch-size", type=int, default=480, help="sentence pairs per batch")
    parser.add_argument("--length", type=int, default=17, help="source and target tokens per sentence")
    parser.add_argument("--fp32", action="store_true", help="train in float32 instead of bf16 autocast")
    parser.add_argument("--repeats", type=int, default=10, help="timed steps of each job (median reported)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="tiny settings for a smoke test")
    args = parser.parse_args(argv)
    if args.quick:
        args.d_model, args.ffn, args.vocab, args.batch_size, args.length, args.repeats = 32, 64, 500, 8, 6, 1
    config = VaswaniConfig.from_preset(
        "tiny",
        vocab_size=args.vocab,
        d_model=args.d_model,
        encoder_layers=args.layers,
        decoder_layers=args.layers,
        encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads,
        encoder_ffn_dim=args.ffn,
        decoder_ffn_dim=args.ffn,
        dropout=args.dropout,
        attn_implementation=common.FAST_ATTENTION,  # as the recipe trains on the CPU
    )
    torch.manual_seed(0)
    model = kernels.use_cpu_kernels(VaswaniForConditionalGeneration(config), attention=False).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
    batch = common.random_batch(args.batch_size, args.length, args.length, args.vocab)
    fast = {"dropout": kernels.Dropout, "loss": kernels.label_smoothed_cross_entropy}

    # transformers' `adamw_torch` on CPU tensors: a Python loop over the parameters, one operator per update term.
    loop_optimizer = torch.optim.AdamW(
        model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0, foreach=False
    )

    def step(dropout, loss, fused_output: bool = False, adam=optimizer) -> None:
        # The model's dropout modules, and what `losses.label_smoothed_loss` calls.
        use_dropout(model, dropout)
        losses.label_smoothed_cross_entropy = loss
        try:
            adam.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not args.fp32):
                # What `losses.label_smoothed_loss` computes (or, fused, `losses.fused_output_loss`).
                loss_value = common.training_loss("vaswani", model, batch, 0.1, fused_output=fused_output)
            loss_value.backward()
            adam.step()
        finally:
            use_dropout(model, fast["dropout"])
            losses.label_smoothed_cross_entropy = fast["loss"]

    groups = {
        m: m.__dict__["_vaswani_shared_input"]
        for m in model.modules()
        if "_vaswani_shared_input" in m.__dict__
    }

    def without(kernel: str) -> None:
        """The recipe's step without one of its kernels."""
        saved = kernels.attention.SOFTMAX_MIN_KEYS
        if kernel == "stacked":
            for module in groups:
                del module.__dict__["_vaswani_shared_input"]
        else:
            kernels.attention.SOFTMAX_MIN_KEYS = 0
        try:
            step(fast["dropout"], fast["loss"], fused_output=True)
        finally:
            kernels.attention.SOFTMAX_MIN_KEYS = saved
            for module, group in groups.items():
                module.__dict__["_vaswani_shared_input"] = group

    jobs = {
        REFERENCE: lambda: step(nn.Dropout, torch_loss),
        "kernel dropout": lambda: step(fast["dropout"], torch_loss),
        "kernel loss": lambda: step(nn.Dropout, fast["loss"]),
        "both kernels": lambda: step(fast["dropout"], fast["loss"]),
    }
    if not args.fp32:  # the trainer fuses the output projection into the loss under autocast only
        jobs[FUSED] = lambda: step(fast["dropout"], fast["loss"], fused_output=True)
        jobs[LOOP_ADAM] = lambda: step(fast["dropout"], fast["loss"], fused_output=True, adam=loop_optimizer)
        jobs[UNSTACKED] = lambda: without("stacked")
        jobs[UNPADDED] = lambda: without("padded softmax")
    times = common.interleaved_times(jobs, args.repeats, warmup=2)
    medians = {name: common.median(seconds) for name, seconds in times.items()}
    speedups = {name: medians[REFERENCE] / median for name, median in medians.items()}
    print(f"{'job':<32} {'s/step':>8} {'x torch':>8}")
    print("-" * 50)
    for name in jobs:
        print(f"{name:<32} {medians[name]:>8.3f} {speedups[name]:>8.2f}")
    result = {
        "machine": common.machine(),
        "settings": vars(args),
        "parameters": common.num_parameters(model),
        "seconds": times,
        "median_s": medians,
        "speedup_over_torch": speedups,
    }
    common.write_json(args.json, result)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
