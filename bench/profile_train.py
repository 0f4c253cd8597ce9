"""Where the time of the en->de recipe's training steps goes (`torch.profiler`), by part of the step.

Runs `vaswani-train`'s training (`recipe.run.train_main`) with the en->de recipe of RESULTS.md (the Makefile's
FULL_RECIPE: the `tiny` preset, vocabulary 8000, bf16 autocast on the CPU, 8192-token batches) on Multi30k, and
profiles `--repeats` whole optimizer steps after `--warmup` untimed ones: fetching and collating the batch, forward,
loss, backward, Adam, the trainer's own work. Each operator's self time goes to the part of the model that ran it,
marked by `record_function` ranges around the model's pieces; a backward operator goes to the part whose forward
operator made its autograd node (the two share a `sequence_nr`). Parts:

- attention: the `VaswaniAttention` modules (Q/K/V/O projections, scores, softmax, attention dropout);
- feed-forward: `feed_forward` of every layer (W1, ReLU, W2, its residual, dropout and LayerNorm);
- residuals and norms: the rest of each layer (the attention sublayers' residual, dropout and LayerNorm);
- embeddings: token embeddings x sqrt(d_model) + sinusoids, dropout;
- output projection and loss: `losses.fused_output_loss`'s kernel (or the model's logits and the loss);
- autocast casts: every `aten::_to_copy` (and its backward), whichever part ran it;
- optimizer: `Optimizer.step` and `zero_grad`, whole (operators and Python);
- data: the DataLoader's `__next__`, whole (sampler, Arrow reads, `DataCollatorForSeq2Seq`'s padding);
- other operators: operators outside those parts (the trainer's token count, the schedule, ...);
- Python and framework: the steps' wall time less all the above (the Python of the model and the trainer,
  autograd's engine between operators, Accelerate).

    python -m bench profile-train --threads 2 --json bench/results/profile_train_tiny_cpu.json

Prints the table; `--json` writes it with the costliest operators. Profiling adds its own overhead to the operators
(about a microsecond each), so the step is slower under it than in `vaswani-train`; the shares are what it measures.

Beside the parts, the matrix products (`MATMUL_OPERATORS`, forward and backward, whatever part ran them): their self
time a profiled step, their floating-point operations a step (counted by `torch.utils.flop_counter.FlopCounterMode`
over the untimed warm-up steps: counting under the profiler would slow the profiled ones), their rate, and the
machine's own bf16 GEMM rate on one large product (`common.matmul_peak`, same threads). The products' work at that
rate is a floor under the step that no saving outside them can lower.
"""

import collections
import functools
import tempfile
import time
from unittest import mock

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode
from transformers import TrainerCallback

from bench import common

LOSS = "output projection and loss"
PARTS = (
    "attention",
    "feed-forward",
    "residuals and norms",
    "embeddings",
    LOSS,
    "autocast casts",
    "optimizer",
    "data",
    "other operators",
    "Python and framework",
)
_MARK = "part: "  # the prefix of the ranges this script opens
_CASTS = ("aten::_to_copy", "aten::to")
MATMUL_OPERATORS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
_MATMUL_PACKETS = tuple(getattr(torch.ops.aten, name.split("::")[1]) for name in MATMUL_OPERATORS)


def recipe_argv(args, data, output_dir):
    """The Makefile's FULL_RECIPE for en->de, without evaluation or checkpoints, for `--warmup` + `--repeats`
    optimizer steps, with `--max-tokens` and the extra flags."""
    return [
        "--dataset_name", data, "--source_lang", "en", "--target_lang", "de",
        "--preset", "tiny", "--vocab_size", "8000", "--bf16", "--use_cpu", "--max_tokens", str(args.max_tokens),
        "--warmup_steps", "2000", "--learning_rate_constant", "2.53",
        "--max_steps", str(args.warmup + args.repeats), "--eval_strategy", "no", "--save_strategy", "no", "--logging_steps", "1000",
        "--report_to", "none", "--disable_tqdm", "true", "--output_dir", output_dir, "--seed", "1",
        *args.extra,
    ]  # fmt: skip


def _wrap(function, name):
    @functools.wraps(function)
    def marked(*args, **kwargs):
        with record_function(_MARK + name):
            return function(*args, **kwargs)

    return marked


