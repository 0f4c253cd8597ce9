"""Runs `vaswani-train`'s main (`vaswani.commands.train`) with two test hooks, set through the environment:

VASWANI_KILL_AT_STEP=N   the process SIGKILLs itself right after the checkpoint of step N is written;
VASWANI_DUMP_WEIGHTS=DIR every rank writes its initial and final state dicts to DIR/initial<r>.pt and DIR/rank<r>.pt,
                         and to DIR/rank<r>.json its number of updates, the training set's cache files, the
                         batches of pairs it tokenized (0: it mapped a cache) and the micro-batches it trained on
                         (per micro-batch, the sorted digests of its source sentences).
"""

import hashlib
import json
import os
import signal
from pathlib import Path

import torch
from transformers import TrainerCallback

from vaswani.commands import train
from vaswani.recipe import data, run, trainer


class KillAfterSave(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            os.kill(os.getpid(), signal.SIGKILL)


original_init = trainer.VaswaniTrainer.__init__


def patched_init(self, *args, **kwargs):
    original_init(self, *args, **kwargs)
    if os.environ.get("VASWANI_KILL_AT_STEP"):
        self.add_callback(KillAfterSave(int(os.environ["VASWANI_KILL_AT_STEP"])))
    self.micro_batches = []
    out = os.environ.get("VASWANI_DUMP_WEIGHTS")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        torch.save(state, Path(out) / f"initial{self.args.process_index}.pt")


def sentence_digests(inputs) -> list[str]:
    rows = [
        ids[mask.bool()].tolist()
        for ids, mask in zip(inputs["input_ids"], inputs["attention_mask"], strict=True)
    ]
    return sorted(hashlib.sha1(json.dumps(row).encode()).hexdigest()[:16] for row in rows)


original_training_step = trainer.VaswaniTrainer.training_step


def recording_training_step(self, model, inputs, *args, **kwargs):
    self.micro_batches.append(sentence_digests(inputs))
    return original_training_step(self, model, inputs, *args, **kwargs)


trainer.VaswaniTrainer.__init__ = patched_init
trainer.VaswaniTrainer.training_step = recording_training_step
encoded_batches = []
original_encode_pairs = data._encode_pairs


def counting_encode_pairs(*args, **kwargs):
    encoded_batches.append(1)
    return original_encode_pairs(*args, **kwargs)


data._encode_pairs = counting_encode_pairs  # what tokenize_dataset maps (in this process: no --num_proc)
original_train_main = run.train_main  # the tool imports it from here when it runs


def train_main_and_dump(*args, **kwargs):
    trainer = original_train_main(*args, **kwargs)
    out = os.environ.get("VASWANI_DUMP_WEIGHTS")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu() for k, v in trainer.model.state_dict().items()}
        torch.save(state, Path(out) / f"rank{trainer.args.process_index}.pt")
        record = {
            "updates": trainer.state.global_step,
            "cache_files": [f["filename"] for f in trainer.train_dataset.cache_files],
            "micro_batches": trainer.micro_batches,
            "tokenized_batches": len(encoded_batches),
        }
        (Path(out) / f"rank{trainer.args.process_index}.json").write_text(json.dumps(record))
    return trainer


run.train_main = train_main_and_dump

if __name__ == "__main__":
    train.main()
