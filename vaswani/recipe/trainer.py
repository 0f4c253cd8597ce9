"""`VaswaniTrainer`: transformers' `Seq2SeqTrainer` with the recipe of §5 (token-budget batches, the §5.3 schedule,
label smoothing), the recipe's callbacks, FSDP2 on CPU processes, and model folders that are written whole.

The pieces are in their own modules: `batching`, `schedule`, `losses`, `callbacks`, `distributed`; a run's
checkpoints and resuming in `checkpoints`; the flags in `arguments.PaperTrainingArguments`.
"""

import contextlib
import copy
import logging
import shutil
import time
from functools import partial

import torch
from accelerate.utils import extract_model_from_parallel
from torch.utils.data import DataLoader
from transformers import Seq2SeqTrainer
from transformers.trainer_callback import ProgressCallback

from ..common.fileio import replace_files, temporary_sibling
from ..generation_vaswani import EXTRA_OUTPUT_TOKENS
from ..modeling_vaswani import VaswaniForConditionalGeneration
from .batching import (
    EpochSetter,
    TokenBudgetBatchSampler,
    example_lengths,
    mark_batch_dynamic,
    padded_lengths,
)
from .callbacks import (
    AutocastInTheTrainer,
    CompileCounter,
    RunProgress,
    TimeBudget,
    TimedCheckpoints,
    TrainingClock,
)
from .distributed import enable_fsdp_on_cpu, shard_with_fsdp2
from .evaluation import EvaluationClock, describe_decoding, generation_settings
from .losses import fused_output_loss, label_smoothed_loss
from .schedule import WarmupEnd, paper_schedule, resolve_peak_learning_rate

logger = logging.getLogger(__name__)


class VaswaniTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` with token-budget batches, the paper's learning-rate schedule and label smoothing.

    Label smoothing (eps_ls = `--label_smoothing_factor`, 0.1, §5.4) is the recipe's, applied as transformers'
    `compute_loss_func` by `label_smoothed_loss`: the smoothed cross-entropy in float32 with one (N, V) buffer
    (`kernels.label_smoothed_cross_entropy`), exact under gradient accumulation. The Trainer's own smoother,
    which would hold the logits of the whole batch in memory a second time, stays off. In bf16/fp16 CPU training the
    output projection runs inside that loss, so that the logits are never held (`compute_loss`, `--fused_output_loss`).
    The model's own loss (`model(labels=...)`) is the plain cross-entropy, and so is `eval_loss` when evaluation
    generates (`predict_with_generate`, as in the recipe): `Seq2SeqTrainer` then takes the model's loss.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        args = self.args  # `arguments.PaperTrainingArguments`
        self._train_sampler = self._step_clock = None
        self.add_callback(TrainingClock())
        if self.accelerator.native_amp:  # bf16 or fp16 mixed precision
            self.add_callback(AutocastInTheTrainer(self))
        minutes = args.max_train_minutes
        self.time_budget = TimeBudget(minutes) if minutes else None
        if self.time_budget:
            self.add_callback(self.time_budget)
        if args.paper_lr_schedule:
            self.add_callback(WarmupEnd(minutes and minutes * 60))
        if args.save_minutes:  # after TimeBudget: its checkpoint restarts the interval
            self.add_callback(TimedCheckpoints(args.save_minutes))
        if args.torch_compile:
            self.add_callback(CompileCounter())
        self.evaluation_clock = EvaluationClock()
        if self.time_budget and not args.disable_tqdm and self.pop_callback(ProgressCallback) is not None:
            self.add_callback(RunProgress(self.time_budget))
        resolve_peak_learning_rate(args, self.model.config.d_model)  # the §5.3 peak needs d_model
        self._owns_loss = args.label_smoothing_factor and self.compute_loss_func is None
        if self._owns_loss:
            self.compute_loss_func = partial(label_smoothed_loss, epsilon=args.label_smoothing_factor)
            self.label_smoother = None

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """transformers' `compute_loss`, except in the training steps that `fuses_output_loss` picks: there the
        decoder's output goes to `fused_output_loss` (the output projection and the label-smoothed loss in one
        kernel) instead of through the model's logits to `label_smoothed_loss`. Same loss, same normalisation."""
        if return_outputs or not self.fuses_output_loss(model, inputs):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        return fused_output_loss(model, inputs, self.args.label_smoothing_factor, num_items_in_batch)

    def fuses_output_loss(self, model, inputs):
        """Whether this step takes `fused_output_loss`: `--fused_output_loss` (the default), the recipe's own
        label-smoothed loss, a training step of the bare model in one process (not wrapped for DDP, FSDP or PEFT)
        on the CPU, under the trainer's bf16/fp16 autocast (where it is measured faster: BENCHMARKS.md)."""
        return (
            self.args.fused_output_loss
            and self._owns_loss
            and "labels" in inputs
            and self.accelerator.num_processes == 1
            and not self.is_fsdp_enabled
            and isinstance(model, VaswaniForConditionalGeneration)
            and model.training
            and model.device.type == "cpu"
            and torch.is_autocast_enabled("cpu")
        )

    def create_accelerator_and_postprocess(self):
        super().create_accelerator_and_postprocess()
        # The Trainer accumulates gradients itself; transformers 5.5 also hands its accumulation steps to Accelerate,
        # whose `backward` then divides every micro-batch's loss by them a second time (transformers#45305, fixed in
        # 5.6 by handing Accelerate 1).
        self.accelerator.gradient_accumulation_steps = 1
        enable_fsdp_on_cpu(self)
        self._autocast_dtype = None  # set by take_over_autocast

    def take_over_autocast(self):
        """Run mixed precision through `autocast_smart_context_manager` instead of Accelerate's forward wrapper.

        Under bf16 or fp16 mixed precision, Accelerate wraps the model's forward in autocast and converts every
        half-precision output to float32: the logits too, (tokens, V), which the loss then reads and differentiates in
        float32 and whose gradient is converted back. At the en->de recipe's shape (8160 x 8000 logits) that costs
        two extra (N, V) float32 tensors per step. Here the wrapper is removed (`extract_model_from_parallel(...,
        keep_fp32_wrapper=False)`, Accelerate's own way to undo it) and the trainer enters the same autocast around
        the loss and around generation in evaluation, so the label-smoothed loss receives the logits in the autocast
        dtype and computes in float32 chunk by chunk (`kernels.label_smoothed_cross_entropy`). Weights,
        gradients and Adam's state stay in float32, as before.
        """
        if self._autocast_dtype is None:
            extract_model_from_parallel(self.model_wrapped, keep_fp32_wrapper=False)
            self._autocast_dtype = torch.bfloat16 if self.args.bf16 else torch.float16

    def autocast_smart_context_manager(self, cache_enabled=True):
        """transformers leaves autocast to Accelerate's forward wrapper; once `take_over_autocast` has removed that
        wrapper, the trainer's loss and evaluation enter torch's autocast here, in the same dtype."""
        if self._autocast_dtype is None:
            return super().autocast_smart_context_manager(cache_enabled)
        return torch.autocast(self.accelerator.device.type, self._autocast_dtype, cache_enabled=cache_enabled)

    def create_optimizer(self, model=None):
        if self.is_fsdp_enabled:
            shard_with_fsdp2(self.model, self.accelerator)
        return super().create_optimizer(model)

    def _save(self, output_dir=None, state_dict=None):
        """Save the model folder (a checkpoint's or the final one) as transformers does, with two differences:
        every file appears whole (written beside the folder, then renamed into it), and `training_args.bin` never
        holds the Hub token. The model's `save_pretrained` makes the folder whole (code, pipeline, custom
        generate), FSDP-wrapped too."""
        output_dir = output_dir or self.args.output_dir
        token, self.args.hub_token = self.args.hub_token, None
        try:
            if not self.args.should_save:
                return super()._save(output_dir, state_dict)
            if self.is_fsdp_enabled and state_dict:
                # A gathered FSDP state dict holds a tied matrix once per name: tie them again, so that it is saved
                # once, as without FSDP.
                for target, source in self.model.get_expanded_tied_weights_keys(all_submodels=True).items():
                    if target in state_dict and source in state_dict:
                        state_dict[target] = state_dict[source]
            building = temporary_sibling(output_dir)
            try:
                super()._save(str(building), state_dict)
            except BaseException:
                shutil.rmtree(building, ignore_errors=True)
                raise
            replace_files(building, output_dir)
        finally:
            self.args.hub_token = token

    def token_sampler(self):
        """The §5.1 batches of the training set, built once: the lengths are read from Arrow (`example_lengths`), so
        no token list becomes a Python object, in any process."""
        if self._train_sampler is None:
            # With --pad_to_multiple_of the collator pads to the bucket's length: the budget counts it.
            multiple = getattr(self.data_collator, "pad_to_multiple_of", None)  # None: pads to the longest
            lengths = padded_lengths(example_lengths(self.train_dataset), multiple)
            budget = self.args.max_tokens
            sampler = TokenBudgetBatchSampler(
                lengths, budget, seed=self.args.seed, max_sentences=self.args.max_sentences
            )
            self.add_callback(EpochSetter(sampler))
            logger.info(
                "Token-budget batches: %d batches of at most %d tokens per device and epoch",
                len(sampler),
                budget,
            )
            self._train_sampler = sampler
        return self._train_sampler

    def get_train_dataloader(self):
        if self.args.max_tokens is None:
            return super().get_train_dataloader()
        dataset = self.train_dataset.select_columns(
            [c for c in ("input_ids", "attention_mask", "labels") if c in self.train_dataset.column_names]
        )
        return self.accelerator.prepare(
            DataLoader(
                dataset,
                batch_sampler=self.token_sampler(),
                collate_fn=self.data_collator,
                num_workers=self.args.dataloader_num_workers,
                pin_memory=self.args.dataloader_pin_memory,
            )
        )

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval", **gen_kwargs):
        """`Seq2SeqTrainer.evaluate`, with a log line before it saying what it decodes and how long it should take,
        and one after it with the time it took (`evaluation.EvaluationClock`)."""
        dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        timing = contextlib.nullcontext()
        if self.args.predict_with_generate and hasattr(dataset, "__len__") and not isinstance(dataset, dict):
            beams, limit = generation_settings(self, gen_kwargs)
            batch = self.args.per_device_eval_batch_size
            what = describe_decoding(len(dataset), beams, batch, self.args.world_size, limit)
            timing = self.evaluation_clock.timing(len(dataset), what)
        with timing:
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix, **gen_kwargs)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        """Generation during evaluation stops at source length + 50 tokens (§6.1) unless a maximum is given."""
        if self.args.predict_with_generate and not prediction_loss_only:
            gen_kwargs = gen_kwargs or dict(getattr(self, "_gen_kwargs", {}))
            # (`Seq2SeqTrainer.prediction_step` drops a `max_length` of None itself)
            if gen_kwargs.get("max_length") is None and gen_kwargs.get("max_new_tokens") is None:
                gen_kwargs["max_new_tokens"] = inputs["input_ids"].shape[1] + EXTRA_OUTPUT_TOKENS
        # transformers' Seq2SeqTrainer.prediction_step writes every default into the model's generation config, and
        # checkpoints would save them all: `max_length: 20` among them, so that each later
        # `generate(max_new_tokens=...)` on the saved model warned that both were set. The model keeps its own.
        own = copy.deepcopy(self.model.generation_config)
        try:
            # Generation in evaluation under the trainer's autocast once it has taken autocast over from Accelerate.
            with self.autocast_smart_context_manager():
                return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys, **gen_kwargs)
        finally:
            self.model.generation_config = own

    def create_scheduler(self, num_training_steps, optimizer=None):
        if not self.args.paper_lr_schedule:
            return super().create_scheduler(num_training_steps, optimizer)
        if self.lr_scheduler is None:
            args = self.args
            self.lr_scheduler = paper_schedule(
                optimizer or self.optimizer,
                int(args.warmup_steps),
                args.lr_cooldown_fraction,
                num_training_steps,
                self.time_budget,
            )
            self._created_lr_scheduler = True
        return self.lr_scheduler

    def _load_optimizer_and_scheduler(self, checkpoint):
        """transformers' loading, then the §5.3 schedule's peak is this run's learning rate: a checkpoint saved when
        the optimizer's rate was the formula's multiplier (1.0) would otherwise make the peak 1.0."""
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint and self.args.paper_lr_schedule and hasattr(self.lr_scheduler, "base_lrs"):
            self.lr_scheduler.base_lrs = [self.args.learning_rate] * len(self.lr_scheduler.base_lrs)

    def train(self, *args, **kwargs):
        self._trained = {"samples": 0, "tokens": 0}  # the sentences and target tokens this process trained on
        self._step_clock = None  # (time, optimizer step) of the previous training log, from the first step on
        return super().train(*args, **kwargs)

    def training_step(self, model, inputs, num_items_in_batch=None):
        """transformers' step, counting the sentences and target tokens trained on (for `log`'s throughput); under
        `--torch_compile` the batch's sentences and tokens are dynamic dimensions (`mark_batch_dynamic`)."""
        labels = inputs.get("labels")
        if self._step_clock is None:
            self._step_clock = (time.monotonic(), self.state.global_step)
        if self.args.torch_compile:
            mark_batch_dynamic(inputs)
        if labels is not None:
            self._trained["samples"] += labels.shape[0]
            self._trained["tokens"] += (labels != -100).sum()  # a tensor: no sync per step
        return super().training_step(model, inputs, num_items_in_batch)

    def log(self, logs, start_time=None):
        """transformers' log, where the end-of-training metrics count what was trained on: transformers'
        `train_samples_per_second` assumes `--per_device_train_batch_size` sentences per micro-batch (8 for a
        token-budget batch of hundreds); here it is the real number of sentences, and `train_tokens_per_second` the
        target tokens, of every process. Each training log (`loss`) also gives `seconds_per_step`: the wall time per
        optimizer step since the previous one (since the first step for the first), evaluations included."""
        clock, step = self._step_clock, self.state.global_step  # clock: None before train()
        if "loss" in logs and clock and step > clock[1]:
            now = time.monotonic()
            logs["seconds_per_step"] = round((now - clock[0]) / (step - clock[1]), 4)
            self._step_clock = (now, step)
        if "train_samples_per_second" in logs:  # the end of training (with `train_runtime`)
            counts = torch.tensor([float(count) for count in self._trained.values()], device=self.args.device)
            totals = self.accelerator.reduce(counts, "sum").tolist()
            runtime = max(float(logs["train_runtime"]), 1e-9)
            for name, total in zip(self._trained, totals, strict=True):  # train_samples, train_tokens
                logs[f"train_{name}_per_second"] = round(total / runtime, 3)
                logs[f"train_{name}"] = int(total)
        super().log(logs, start_time)
