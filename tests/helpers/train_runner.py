"""Runs `vaswani-train`'s main (`vaswani.commands.train`) with two test hooks, set through the environment:

VASWANI_KILL_AT_STEP=N   the process SIGKILLs itself right after the checkpoint of step N is written;
VASWANI_DUMP_WEIGHTS=DIR every rank writes its final state dict to DIR/rank<r>.pt.
"""

import os
import signal
from pathlib import Path

import torch
from transformers import TrainerCallback

from vaswani import trainer
from vaswani.commands import train


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


trainer.VaswaniTrainer.__init__ = patched_init
original_train_main = train.train_main


def train_main_and_dump(*args, **kwargs):
    trainer = original_train_main(*args, **kwargs)
    out = os.environ.get("VASWANI_DUMP_WEIGHTS")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu() for k, v in trainer.model.state_dict().items()}
        torch.save(state, Path(out) / f"rank{trainer.args.process_index}.pt")
    return trainer


train.train_main = train_main_and_dump

if __name__ == "__main__":
    train.main()
