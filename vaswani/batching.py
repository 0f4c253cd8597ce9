"""§5.1 Batches of similar length by token budget: "Sentence pairs were batched together by approximate sequence
length. Each training batch contained a set of sentence pairs containing approximately 25000 source tokens and 25000
target tokens." `VaswaniTrainer` batches its training set with `TokenBudgetBatchSampler` (`--max_tokens`)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
from transformers import TrainerCallback


class TokenBudgetBatchSampler:
    """Batches of example indices holding at most `max_tokens` tokens each, sentences of similar length together.

    §5.1: "Sentence pairs were batched together by approximate sequence length. Each training batch contained a set
    of sentence pairs containing approximately 25000 source tokens and 25000 target tokens." A batch's cost is its
    padded size, `len(batch) * max(length)`, where an example's length is the longer of its two sides.

    Each epoch shuffles examples of equal length and the order of the batches with a generator seeded by
    `(seed, epoch)`, so the batches of an epoch are a pure function of the epoch: a resumed run sees the same ones.
    The number of batches does not depend on the epoch. Under DDP, Accelerate deals the batches out to the ranks
    (rank r takes batches r, r + world, ...), so one global step sees `world` consecutive batches.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        max_tokens: int,
        shuffle: bool = True,
        seed: int = 0,
        max_sentences: int | None = None,
    ):
        if max_tokens <= 0:
            raise ValueError(f"`max_tokens` must be positive, got {max_tokens}.")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        if len(self.lengths) == 0:
            raise ValueError("Cannot batch an empty dataset.")
        longest = int(self.lengths.max())
        if longest > max_tokens:
            raise ValueError(
                f"Example {int(self.lengths.argmax())} has {longest} tokens, more than `max_tokens`={max_tokens}: "
                "raise the token budget or filter long pairs (`max_length`)."
            )
        self.max_tokens = max_tokens
        self.max_sentences = max_sentences
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.batch_size = None  # batches vary in size; read by Accelerate
        self.drop_last = False
        self._num_batches = len(self._group(np.argsort(self.lengths, kind="stable")))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _group(self, order: np.ndarray) -> list[list[int]]:
        batches, batch, longest = [], [], 0
        for index in order.tolist():
            length = int(self.lengths[index])
            grown = max(longest, length)
            full = self.max_sentences is not None and len(batch) >= self.max_sentences
            if batch and (grown * (len(batch) + 1) > self.max_tokens or full):
                batches.append(batch)
                batch, grown = [], length
            batch.append(index)
            longest = grown
        batches.append(batch)
        return batches

    def batches(self) -> list[list[int]]:
        if not self.shuffle:
            return self._group(np.argsort(self.lengths, kind="stable"))
        rng = np.random.default_rng([self.seed, self.epoch])
        shuffled = rng.permutation(len(self.lengths))
        order = shuffled[np.argsort(self.lengths[shuffled], kind="stable")]  # by length, random among equals
        batches = self._group(order)
        return [batches[i] for i in rng.permutation(len(batches))]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches())

    def __len__(self) -> int:
        return self._num_batches


class EpochSetter(TrainerCallback):
    """Tells the sampler which epoch begins. Accelerate's wrappers (skipping batches on resume, sharding under DDP)
    do not always forward `set_epoch`, so the epoch is taken from the trainer's own state instead."""

    def __init__(self, sampler: TokenBudgetBatchSampler):
        self.sampler = sampler
        self.next_epoch = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.next_epoch = math.floor((state.epoch or 0.0) + 1e-6)  # a resumed run continues its epoch

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.sampler.set_epoch(self.next_epoch)
        self.next_epoch += 1