def mark_parts(model):
    """`record_function` ranges around the model's parts, on this model instance only."""
    from vaswani.modeling_vaswani import VaswaniAttention, VaswaniLayer, VaswaniStack

    for module in model.modules():
        if isinstance(module, VaswaniAttention):
            module.forward = _wrap(module.forward, "attention")
        elif isinstance(module, VaswaniLayer):
            module.forward = _wrap(module.forward, "residuals and norms")
            module.feed_forward = _wrap(module.feed_forward, "feed-forward")
        elif isinstance(module, VaswaniStack):
            module.embed = _wrap(module.embed, "embeddings")


def marked_loss():
    """The recipe's loss kernels inside a range, as `recipe.losses` calls them (a context manager)."""
    from vaswani.recipe import losses

    return mock.patch.multiple(
        losses,
        linear_label_smoothed_cross_entropy=_wrap(losses.linear_label_smoothed_cross_entropy, LOSS),
        label_smoothed_cross_entropy=_wrap(losses.label_smoothed_cross_entropy, LOSS),
    )


class StepProfiler(TrainerCallback):
    """Profiles optimizer steps `warmup + 1` to `warmup + steps`, from one step's end to another's, so that each
    profiled step holds its batch's fetch and collation; counts the matrix products' floating-point operations of the
    warm-up steps (`matmul_flops_per_step`, None without warm-up)."""

    def __init__(self, warmup, steps):
        self.warmup, self.steps = warmup, steps
        self.profiler = self.matmul_flops_per_step = None

    def on_train_begin(self, *_, model, **kwargs):
        mark_parts(model)
        if self.warmup == 0:
            self._start()
        else:
            self.flop_counter = FlopCounterMode(display=False)
            self.flop_counter.__enter__()

    def _start(self):
        self.profiler = profile(activities=[ProfilerActivity.CPU])
        self.profiler.__enter__()
        self.wall = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.warmup:
            self.flop_counter.__exit__(None, None, None)
            counts = self.flop_counter.get_flop_counts().get("Global", {})
            self.matmul_flops_per_step = sum(counts.get(op, 0) for op in _MATMUL_PACKETS) / self.warmup
            self._start()
        elif state.global_step == self.warmup + self.steps and self.profiler:
            self.wall = time.perf_counter() - self.wall
            self.profiler.__exit__(None, None, None)


def _category(event, backward_parts):
    """The part an operator's self time belongs to."""
    parent = event
    while parent:
        pname = parent.name
        if pname in _CASTS or "ToCopyBackward" in pname:
            return "autocast casts"
        if pname.startswith(_MARK):
            return pname[len(_MARK) :]
        if pname.startswith("Optimizer."):
            return "optimizer"
        if pname.startswith("enumerate(DataLoader)"):
            return "data"
        if pname.startswith("autograd::engine::evaluate_function"):
            return backward_parts.get(parent.id, "other operators")
        parent = parent.cpu_parent
    return "other operators"


def _inside(event, prefix):
    while event:
        if event.name.startswith(prefix):
            return True
        event = event.cpu_parent
    return False


def attribute(events):
    """Seconds per part (operators' self time; the optimizer's and the DataLoader's ranges whole) and the costliest
    (operator, part, seconds)."""
    # The part that made each autograd node: the innermost range around the forward operator with that sequence_nr.
    labels_by_sequence = {}
    for event in events:
        if event.sequence_nr is None or event.sequence_nr < 0 or event.name.startswith("autograd::"):
            continue
        parent = event.cpu_parent
        while parent and not parent.name.startswith(_MARK):
            parent = parent.cpu_parent
        key = (event.thread, event.sequence_nr)
        if parent and key not in labels_by_sequence:
            labels_by_sequence[key] = parent.name[len(_MARK) :]
    backward_parts = {}
    for event in events:
        if event.name.startswith("autograd::engine::evaluate_function"):
            part = labels_by_sequence.get((event.fwd_thread, event.sequence_nr))
            if part is None and "LabelSmoothedCrossEntropy" in event.name:
                part = LOSS
            if part:
                backward_parts[event.id] = part
    seconds = collections.Counter()
    operators = collections.Counter()
    for event in events:
        # The optimizer's and the DataLoader's ranges count whole: their Python (a for-loop Adam's loop over the
        # parameters, the collator's padding) is theirs.
        for prefix, part in (("Optimizer.", "optimizer"), ("enumerate(DataLoader)", "data")):
            if event.name.startswith(prefix) and not _inside(event.cpu_parent, prefix):
                seconds[part] += event.cpu_time_total / 1e6
    for event in events:
        # ranges, not operators (their self time is Python), and the ranges counted whole above
        skipped = (_MARK, "autograd::engine::evaluate_function", "Optimizer.", "enumerate(DataLoader)")
        if event.is_user_annotation or event.name.startswith(skipped):
            continue
        part = _category(event, backward_parts)
        if part not in ("optimizer", "data"):  # counted whole above
            seconds[part] += event.self_cpu_time_total / 1e6
        operators[(event.name, part)] += event.self_cpu_time_total / 1e6
    top = [(name, part, s) for (name, part), s in operators.most_common(15)]
    return dict(seconds), top


