"""Data at WMT scale: wall time and peak resident memory of every stage from raw text to the first training step.

`vaswani-train --preset tiny --max_steps 1` runs on a WMT-shaped corpus of `--pairs` pairs (`bench.synthetic_corpus`,
written once into `--work-dir` and kept), in fresh processes: one, or two ranks under torchrun (gloo) with
`--processes 2`. Each rank records, for each stage of the recipe, its seconds and its peak resident set (`VmHWM`,
reset through `/proc/self/clear_refs` when the stage begins):

- text -> Arrow: `run.load_split`, the text files read into datasets' Arrow cache (rank 0; the others map it);
- BPE: `run.prepare_tokenizers`, the joint BPE on `--tokenizer-samples` pairs drawn at random (rank 0; the others
  load it);
- tokenize: `data.tokenize_dataset`, the one `map` pass over the training split (rank 0; the others map its cache);
- sampler: `VaswaniTrainer.token_sampler`, the lengths read from Arrow and the token-budget batches built;
- first step: from the start of training to the end of the first update;

and the seconds from the launch of the processes to the end of that update. The run is repeated from the cache (the
first run's tokenizer and datasets cache: nothing is read or tokenized again), the BPE is also trained on every pair
(`vaswani-train-tokenizer`, another fresh process), and the same model trains on a Multi30k-sized corpus (29,000
pairs, the local copy of Multi30k when there is one) for the comparison of peak memory. `--sampler-only` times the
sampler alone on `--pairs` random lengths (e.g. 36,000,000, WMT en-fr).

    python -m bench data-scale --pairs 450000 --json bench/results/data_scale_450k_cpu.json
    python -m bench data-scale --pairs 4500000 --processes 2 --json bench/results/data_scale_4.5M_2p_cpu.json
    python -m bench data-scale --sampler-only --pairs 36000000
"""

import argparse
import json
import os
import shutil
import threading
import time
from pathlib import Path
from unittest import mock

import numpy as np

from bench import common
from bench.synthetic_corpus import write_corpus

STAGES = ("text -> Arrow", "BPE", "tokenize", "sampler", "first step")


