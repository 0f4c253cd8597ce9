"""The flags of `vaswani-train` (and of `vaswani-train-tokenizer`'s data) as dataclasses for `HfArgumentParser`, and
what the flags it shares with transformers and fairseq mean: where the data comes from (`DataArguments`), which model
(`ModelArguments`) with which `VaswaniConfig` fields over its preset (`ModelConfigArguments`, one flag per field, its
help the field's own text in `VaswaniConfig`'s docstring), the training recipe (`PaperTrainingArguments`: all of
`Seq2SeqTrainingArguments` with the paper's values as defaults) and what happens after training (`FinishArguments`).
Each checks its own values in `__post_init__`, with errors that name the flag; checks that need several of them, or the
disk, are in `vaswani.recipe.checks`.

What a user gives means what it means in transformers and fairseq, and the paper's recipe fills in only what is not
given:

- Batches: `--per_device_train_batch_size` alone gives batches of that many sentences, as in transformers; with
  `--max_tokens`, token-budget batches of at most that many sentences (fairseq's `--batch-size` with `--max-tokens`);
  neither, the paper's token-budget batches of `PAPER_MAX_TOKENS` tokens (§5.1).
- Learning rate: `--learning_rate` (fairseq's `--lr`) is the peak rate, as in transformers; the §5.3 schedule rises
  to it over `--warmup_steps`. Not given, the peak is the paper's, d_model^-0.5 * warmup_steps^-0.5, times
  tensor2tensor's `--learning_rate_constant` (1.0); the peak needs the model's d_model, so the trainer resolves it
  (`schedule.resolve_peak_learning_rate`).
- Values transformers accepts but that cannot train are refused by name (`check_recipe_values`).
"""

import dataclasses
import math
import os
import re
import typing
from dataclasses import dataclass

import torch
import transformers
from torch.torch_version import TorchVersion
from transformers import Seq2SeqTrainingArguments
from transformers.hf_argparser import HfArg

from ..common.errors import UsageError, require_positive
from ..configuration_vaswani import (
    ACTIVATIONS,
    POSITION_EMBEDDING_TYPES,
    PRESETS,
    SINUSOID_FREQUENCIES,
    SINUSOID_LAYOUTS,
    VaswaniConfig,
)
from ..generation_vaswani import (
    LENGTH_PENALTY_FORMS,
    PAPER_LENGTH_PENALTY,
    PAPER_LENGTH_PENALTY_FORM,
    PAPER_NUM_BEAMS,
)
from ..kernels import FAST_ATTENTION
from .distributed import check_launch
from .schedule import choose_learning_rate

PAPER_VOCAB_SIZE = 37000  # §5.1: "a shared source-target vocabulary of about 37000 tokens" (EN-DE)
# §5.1's token-budget batches, per device: micro-batches of this many padded tokens unless other batches are asked for
# (the paper's ~25,000-token update is `--batch_tokens 25000`, which accumulates them).
PAPER_MAX_TOKENS = 4096
# Old flag names of `vaswani-train`, still accepted with a warning naming the new one.
RENAMED = {
    "data": "dataset_name",
    "data_config": "dataset_config_name",
    "tokenizer": "tokenizer_name",
    "max_length": "max_source_length",
    "num_proc": "preprocessing_num_workers",
    "init_from": "model_name_or_path",
}


def refuse_nonpositive(args, names, what="positive"):
    """Raise `UsageError` naming the flag of `names` (space-separated) whose value is not a positive finite number
    (None: not given): "--NAME must be `what`, got VALUE"."""
    for name in names.split():
        value = getattr(args, name)
        if value is not None and not 0 < value < math.inf:
            raise UsageError(f"--{name} must be {what}, got {value}")


def check_languages(source_lang, target_lang):
    """Raise `UsageError` naming the flag unless the languages given (None: not given) are two language codes."""
    for name, value in (("source_lang", source_lang), ("target_lang", target_lang)):
        if value is not None and not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", value):
            raise UsageError(f"--{name} must be a language code such as de or en, got {value!r}")
    if source_lang is not None and source_lang == target_lang:
        raise UsageError(
            f"--source_lang and --target_lang are both {source_lang!r}: translation needs two languages"
        )


