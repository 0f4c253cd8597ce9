"""§5.1 Batches of similar length by token budget: "Sentence pairs were batched together by approximate sequence
length. Each training batch contained a set of sentence pairs containing approximately 25000 source tokens and 25000
target tokens." `VaswaniTrainer` batches its training set with `TokenBudgetBatchSampler` (`--max_tokens`).

The sampler works on numpy arrays only, so that it scales to WMT: the lengths come from the tokenized dataset's Arrow
`length` column (`example_lengths`, never through Python lists), the batch boundaries are computed once with a few
Python steps per distinct length, and an epoch is one permuted index array (4 bytes per pair) plus the order of the
batches. MLPerf's reference groups the 4.59M pairs of WMT en-de into batches in 1.36 s; here an epoch of 4.5M pairs
takes about 0.3 s and 50 MB (BENCHMARKS.md, "Data at WMT scale").
"""

import math

import numpy as np
from transformers import TrainerCallback

LENGTH_COLUMN = "length"
# Pairs grouped by length per pass of `_group_by_length`: bounds its temporary arrays to a few MB.
_CHUNK = 1 << 18
# Rows of the dataset read per pass by `example_lengths` (an indices mapping is read a chunk of indices at a time).
_READ_ROWS = 1 << 20


def example_lengths(dataset):
    """The length of each training pair, the longer of its two sides, as an int32 array: the `length` column that
    `data.tokenize_dataset` writes, read from Arrow in chunks (the token lists are never read). A dataset with an
    indices mapping (`select`, `shuffle`) is read in its own order."""
    if LENGTH_COLUMN not in dataset.column_names:
        raise ValueError(
            f"Token-budget batches need a {LENGTH_COLUMN!r} column, as a dataset tokenized by data.tokenize_dataset "
            f"has; the training dataset has {dataset.column_names}"
        )
    tables = dataset.select_columns([LENGTH_COLUMN]).with_format("arrow").iter(batch_size=_READ_ROWS)
    # one array per table: a table read through an indices mapping holds a chunk per row
    return np.concatenate(
        [table[LENGTH_COLUMN].combine_chunks().to_numpy() for table in tables], dtype=np.int32
    )