def profiled_run(args):
    """`vaswani-train`'s `train_main` on the recipe's flags, its trainer carrying the profiler."""
    from vaswani.commands.cli import parse_args as parse_train_args
    from vaswani.recipe import run
    from vaswani.recipe.arguments import (
        DataArguments,
        FinishArguments,
        ModelArguments,
        ModelConfigArguments,
        PaperTrainingArguments,
        config_overrides,
    )
    from vaswani.recipe.run_folder import release_output_dir

    profiler = StepProfiler(args.warmup, args.repeats)

    class ProfiledTrainer(run.VaswaniTrainer):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.add_callback(profiler)

    with tempfile.TemporaryDirectory() as output_dir:
        flags = recipe_argv(args, args.data, output_dir)
        model_args, config_args, data_args, _, training_args = parse_train_args(
            [ModelArguments, ModelConfigArguments, DataArguments, FinishArguments, PaperTrainingArguments],
            flags,
            description="profiled",
        )
        try:
            with mock.patch.object(run, "VaswaniTrainer", ProfiledTrainer), marked_loss():
                run.train_main(model_args, data_args, training_args, config_overrides(config_args))
        finally:
            release_output_dir(output_dir)
    return profiler


def main(argv):
    parser = common.parser("profile-train", __doc__, repeats=10)
    parser.set_defaults(warmup=5)
    parser.add_argument(
        "--data", default=str(common.MULTI30K), help="the Multi30k folder (train.en.gz, train.de.gz)"
    )
    parser.add_argument("--max-tokens", type=int, default=8192)
    parser.add_argument(
        "--threads",
        type=int,
        help="torch's intra-op threads (default: torch's choice); 1 keeps a busy machine's scheduling out of the "
        "operators' times, where each parallel operator waits for its slowest thread",
    )
    parser.add_argument("extra", nargs="*", help="more vaswani-train flags, after --")
    args = common.parse(parser, argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    profiler = profiled_run(args)
    events = profiler.profiler.events()
    seconds, top = attribute(events)
    seconds["Python and framework"] = max(profiler.wall - sum(seconds.values()), 0.0)
    step = profiler.wall / args.repeats
    shares = {part: seconds.get(part, 0.0) / args.repeats / step for part in PARTS}
    rows = [
        {"part": part, "ms_per_step": 1000 * step * share, "share": share} for part, share in shares.items()
    ]
    # the matrix-product operators' self time a step
    matmul_s = (
        sum(event.self_cpu_time_total for event in events if event.name in MATMUL_OPERATORS)
        / 1e6
        / args.repeats
    )
    flops = profiler.matmul_flops_per_step
    peak = common.matmul_peak(repeats=5)["bf16"]
    products = {"ms_per_step": 1000 * matmul_s, "share": matmul_s / step, "machine_bf16_gemm_gflops": peak}
    if flops is not None:  # counted over the warm-up steps
        products |= {
            "gflop_per_step": flops / 1e9,
            "gflops": flops / max(matmul_s, 1e-12) / 1e9,
            "floor_s_at_machine_rate": flops / (peak * 1e9),
        }
    print(f"matrix products: {products}")
    columns = ["part", ("ms_per_step", "ms/step", ".1f"), ("share", "share", ".1%")]
    return common.report(
        args,
        f"{args.repeats} profiled steps, {step:.3f} s a step under the profiler",
        rows,
        columns,
        recipe_flags=recipe_argv(args, "DATA", "OUT"),
        step_s_under_profiler=step,
        top_operators_ms_per_step=[
            {"operator": n, "part": p, "ms": 1000 * s / args.repeats} for n, p, s in top
        ],
        matrix_products=products,
    )