@dataclass
class DataArguments:
    """Where the parallel text comes from, the languages, and the tokenizer (the flags of transformers'
    `run_translation.py` where the meaning is the same)."""

    _argument_group_name = "data"

    dataset_name: str | None = HfArg(
        default=None,
        help="A Hub dataset (a `translation` column as in wmt14, or one column per language as in "
        "bentrevett/multi30k), or a local folder of {split}.{lang}[.gz] text files, JSON lines or save_to_disk.",
    )
    dataset_config_name: str | None = HfArg(
        default=None, help="The Hub dataset's configuration, e.g. de-en for wmt14."
    )
    train_file: str | None = HfArg(
        default=None,
        help="Training pairs from files: a JSON-lines file, or the prefix P of the text files P.<source_lang> "
        "and P.<target_lang> (.gz allowed). Instead of, or over, --dataset_name's train split.",
    )
    validation_file: str | None = HfArg(default=None, help="Validation pairs from files, as --train_file.")
    test_file: str | None = HfArg(
        default=None, help="Test pairs from files, as --train_file (translated after training)."
    )
    source_lang: str = HfArg(default="de", help="Source language code.")
    target_lang: str = HfArg(default="en", help="Target language code.")
    train_split: str = HfArg(default="train", help="Name of the training split of --dataset_name.")
    validation_split: str = HfArg(
        default="validation", help="Validation split of --dataset_name (multi30k files: val)."
    )
    test_split: str | None = HfArg(
        default=None,
        help="Translate this split of --dataset_name with beam search after training and score it "
        "(e.g. test; multi30k files: test_2016_flickr).",
    )
    tokenizer_name: str | None = HfArg(
        default=None,
        help="A trained tokenizer folder; default: the --model_name_or_path folder's, else one trained "
        "into <output_dir>/tokenizer.",
    )
    vocab_size: int | None = HfArg(
        default=None,
        help=f"BPE vocabulary size when training one (§5.1: {PAPER_VOCAB_SIZE}, the default). A --tokenizer_name "
        "or --model_name_or_path brings its own vocabulary, which the run trains with: one larger is refused.",
    )
    separate_vocabularies: bool = HfArg(
        default=False, help="Separate source and target vocabularies (not the paper)."
    )
    lowercase: bool = HfArg(
        default=False,
        help="Train the BPE on lowercased text, with a tokenizer that lowercases what it encodes, so the "
        "model reads and writes lowercase (not the paper; the form of published Multi30k results).",
    )
    max_source_length: int = HfArg(
        default=256, help="Drop training pairs whose source has more tokens than this (nothing is truncated)."
    )
    max_target_length: int | None = HfArg(
        default=None, help="Drop training pairs whose target has more tokens (default: --max_source_length)."
    )
    max_train_samples: int | None = HfArg(default=None, help="Use only the first N training pairs.")
    max_eval_samples: int | None = HfArg(default=None, help="Evaluate on the first N pairs only.")
    max_predict_samples: int | None = HfArg(
        default=None,
        help="Translate and score the first N test pairs only (run_translation.py's flag); the scores then "
        "name the split as test[:N], not the test set's figure.",
    )
    max_tokenizer_samples: int | None = HfArg(
        default=None,
        help="Train the BPE vocabulary on N training pairs drawn uniformly at random (a fixed seed: the same "
        "sample every run) instead of the whole split; for WMT-sized corpora, e.g. 1000000.",
    )
    preprocessing_num_workers: int | None = HfArg(default=None, help="Processes for tokenization.")
    cache_dir: str | None = HfArg(default=None, help="Cache folder of the datasets library.")

    def __post_init__(self):
        check_languages(self.source_lang or "", self.target_lang or "")  # both required here
        refuse_nonpositive(
            self,
            "vocab_size max_source_length max_target_length max_train_samples max_eval_samples max_predict_samples "
            "max_tokenizer_samples preprocessing_num_workers",
        )

    @property
    def source(self):
        """What the data is, for the training summary and the model card."""
        return self.dataset_name or self.train_file  # one is given: `checks.check_run`