def parse_args(argv):
    parser = common.parser("data-scale", __doc__, repeats=None)
    parser.add_argument("--pairs", type=int, default=450_000, help="training pairs (WMT14 en-de: 4.5M)")
    parser.add_argument("--processes", type=int, default=1, choices=[1, 2], help="2: torchrun with gloo")
    parser.add_argument(
        "--sampler-only", action="store_true", help="time the sampler alone on random lengths"
    )
    parser.add_argument(
        "--work-dir", default="/tmp/vaswani-data-scale", help="corpora (kept), caches and runs"
    )
    parser.add_argument("--max-tokens", type=int, default=8192, help="token budget of a micro-batch")
    parser.add_argument("--child", choices=["train", "bpe", "sampler"], help=argparse.SUPPRESS)
    parser.add_argument("--record", help=argparse.SUPPRESS)  # where a child writes its JSON
    parser.add_argument("--launched", type=float, help=argparse.SUPPRESS)  # time.time() at the launch
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)  # the tool's own flags
    parser.set_defaults(preset="tiny", vocab_size=8000)
    args = common.parse(parser, argv, vocab_size=500, max_tokens=2048)
    if args.quick:  # a smoke test: 2,000 pairs, the first run and the rerun only
        args.pairs = 200_000 if args.sampler_only else 2000
    args.tokenizer_samples = max(
        1, min(1_000_000, args.pairs // 4)
    )  # the BPE learns from a quarter, at most 1M
    args.rest = [a for a in args.rest if a != "--"]
    return args


# --------------------------------------------------------------------------------------------------------------------
# Inside the measured processes
# --------------------------------------------------------------------------------------------------------------------
class StageClock:
    """Seconds and peak resident set of each stage of this process, and the process's peak over all of them.

    `VmHWM` counts every resident page, the pages of memory-mapped Arrow files that a stage reads too (clean file
    pages, shared between processes and dropped by the kernel under pressure); a thread also samples `RssAnon`, the
    process's own memory, every 10 ms, whose peak is reported beside it."""

    def __init__(self):
        self.stages = {}
        self.peak = self.peak_anon = self.stage_anon = 0.0
        self.stopped = threading.Event()
        threading.Thread(target=self._sample_anonymous_memory, daemon=True).start()

    def _sample_anonymous_memory(self):
        while not self.stopped.wait(0.01):
            anon = common.rss_mib("RssAnon")
            self.stage_anon, self.peak_anon = max(self.stage_anon, anon), max(self.peak_anon, anon)

    def begin(self):
        self.peak = max(self.peak, common.rss_mib("VmHWM"))
        common.reset_peak_rss()
        self.stage_anon = common.rss_mib("RssAnon")
        return time.perf_counter()

    def end(self, name, started):
        peak, anon = common.rss_mib("VmHWM"), max(self.stage_anon, common.rss_mib("RssAnon"))
        self.peak, self.peak_anon = max(self.peak, peak), max(self.peak_anon, anon)
        entry = self.stages.setdefault(name, {"seconds": 0.0, "peak_rss_mib": 0.0, "peak_anon_mib": 0.0})
        entry["seconds"] += time.perf_counter() - started
        entry["peak_rss_mib"] = max(entry["peak_rss_mib"], peak)
        entry["peak_anon_mib"] = max(entry["peak_anon_mib"], anon)

    def summary(self):
        return {"stages": self.stages, "peak_rss_mib": self.peak, "peak_anon_mib": self.peak_anon}

    def wrap(self, name, function, when=None):
        def timed(*args, **kwargs):
            if when and not when(*args):
                return function(*args, **kwargs)
            started = self.begin()
            try:
                return function(*args, **kwargs)
            finally:
                self.end(name, started)

        return timed


def _train_child(args):
    """`vaswani-train` in this process, its stages timed, ended right after the first update."""
    from transformers import TrainerCallback

    from vaswani.commands import train as command
    from vaswani.recipe import data, run

    clock, rank = StageClock(), int(os.environ.get("RANK", "0"))
    record = {"rank": rank, "tokenized_batches": 0}

    def count(function):
        def counting(*a, **k):
            record["tokenized_batches"] += 1
            return function(*a, **k)

        return counting

    class FirstStep(TrainerCallback):
        def on_train_begin(self, *_, **kwargs):
            self.started = clock.begin()

        def on_step_end(self, _, state, control, train_dataloader, **kwargs):
            if state.global_step == 1:
                clock.end("first step", self.started)
                record.update(
                    to_first_step_s=time.time() - args.launched,
                    train_pairs=len(train_dataloader.dataset),
                    **clock.summary(),
                )
                Path(args.record, f"rank{rank}.json").write_text(json.dumps(record))
                os._exit(0)  # what follows (saving the model, the summary) is no data stage

    class Trainer(run.VaswaniTrainer):
        token_sampler = clock.wrap(
            "sampler", run.VaswaniTrainer.token_sampler, when=lambda self: self._train_sampler is None
        )

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.add_callback(FirstStep())

    run.VaswaniTrainer = Trainer
    run.load_split = clock.wrap("text -> Arrow", run.load_split)
    run.prepare_tokenizers = clock.wrap("BPE", run.prepare_tokenizers)
    run.tokenize_dataset = clock.wrap("tokenize", run.tokenize_dataset)
    data._encode_pairs = count(data._encode_pairs)  # 0 calls: the tokenized cache was mapped
    command.main(args.rest)


def _bpe_child(args):
    """`vaswani-train-tokenizer` in this process: the BPE's seconds and peak resident set."""
    from vaswani.commands import train_tokenizer as command
    from vaswani.recipe import run  # the tool imports its steps from here when it runs

    clock = StageClock()
    with mock.patch.multiple(  # restored after, when run in a test's process
        run,
        load_split=clock.wrap("text -> Arrow", run.load_split),
        train_new_tokenizers=clock.wrap("BPE", run.train_new_tokenizers),
    ):
        command.main(args.rest)
    clock.stopped.set()
    Path(args.record, "rank0.json").write_text(json.dumps(clock.summary()))


def random_lengths(pairs):
    """Token lengths shaped like WMT's after BPE: log-normal with a median of 30 tokens, from 1 to 256."""
    lengths = np.random.default_rng(0).lognormal(np.log(30.0), 0.55, pairs)
    return np.clip(np.round(lengths), 1, 256).astype(np.int32)


def _sampler_child(args):
    """The sampler alone on `--pairs` random lengths: building it, one epoch's arrays, iterating the epoch."""
    from vaswani.recipe.batching import TokenBudgetBatchSampler

    lengths = random_lengths(args.pairs)
    timings = {}

    def work():
        started = time.perf_counter()
        sampler = TokenBudgetBatchSampler(lengths, args.max_tokens, seed=1)
        timings["build_s"] = time.perf_counter() - started
        started = time.perf_counter()
        sampler.set_epoch(1)
        order, batch_order = sampler.epoch_order()
        timings["epoch_arrays_s"] = time.perf_counter() - started
        del order, batch_order
        started = time.perf_counter()
        pairs = sum(len(batch) for batch in sampler)
        timings["epoch_iterated_s"] = time.perf_counter() - started
        timings["batches"], timings["pairs"] = len(sampler), pairs

    memory = common.peak_rss_during(work)  # fills `timings`
    record = {**timings, "peak_rss_mib": memory["peak_rss_mib"], "rise_mib": memory["rise_mib"]}
    Path(args.record, "rank0.json").write_text(json.dumps(record))


# --------------------------------------------------------------------------------------------------------------------
# The parent: corpora, launches, the table
# --------------------------------------------------------------------------------------------------------------------
def corpus(work_dir, pairs):
    """The synthetic WMT-shaped corpus of `pairs` pairs, written once and kept (`complete` marks a whole one)."""
    folder = work_dir / f"corpus-{pairs}"
    if not (folder / "complete").is_file():
        started = time.perf_counter()
        write_corpus(folder, pairs, "en", "de", validation=min(3000, pairs), test=min(3003, pairs))
        (folder / "complete").write_text(f"{time.perf_counter() - started:.1f} s\n")
    return folder


def launch(child, record, processes, tool_args, own=()):
    """Run a child (with `own` flags of this command, then the tool's flags) in fresh processes; return each rank's
    record and the wall seconds from the launch to the end."""
    record.mkdir(parents=True, exist_ok=True)
    launched = time.time()
    flags = ["--child", child, "--record", record, *own, "--launched", repr(launched), "--", *tool_args]
    common.run_child("data-scale", flags, processes)
    return [
        json.loads((record / f"rank{r}.json").read_text()) for r in range(processes)
    ], time.time() - launched


def train_flags(args, data, cache, out, tokenizer=None, langs=("en", "de")):
    flags = [
        "--dataset_name", data, "--source_lang", langs[0], "--target_lang", langs[1], "--preset", args.preset,
        "--vocab_size", args.vocab_size, "--max_tokens", args.max_tokens, "--max_steps", "1",
        "--eval_strategy", "no", "--save_strategy", "no", "--logging_steps", "1", "--output_dir", out,
        "--overwrite_output_dir", "--cache_dir", cache, "--max_tokenizer_samples", args.tokenizer_samples,
        "--dataloader_pin_memory", "false", "--disable_tqdm", "true", "--seed", "1",
    ]  # fmt: skip
    return flags + (["--tokenizer_name", tokenizer] if tokenizer else [])


def rows_of(run, pairs, records, wall, stages=(*STAGES, "to first step")):
    """A row per stage and rank: seconds, peak resident set, peak own memory; `to first step` from the launch."""
    rows = []
    for rank, record in enumerate(records):
        total = {key: record.get(key) for key in ("peak_rss_mib", "peak_anon_mib")}
        entries = {
            **record["stages"],
            "to first step": {"seconds": record.get("to_first_step_s"), "wall_s": wall, **total},
        }
        for stage in stages:
            rows.append({"run": run, "stage": stage, "rank": rank, "pairs": pairs, **entries.get(stage, {})})
    return rows


def data_scale(args):
    """The first run, the rerun from its cache; unless `--quick`, the BPE on every pair and the Multi30k-sized run."""
    work = Path(args.work_dir)
    data = corpus(work, args.pairs)
    runs = work / f"runs-{args.pairs}-{args.processes}p"
    if runs.exists():
        shutil.rmtree(runs)  # a first run starts from nothing
    cache = runs / "datasets-cache"
    first, wall = launch(
        "train", runs / "first", args.processes, train_flags(args, data, cache, runs / "out1")
    )
    flags = train_flags(args, data, cache, runs / "out2", runs / "out1" / "tokenizer")
    again, again_wall = launch("train", runs / "cached", args.processes, flags)
    rows = rows_of("first", args.pairs, first, wall) + rows_of(
        "from the cache", args.pairs, again, again_wall
    )
    result = {"records": {"first": first, "cached": again}, "corpus": str(data)}
    if args.quick:  # the smoke test stops here: the other runs take the same paths
        return {"results": rows, **result}
    flags = [
        "--dataset_name",
        data,
        "--source_lang",
        "en",
        "--target_lang",
        "de",
        "--cache_dir",
        cache,
    ]
    full, wall = launch(
        "bpe",
        runs / "bpe",
        1,
        [*flags, "--vocab_size", args.vocab_size, "--output_dir", runs / "bpe-full"],
    )
    rows += rows_of("every pair", args.pairs, full, wall, ("BPE",))
    multi30k, langs = (
        (common.MULTI30K, ("de", "en"))
        if (common.MULTI30K / "train.de.gz").is_file()
        else (corpus(work, 29_000), ("en", "de"))
    )
    small, wall = launch(
        "train",
        runs / "multi30k",
        args.processes,
        train_flags(args, multi30k, runs / "m30k-cache", runs / "out3", langs=langs),
    )
    rows += rows_of("Multi30k-sized", small[0]["train_pairs"], small, wall)
    for kind in ("rss", "anon"):
        result[f"peak_{kind}_over_multi30k_mib"] = [
            big[f"peak_{kind}_mib"] - ref[f"peak_{kind}_mib"] for big, ref in zip(first, small, strict=True)
        ]
    return {"results": rows, **result}


def main(argv):
    args = parse_args(argv)
    if args.child:
        return {"train": _train_child, "bpe": _bpe_child, "sampler": _sampler_child}[args.child](args)
    if args.sampler_only:
        own = ("--pairs", args.pairs, "--max-tokens", args.max_tokens)
        (record,), wall = launch("sampler", Path(args.work_dir) / f"sampler-{args.pairs}", 1, [], own)
        columns = [
            ("pairs", "pairs", ",d"),
            ("batches", "batches", ",d"),
            ("build_s", "build s", ".3f"),
            ("epoch_arrays_s", "epoch arrays s", ".3f"),
            ("epoch_iterated_s", "epoch iterated s", ".3f"),
            ("rise_mib", "RSS rise MiB", ".0f"),
            ("peak_rss_mib", "peak RSS MiB", ".0f"),
        ]
        return common.report(args, "the sampler alone", [{**record, "wall_s": wall}], columns)
    result = data_scale(args)
    columns = [
        "run",
        "stage",
        ("rank", "rank", "d"),
        ("pairs", "pairs", ",d"),
        ("seconds", "s", ".2f"),
        ("peak_rss_mib", "peak RSS MiB", ".0f"),
        ("peak_anon_mib", "anon MiB", ".0f"),
    ]
    excess = ", ".join(f"{mib:+.0f} MiB" for mib in result.get("peak_rss_over_multi30k_mib", []))
    title = "from raw text to the first step" + (
        f"; peak RSS over the Multi30k-sized run: {excess}" if excess else ""
    )
    return common.report(args, title, result.pop("results"), columns, **result)
