"""`vaswani-train`: train the Transformer with the paper's recipe (§5), then average, translate the test split and
score it (§6.1). `vaswani-train --help` lists the flags by group; `--help_all` adds every Seq2SeqTrainingArguments
flag, all of which work."""

from __future__ import annotations

from ..cli import command, parse_args, setup_logging
from ..recipe import (
    DataArguments,
    FinishArguments,
    ModelArguments,
    ModelConfigArguments,
    config_overrides,
    finish,
    train_main,
)
from ..training import PaperTrainingArguments

DESCRIPTION = """\
Train the Transformer of "Attention Is All You Need" with the paper's recipe (§5: joint BPE, token-budget batches,
Adam with warm-up, label smoothing), then average the last checkpoints, translate the test split with beam search and
score it (§6.1). The paper's values are the defaults; any VaswaniConfig field is a flag (--d_model 256 --dropout 0.3).
"""

EPILOG = """\
examples:
  vaswani-train --dataset_name ../shared/data/multi30k --validation_split val --test_split test_2016_flickr \\
      --source_lang de --target_lang en --preset small --vocab_size 8000 --max_train_minutes 10 --average_last 5 \\
      --output_dir runs/de-en
  vaswani-train run.yaml --seed 2               (flags from a YAML or JSON file; later flags override it)
  torchrun --nproc_per_node 8 -m vaswani.commands.train --preset base --dataset_name wmt14 \\
      --dataset_config_name de-en --source_lang en --target_lang de --batch_tokens 25000 --bf16 ...
"""

# Old flag names, still accepted with a warning.
RENAMED = {
    "data": "dataset_name",
    "data_config": "dataset_config_name",
    "tokenizer": "tokenizer_name",
    "max_length": "max_source_length",
    "num_proc": "preprocessing_num_workers",
    "init_from": "model_name_or_path",
}

SECTIONS = {
    "the paper's training recipe (§5; Seq2SeqTrainingArguments with the paper's defaults)": [
        "max_tokens",
        "batch_tokens",
        "learning_rate",
        "warmup_steps",
        "paper_lr_schedule",
        "lr_cooldown_fraction",
        "adam_beta1",
        "adam_beta2",
        "adam_epsilon",
        "weight_decay",
        "label_smoothing_factor",
        "max_grad_norm",
    ],
    "the run": [
        "output_dir",
        "overwrite_output_dir",
        "resume_from_checkpoint",
        "max_steps",
        "num_train_epochs",
        "max_train_minutes",
        "seed",
        "save_steps",
        "save_total_limit",
        "eval_strategy",
        "eval_steps",
        "generation_num_beams",
        "per_device_eval_batch_size",
        "logging_steps",
        "log_level",
        "report_to",
        "do_eval",
        "do_predict",
        "bf16",
        "fp16",
        "gradient_accumulation_steps",
    ],
    "more than one process or machine (torchrun / accelerate launch)": ["fsdp", "fsdp_config", "deepspeed"],
    "publishing (after training, with the model card)": [
        "push_to_hub",
        "hub_model_id",
        "hub_token",
        "hub_private_repo",
    ],
}


# Shorter help for the Trainer's flags shown by --help.
HELPS = {
    "max_steps": "Optimizer steps to train (-1: --num_train_epochs instead).",
    "num_train_epochs": "Epochs to train when --max_steps is -1.",
    "seed": "Random seed of the initial weights, dropout and batch order.",
    "save_total_limit": "Keep only the newest N checkpoints.",
    "per_device_eval_batch_size": "Sentences per device and evaluation batch.",
    "log_level": "transformers' log level (default: warnings; --verbose for info).",
    "bf16": "bfloat16 autocast.",
    "fp16": "float16 autocast.",
    "gradient_accumulation_steps": "Micro-batches per optimizer step (see --batch_tokens).",
    "resume_from_checkpoint": "'last': continue the run in --output_dir from its newest intact checkpoint; or a "
    "checkpoint folder.",
    "fsdp": "Shard the model with FSDP2 (also on CPU processes over gloo).",
    "fsdp_config": "FSDP settings: a JSON file or JSON text.",
    "deepspeed": "A DeepSpeed JSON config (needs deepspeed installed and an accelerator).",
    "push_to_hub": "Publish the final (averaged) model with its model card after training.",
    "hub_model_id": "The Hub repo to publish to, 'namespace/name'.",
    "hub_token": "Hub token (default: HF_TOKEN or `hf auth login`); never written to disk.",
    "hub_private_repo": "Create the repo as private.",
}


@command("vaswani-train")
def main(argv):
    model_args, config_args, data_args, finish_args, training_args = parse_args(
        [ModelArguments, ModelConfigArguments, DataArguments, FinishArguments, PaperTrainingArguments],
        argv,
        description=DESCRIPTION,
        epilog=EPILOG,
        renamed=RENAMED,
        sections=SECTIONS,
        brief=[PaperTrainingArguments],
        helps=HELPS,
    )
    setup_logging(main_process=training_args.process_index == 0)
    trainer = train_main(model_args, data_args, training_args, config_overrides(config_args), finish_args)
    scores = finish(trainer, data_args, finish_args)
    if scores:
        print(f"\n{scores['split']}: BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}")
        print(f"  {scores['bleu_signature']}")
        if "bleu_lowercase_moses_tokenized" in scores:
            print(
                f"  lowercased Moses-tokenized BLEU (comparable to published Multi30k figures): "
                f"{scores['bleu_lowercase_moses_tokenized']:.2f}"
            )
    return trainer


if __name__ == "__main__":
    main()