@dataclass
class ModelArguments:
    _argument_group_name = "model"

    preset: str = HfArg(
        default="base",
        help="base or big (Table 3), or small or tiny (CPU).",
        metadata={"choices": sorted(PRESETS)},
    )
    model_name_or_path: str | None = HfArg(
        default=None, help="Fine-tune this model (a folder or Hub id) instead of training one from scratch."
    )
    attn_implementation: str | None = HfArg(
        default=None,
        help=f"Attention kernel: eager, sdpa, {FAST_ATTENTION}, ... Default: {FAST_ATTENTION} on the CPU "
        "(this package's faster CPU path), sdpa elsewhere.",
    )


# The `VaswaniConfig` fields that are no flag: set from the tokenizer (sizes, special ids, sharing) or no modelling
# choice. Every other field is a flag of `ModelConfigArguments`.
CONFIG_FIELDS_NOT_FLAGS = set(
    "vocab_size decoder_vocab_size share_encoder_decoder_embeddings pad_token_id bos_token_id eos_token_id "
    "decoder_start_token_id use_cache is_encoder_decoder".split()
)
CONFIG_CHOICES = {
    "activation_function": ACTIVATIONS,
    "position_embedding_type": POSITION_EMBEDDING_TYPES,
    "sinusoid_layout": SINUSOID_LAYOUTS,
    "sinusoid_frequencies": SINUSOID_FREQUENCIES,
}


def _config_flags():
    """A flag per `VaswaniConfig` field but `CONFIG_FIELDS_NOT_FLAGS`: its type or None ("keep the preset's"), its
    text in the `Args:` of `VaswaniConfig`'s docstring as the help (an entry `name (`type`, ...): text`, its text
    continued on the lines indented below it, blank lines within; on one line and without backticks; an entry of
    several fields, `a, b (...)`, is none); a boolean alone (`--normalize_before`) is true."""
    entries = re.findall(
        r"^ {8}(\w+) \(.*?\):((?:.|\n(?=\n| {12}))*)", VaswaniConfig.__doc__.split("Args:", 1)[1], re.M
    )
    docs = {name: " ".join(text.replace("`", "").replace("%", "%%").split()) for name, text in entries}
    flags = []
    for name, kind in vars(VaswaniConfig)["__annotations__"].items():
        if name in CONFIG_FIELDS_NOT_FLAGS:
            continue
        base = next(t for t in typing.get_args(kind) or (kind,) if t is not type(None))
        metadata = {"choices": list(CONFIG_CHOICES[name])} if name in CONFIG_CHOICES else {}
        if base is bool:
            metadata.update(nargs="?", const=True)
        flags.append((name, base | None, HfArg(default=None, help=docs[name], metadata=metadata)))
    return flags


ModelConfigArguments = dataclasses.make_dataclass(
    "ModelConfigArguments",
    _config_flags(),
    namespace={
        "__module__": __name__,
        "__doc__": "VaswaniConfig fields set on the command line; None keeps the preset's (or loaded model's) value.",
        "_argument_group_name": "model configuration (VaswaniConfig fields over the --preset; §3, Table 3)",
    },
)


def config_overrides(config_args):
    """The `VaswaniConfig` fields given on the command line."""
    return {k: v for k, v in vars(config_args).items() if v is not None}


