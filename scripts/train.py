#!/usr/bin/env python
"""Train the Transformer with the paper's recipe (§5) on a parallel corpus.

Every `Seq2SeqTrainingArguments` flag works (the paper's values are the defaults), plus the data and model flags
of `vaswani.recipe`, plus any `VaswaniConfig` field (`--d_model 256 --encoder_layers 3 ...`) over the preset.

    python scripts/train.py --data ../shared/data/multi30k --validation_split val --preset small \
        --vocab_size 8000 --max_steps 2000 --output_dir runs/de-en
    accelerate launch --multi_gpu --num_processes 8 scripts/train.py --preset base --data wmt14 --data_config de-en \
        --source_lang en --target_lang de --batch_tokens 25000 --max_tokens 4096 --bf16 ...
    torchrun --nproc_per_node 2 scripts/train.py ...
"""

import logging
import sys

import transformers
from transformers import HfArgumentParser

from vaswani.recipe import DataArguments, ModelArguments, parse_config_overrides, train_main
from vaswani.training import PaperTrainingArguments


def main(argv=None):
    parser = HfArgumentParser((ModelArguments, DataArguments, PaperTrainingArguments))
    model_args, data_args, training_args, remaining = parser.parse_args_into_dataclasses(
        args=argv, return_remaining_strings=True
    )
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        level=logging.INFO if training_args.process_index == 0 else logging.WARNING,
        stream=sys.stdout,
    )
    transformers.utils.logging.set_verbosity_info() if training_args.process_index == 0 else None
    train_main(model_args, data_args, training_args, parse_config_overrides(remaining))


if __name__ == "__main__":
    main()