def padded_lengths(lengths, multiple):
    """The lengths a batch pads to under `DataCollatorForSeq2Seq(pad_to_multiple_of=multiple)`: each rounded up to
    a multiple of `multiple` (unchanged for None), so that a token budget counts the tokens its batches will hold."""
    if not multiple or multiple == 1:
        return lengths
    return -(-lengths.astype(np.int64) // multiple) * multiple


def mark_batch_dynamic(batch):
    """Mark the sentences and tokens dimensions of a batch's token tensors dynamic for `torch.compile`, so that its
    first compilation serves every shape of the token-budget batches instead of compiling once for the first shape
    and again when the next differs (`torch._dynamo.maybe_mark_dynamic`; where the graph needs a fixed size it keeps
    one and compiles again, never failing)."""
    import torch

    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.dim() == 2:
            torch._dynamo.maybe_mark_dynamic(value, 0)
            torch._dynamo.maybe_mark_dynamic(value, 1)


def _batch_offsets(counts, max_tokens, max_sentences):
    """Where each batch begins in the pairs sorted by length, and the end: `[0, b1, b2, ..., n]`.

    Pairs sorted by ascending length L are taken greedily: a batch that starts at i holds i..j for the largest j with
    `L[j] * (j - i + 1) <= max_tokens` (its padded size) and at most `max_sentences` pairs. Within a run of pairs of one
    length v that is a batch of `min(max_tokens // v, max_sentences)` pairs, so each run is cut into equal batches at
    once and only a batch that spills over into longer runs needs a step of its own: a few Python steps per distinct
    length, whatever the number of pairs. The boundaries depend on `counts` (pairs per length) alone, so they are the
    same in every epoch, whichever way the pairs of equal length are shuffled.
    """
    values = np.flatnonzero(counts)
    run_ends = np.cumsum(counts[values])
    run_starts = run_ends - counts[values]
    total = int(run_ends[-1])
    # The pairs of a batch of one length (of length 0, whose padded size is 0: as many as allowed).
    caps = [min(max_tokens // int(v) if v else total, max_sentences or total) for v in values]
    pieces, start, run = [np.zeros(1, dtype=np.int64)], 0, 0
    while start < total:
        while run_ends[run] <= start:
            run += 1
        cap, end = caps[run], int(run_ends[run])
        full = (end - start) // cap
        if full:
            pieces.append(start + cap * np.arange(1, full + 1, dtype=np.int64))
            start += cap * full
        if start == end:
            continue
        # The rest of this run fits in one batch, which takes longer pairs while they fit: every pair of run q fits
        # while start + caps[q] covers the run's end; else the batch ends inside (or just before) run q.
        later = run + 1
        while later < len(values) and start + caps[later] >= run_ends[later]:
            later += 1
        stop = total if later == len(values) else max(int(run_starts[later]), start + caps[later])
        pieces.append(np.array([stop], dtype=np.int64))
        start = stop
    return np.concatenate(pieces)


class TokenBudgetBatchSampler:
    """Batches of example indices holding at most `max_tokens` tokens each, sentences of similar length together.

    §5.1: "Sentence pairs were batched together by approximate sequence length. Each training batch contained a set
    of sentence pairs containing approximately 25000 source tokens and 25000 target tokens." A batch's cost is its
    padded size, `len(batch) * max(length)`, where an example's length is the longer of its two sides.

    Each epoch shuffles examples of equal length and the order of the batches with a generator seeded by
    `(seed, epoch)`, so the batches of an epoch are a pure function of the epoch: a resumed run sees the same ones.
    The number of batches does not depend on the epoch. Under DDP, Accelerate deals the batches out to the ranks
    (rank r takes batches r, r + world, ...), so one global step sees `world` consecutive batches.

    `lengths` may be any integer sequence; pass a numpy array (`example_lengths(dataset)`) for a large corpus. The
    sampler keeps the lengths in the smallest integer type that holds them, and an epoch as one permuted index array
    sliced at fixed offsets; each batch becomes a Python list only when it is yielded. `max_tokens` and
    `max_sentences` (None: no cap) are positive and `lengths` non-empty, as the recipe checks (`--max_tokens`,
    `--per_device_train_batch_size`; a run whose every training pair was dropped stops before batching).
    """

    def __init__(self, lengths, max_tokens, seed=0, max_sentences=None):
        lengths = np.asarray(lengths)
        longest = int(lengths.max())
        if longest > max_tokens:
            raise ValueError(
                f"Example {int(lengths.argmax())} has {longest} tokens, more than `max_tokens`={max_tokens}: "
                "raise the token budget or filter long pairs (`max_length`)."
            )
        self.lengths = lengths.astype(np.min_scalar_type(longest), copy=False)
        self._index_dtype = np.int32 if len(lengths) < 2**31 else np.int64
        self._counts = np.bincount(self.lengths)
        self.seed = seed
        self.epoch = 0
        self.batch_size = None  # batches vary in size; read by Accelerate
        self.drop_last = False
        self._offsets = _batch_offsets(self._counts, max_tokens, max_sentences)

    def set_epoch(self, epoch):
        self.epoch = int(epoch)

    def _group_by_length(self, indices):
        """`indices` stably sorted by length (`indices[np.argsort(lengths[indices], kind="stable")]`), a counting
        sort done a chunk at a time so that no index array wider than `indices` is ever held."""
        cursor = np.cumsum(self._counts) - self._counts  # where the next pair of each length goes
        grouped = np.empty_like(indices)
        for begin in range(0, len(indices), _CHUNK):
            chunk = indices[begin : begin + _CHUNK]
            keys = self.lengths[chunk]
            by_key = np.argsort(keys, kind="stable")
            sorted_keys = keys[by_key]
            counts = np.bincount(keys, minlength=len(cursor))
            first = np.cumsum(counts) - counts  # where each length begins in the sorted chunk
            grouped[cursor[sorted_keys] + (np.arange(len(chunk)) - first[sorted_keys])] = chunk[by_key]
            cursor += counts
        return grouped

    def epoch_order(self):
        """This epoch as arrays: the example indices sorted by length (random among equals), and the order in which the
        batches `order[offsets[b]:offsets[b + 1]]` are taken."""
        indices = np.arange(len(self.lengths), dtype=self._index_dtype)
        rng = np.random.default_rng([self.seed, self.epoch])
        rng.shuffle(indices)  # the draws of rng.permutation(len(lengths)), in 4 bytes per example
        order = self._group_by_length(indices)
        return order, rng.permutation(len(self))

    def __iter__(self):
        order, batch_order = self.epoch_order()
        offsets = self._offsets
        for b in batch_order.tolist():
            yield order[offsets[b] : offsets[b + 1]].tolist()

    def __len__(self):
        return len(self._offsets) - 1


class EpochSetter(TrainerCallback):
    """Tells the sampler which epoch begins. Accelerate's wrappers (skipping batches on resume, sharding under DDP)
    do not always forward `set_epoch`, so the epoch is taken from the trainer's own state instead."""

    def __init__(self, sampler):
        self.sampler = sampler
        self.next_epoch = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.next_epoch = math.floor((state.epoch or 0.0) + 1e-6)  # a resumed run continues its epoch

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.sampler.set_epoch(self.next_epoch)
        self.next_epoch += 1