@dataclass
class FinishArguments:
    """What happens after training (§6.1): checkpoint averaging, beam search on the test set, BLEU, pictures."""

    _argument_group_name = "after training (§6.1)"

    average_last: list[int] = HfArg(
        default_factory=lambda: [0],
        help="Average the last N checkpoints (§6.1: 5 for base, 20 for big); 0: none. Several numbers "
        "(--average_last 10 20 40; not the paper, which fixes N) average each, translate the validation split "
        "with the test's beam search, and keep the average of the highest BLEU.",
    )
    num_beams: int = HfArg(
        default=PAPER_NUM_BEAMS,
        help="Beam size for the test set (§6.1: 4; fairseq: --beam).",
        aliases=["--beam"],
    )
    length_penalty: list[float] = HfArg(
        default_factory=lambda: [PAPER_LENGTH_PENALTY],
        help="Length penalty alpha of the test's beam search, saved in the final model's generation config "
        "(§6.1: 0.6). Several values (--length_penalty 0.6 1.0 1.5 2.0; not the paper, which fixes alpha) "
        "each translate the validation split with the final model, and the highest BLEU is kept (the first "
        "given among equals); averages chosen on validation are compared with the first. fairseq's --lenpen A "
        "is --length_penalty A --length_penalty_form power.",
    )
    length_penalty_form: str = HfArg(
        default=PAPER_LENGTH_PENALTY_FORM,
        help="gnmt: ((5 + |Y|) / 6) ** alpha, the form §6.1 cites; power: transformers' |Y| ** alpha.",
        metadata={"choices": list(LENGTH_PENALTY_FORMS)},
    )
    translate_batch_size: int = HfArg(default=64, help="Sentences per generate() call.")
    plots: bool = HfArg(default=True, help="Draw learning curves and an attention map.")

    def __post_init__(self):
        if isinstance(self.average_last, int):  # FinishArguments(average_last=5) in code
            self.average_last = [self.average_last]
        if not self.average_last or min(self.average_last) < 0:
            raise UsageError(
                f"--average_last must be 0 (none) or numbers of checkpoints, got {self.average_last}"
            )
        if len(self.average_last) > 1 and 0 in self.average_last:
            raise UsageError(
                f"--average_last {' '.join(map(str, self.average_last))}: 0 (no averaging) cannot be one of "
                "several choices; 1 is the last checkpoint alone"
            )
        require_positive(self, "num_beams", "translate_batch_size")
        if isinstance(self.length_penalty, (int, float)):  # FinishArguments(length_penalty=1.0) in code
            self.length_penalty = [float(self.length_penalty)]
        if not self.length_penalty or not all(map(math.isfinite, self.length_penalty)):
            raise UsageError(f"--length_penalty must be finite numbers, got {self.length_penalty}")

    @property
    def chooses_average(self):
        """Whether several averages are compared on the validation split (`--average_last` with several numbers)."""
        return len(set(self.average_last)) > 1

    @property
    def chooses_length_penalty(self):
        """Whether several length penalties are compared on the validation split."""
        return len(set(self.length_penalty)) > 1


# ---------------------------------------------------------------------------------------------------------------------
# The training recipe: all of Seq2SeqTrainingArguments, with the paper's values as defaults
# ---------------------------------------------------------------------------------------------------------------------
# The epochs of a run that only --max_train_minutes bounds: the Trainer needs a number, and the budget ends it first.
TIMED_RUN_EPOCHS = 1_000_000


