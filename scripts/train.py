#!/usr/bin/env python
"""Train the Transformer with the paper's recipe (§5), then average, translate the test set and score it (§6.1).

Every `Seq2SeqTrainingArguments` flag works (the paper's values are the defaults), plus the data, model and finishing
flags of `vaswani.recipe`, plus any `VaswaniConfig` field (`--d_model 256 --encoder_layers 3 ...`) over the preset.

    python scripts/train.py --data ../shared/data/multi30k --validation_split val --test_split test_2016_flickr \
        --preset small --vocab_size 8000 --max_steps 2000 --average_last 5 --output_dir runs/de-en
    accelerate launch --multi_gpu --num_processes 8 scripts/train.py --preset base --data wmt14 --data_config de-en \
        --source_lang en --target_lang de --batch_tokens 25000 --max_tokens 4096 --bf16 --average_last 5 ...
    torchrun --nproc_per_node 2 scripts/train.py ...
"""

import logging
import sys

from transformers import HfArgumentParser
from transformers.utils import logging as hf_logging

from vaswani.recipe import (
    DataArguments,
    FinishArguments,
    ModelArguments,
    finish,
    parse_config_overrides,
    train_main,
)
from vaswani.training import PaperTrainingArguments


def main(argv=None):
    parser = HfArgumentParser((ModelArguments, DataArguments, FinishArguments, PaperTrainingArguments))
    model_args, data_args, finish_args, training_args, remaining = parser.parse_args_into_dataclasses(
        args=argv, return_remaining_strings=True
    )
    main_process = training_args.process_index == 0
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        level=logging.INFO if main_process else logging.WARNING,
        stream=sys.stdout,
    )
    hf_logging.set_verbosity_info() if main_process else hf_logging.set_verbosity_warning()
    trainer = train_main(model_args, data_args, training_args, parse_config_overrides(remaining))
    scores = finish(trainer, data_args, finish_args)
    if scores:
        print(f"\n{finish_args.test_split}: BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}")
        print(f"  {scores['bleu_signature']}")
        print(
            f"  lowercased Moses-tokenized BLEU (comparable to published Multi30k figures): "
            f"{scores['bleu_lowercase_moses_tokenized']:.2f}"
        )


if __name__ == "__main__":
    main()