@dataclass
class PaperTrainingArguments(Seq2SeqTrainingArguments):
    """`Seq2SeqTrainingArguments` whose defaults are the paper's recipe; every Trainer flag still works."""

    _argument_group_name = (
        "the paper's training recipe (§5; Trainer flags whose defaults are the paper's, and its own)"
    )
    # The Trainer's other flags, listed after the recipe's in --help (`vaswani.commands.cli.build_parser`).
    _inherited_argument_group_name = (
        "the rest of transformers' Seq2SeqTrainingArguments (each works as in transformers' Trainer)"
    )

    output_dir: str | None = HfArg(
        default="runs/vaswani",
        help="The run's folder: checkpoints, the final and averaged models, scores, pictures.",
    )
    overwrite_output_dir: bool = HfArg(
        default=False,
        help="Replace the run in --output_dir (its checkpoints, models, scores); without it a folder that "
        "holds anything is refused unless --resume_from_checkpoint continues its run.",
    )
    do_train: bool = HfArg(default=True, help="Always true: this tool trains.")
    do_eval: bool = HfArg(
        default=False,
        help="Evaluate (loss, BLEU) on the validation data at the end of training; with --eval_strategy "
        "steps it also runs every --eval_steps.",
    )
    do_predict: bool | None = HfArg(
        default=None,
        help="Translate and score the test data after training (--test_split, default 'test'). Not given: "
        "when --test_split or --test_file is; false: never (the log says what it skips).",
        metadata={"nargs": "?", "const": True},
    )
    learning_rate: float | None = HfArg(
        default=None,
        help="The peak learning rate, as in transformers (fairseq: --lr). With the §5.3 schedule the rate "
        "rises linearly to it over --warmup_steps, then falls as step^-0.5. Default: the paper's own peak, "
        "d_model^-0.5 * warmup_steps^-0.5 (7.0e-4 for base with 4000 warm-up steps), times "
        "--learning_rate_constant; without the §5.3 schedule transformers' 5e-5.",
        aliases=["--lr"],
    )
    learning_rate_constant: float | None = HfArg(
        default=None,
        help="tensor2tensor's learning_rate_constant C, the other way to set the §5.3 schedule's peak: lrate "
        "= C * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5); 1.0 (default) is the paper. Not with "
        "--learning_rate.",
    )
    warmup_steps: int = HfArg(default=4000, help="warmup_steps of §5.3 (the paper: 4000).")
    adam_beta1: float = HfArg(default=0.9, help="Adam beta1 (§5.3: 0.9).")
    adam_beta2: float = HfArg(default=0.98, help="Adam beta2 (§5.3: 0.98).")
    adam_epsilon: float = HfArg(default=1e-9, help="Adam epsilon (§5.3: 1e-9).")
    weight_decay: float = HfArg(default=0.0, help="No weight decay in the paper.")
    max_grad_norm: float = HfArg(
        default=0.0,
        help="Gradient-norm clipping threshold; 0 disables it. The paper clips nothing (§5.3); transformers' "
        "Trainer defaults to 1.0, so clipping is a departure to ask for by setting this.",
    )
    optim: str = HfArg(
        default=Seq2SeqTrainingArguments.default_optim,
        help="Adam (weight decay 0 makes AdamW plain Adam). Default: transformers' default, the fused AdamW "
        "kernel (adamw_torch_fused) with torch >= 2.8, else adamw_torch.",
    )
    label_smoothing_factor: float = HfArg(
        default=0.1, help="eps_ls of §5.4 (0.1), applied by the recipe's loss."
    )
    fused_output_loss: bool = HfArg(
        default=True,
        help="In CPU training under bf16/fp16 autocast with the recipe's label-smoothed loss, compute the "
        "output projection and the loss together, chunk by chunk, without the (tokens x vocabulary) logits "
        "(kernels.linear_label_smoothed_cross_entropy): the same loss and gradients to rounding, "
        "faster. False computes the logits, then the loss.",
    )
    paper_lr_schedule: bool = HfArg(
        default=True,
        help="Use the §5.3 schedule; false falls back to --lr_scheduler_type with --learning_rate.",
    )
    lr_scheduler_type: str | None = HfArg(
        default=None,
        help="transformers' schedule (linear, cosine, ...), with --paper_lr_schedule false only.",
    )
    lr_cooldown_fraction: float = HfArg(
        default=0.0,
        help="A departure from §5.3 for runs of a known length: over the last FRACTION of the run "
        "(of --max_steps, or of --max_train_minutes when that ends it first) the learning rate falls "
        "linearly to 0. 0 (default) is the paper's schedule.",
    )
    per_device_train_batch_size: int | None = HfArg(
        default=None,
        help="Sentences per batch and device, as in transformers; with --max_tokens, the most sentences of a "
        "token-budget batch (fairseq's --batch-size with --max-tokens).",
    )
    max_tokens: int | None = HfArg(
        default=None,
        help="Token budget of one micro-batch per device (padded tokens of the longer side, §5.1). Default: "
        f"{PAPER_MAX_TOKENS}, unless --per_device_train_batch_size is given alone.",
    )
    pad_to_multiple_of: int | None = HfArg(
        default=None,
        help="Pad each training and evaluation batch's source and target to a multiple of N tokens "
        "(DataCollatorForSeq2Seq's pad_to_multiple_of); token-budget batches count the padded lengths. The "
        "batches then take a few shapes only, so that a --torch_compile run compiles a bounded number of "
        "times. Default: none, the paper's padding to each batch's longest sentence.",
    )
    batch_tokens: int | None = HfArg(
        default=None,
        help="Tokens per optimizer step across devices and accumulation; sets --gradient_accumulation_steps "
        "to ceil(batch_tokens / (max_tokens * world_size)). The paper: about 25000.",
    )
    predict_with_generate: bool = HfArg(default=True, help="Evaluate BLEU with generate().")
    generation_num_beams: int | None = HfArg(
        default=1, help="Beams for BLEU during training (greedy for speed; the final test uses 4)."
    )
    generation_max_length: int | None = HfArg(default=None, help="Max length for eval generation.")
    per_device_eval_batch_size: int = HfArg(
        default=64,
        help="Validation pairs per generate() call and device (transformers' default is 8); the validation "
        "split is decoded longest first, so that a batch holds sources of similar length.",
    )
    save_strategy: str = HfArg(
        default="steps",
        help="steps: a checkpoint every --save_steps; no: only those of --save_minutes (and of a "
        "--max_train_minutes stop).",
    )
    save_steps: float = HfArg(default=500, help="Checkpoint interval in optimizer steps.")
    save_minutes: float | None = HfArg(
        default=None,
        help="Also write a checkpoint whenever this many minutes of training have passed since the last one "
        "(§6.1: 10), and at the last step; a resumed run continues the interval. In addition to --save_steps: "
        "--save_strategy no leaves the time alone.",
    )
    eval_strategy: str = HfArg(default="steps", help="Evaluate with BLEU at a fixed interval.")
    eval_steps: float | None = HfArg(default=500, help="Evaluation interval in optimizer steps.")
    logging_steps: float = HfArg(default=50, help="Log loss and learning rate every N steps.")
    report_to: str = HfArg(default="none", help="Trackers (none by default).")

    max_train_minutes: float | None = HfArg(
        default=None,
        help="Stop (with a checkpoint) once training has run this long; the schedule does not care. It bounds "
        "training only (fairseq's --stop-time-hours): the log says before training how long the final "
        "evaluation, averaging and test translation after it may take (--max_predict_samples and --do_predict "
        "false shorten the test translation). Alone, it is the run's only bound: no number of epochs caps it.",
    )
    num_train_epochs: float | None = HfArg(
        default=None,
        help="Epochs to train when --max_steps is not given (transformers' default: 3); not given with "
        "--max_train_minutes, the time budget alone ends the run.",
    )

    @property
    def timed_only(self):
        """Whether the time budget alone ends the run: --max_train_minutes without --max_steps or --num_train_epochs."""
        return self.num_train_epochs == TIMED_RUN_EPOCHS

    def __post_init__(self):
        if self.num_train_epochs is None:
            timed = self.max_train_minutes is not None and self.max_steps == -1
            self.num_train_epochs = TIMED_RUN_EPOCHS if timed else 3.0
        check_recipe_values(self)
        choose_batches(self)
        choose_learning_rate(self)
        check_launch()
        _check_devices(self)
        super().__post_init__()
        if self.batch_tokens:
            self.gradient_accumulation_steps = math.ceil(
                self.batch_tokens / (self.max_tokens * self.world_size)
            )


def _check_devices(args):
    """Raise naming the flag for a precision or a sharding the machine cannot run; fit the Trainer's device flags to
    a machine without GPUs."""
    if args.fp16 and (args.use_cpu or not torch.accelerator.is_available()):
        raise UsageError(
            "--fp16 needs a GPU: on the CPU Accelerate runs no float16 mixed precision, and the run would train in "
            "float32; --bf16 is the CPU's mixed precision"
        )
    if torch.cuda.is_available():
        return
    if args.deepspeed:
        raise ValueError(
            "--deepspeed needs a GPU: Accelerate runs DeepSpeed on accelerators only; shard the model on CPU "
            "processes with --fsdp instead"
        )
    if args.fsdp and TorchVersion(transformers.__version__) < "5.8":
        raise ValueError(  # before 5.8, transformers' --fsdp is FSDP1, which has no CPU support, by default
            "--fsdp on CPU processes needs transformers >= 5.8, whose --fsdp is FSDP2 "
            f"(found {transformers.__version__}); upgrade transformers"
        )
    if os.environ.get("WORLD_SIZE", "1") != "1":
        # Several processes on a machine without GPUs (torchrun / accelerate launch): Accelerate forms the
        # gloo process group only when asked for the CPU; otherwise every rank would train alone.
        args.use_cpu = True
    args.dataloader_pin_memory = False  # pinning needs an accelerator


def check_recipe_values(args):
    """Raise naming the flag for values transformers accepts but that cannot train: a run of 0 or -5 steps would save
    an untrained model as if it were trained."""
    if args.max_steps == 0 or args.max_steps < -1:
        raise ValueError(
            f"--max_steps must be a positive number of optimizer steps (or -1 to train for --num_train_epochs), "
            f"got {args.max_steps}"
        )
    if args.max_steps == -1 and not args.num_train_epochs > 0:
        raise ValueError(
            f"--num_train_epochs must be positive (or give --max_steps), got {args.num_train_epochs}"
        )
    refuse_nonpositive(args, "max_train_minutes save_minutes", "a positive number of minutes")
    refuse_nonpositive(args, "learning_rate learning_rate_constant", "a positive number")
    refuse_nonpositive(args, "pad_to_multiple_of", "a positive number of tokens")
    if not args.do_train:
        raise ValueError(
            "--do_train false leaves nothing to do: this tool trains (translate with vaswani-translate)"
        )
    if not 0.0 <= args.label_smoothing_factor < 1.0:  # NaN too
        raise ValueError(
            f"--label_smoothing_factor must be at least 0 and below 1 (the probability mass spread over the "
            f"vocabulary; the paper: 0.1), got {args.label_smoothing_factor}"
        )
    if args.save_strategy == "steps" and not args.save_steps > 0:
        raise ValueError(
            f"--save_steps must be positive with --save_strategy steps (a checkpoint every N steps), got "
            f"{args.save_steps}; --save_strategy no saves none"
        )
    if not 0.0 <= args.lr_cooldown_fraction < 1.0:  # NaN too
        raise ValueError(
            f"--lr_cooldown_fraction must be at least 0 and below 1 (the share of the run over which the "
            f"learning rate falls to 0), got {args.lr_cooldown_fraction}"
        )
    if args.lr_cooldown_fraction and not args.paper_lr_schedule:
        raise ValueError(
            "--lr_cooldown_fraction acts on the §5.3 schedule; with --paper_lr_schedule false choose a decaying "
            "--lr_scheduler_type (linear, cosine) instead"
        )


def choose_batches(args):
    """Set `args.max_tokens` and `args.max_sentences` (the cap of a token-budget batch, None for none) from what was
    given; `per_device_train_batch_size` None means not given (then transformers' 8, which token-budget batches do
    not use)."""
    refuse_nonpositive(args, "per_device_train_batch_size max_tokens batch_tokens")
    args.max_sentences = None
    if args.per_device_train_batch_size is None:
        # transformers' default, which token-budget batches do not use
        args.per_device_train_batch_size = Seq2SeqTrainingArguments.per_device_train_batch_size
        if args.max_tokens is None:
            args.max_tokens = PAPER_MAX_TOKENS
    elif args.max_tokens:
        args.max_sentences = args.per_device_train_batch_size
    if args.batch_tokens and args.max_tokens is None:
        raise ValueError(
            "--batch_tokens needs token-budget batches: give --max_tokens too (--per_device_train_batch_size alone "
            "batches sentences)"
        )
