"""A synthetic parallel corpus shaped like WMT 2014 English-German, of any size, for the data-scale benchmark and the
tests that need a corpus larger than Multi30k.

WMT 2014 en-de has 4.5M training pairs of about 23-27 words a side (newstest2013/2014: 3000/3003 pairs). Here:

- a source vocabulary of `--vocab` pseudo-words (syllables joined, so that BPE has subwords to find), drawn with
  Zipfian frequencies (exponent 1.1, as word frequencies in news text roughly are);
- sentence lengths log-normal with a median of 22 words (mean about 26), from 1 to 150 words;
- each target sentence a "translation" of its source: every word mapped to its own target pseudo-word, neighbouring
  words swapped with probability 0.15, one word in twenty dropped and one in twenty added, so a model can learn the
  mapping and the two sides differ in length as real pairs do;
- files as the recipe reads a local corpus: `{split}.en` and `{split}.de`, one sentence a line.

The same seed gives the same corpus. About 3 minutes and 1.2 GB of text for 4.5M pairs on one core.

    python -m bench corpus --pairs 4500000 --output-dir /tmp/wmt14-shaped
"""

import argparse
import time
from pathlib import Path

import numpy as np

SYLLABLES = [c + v for c in "bdfgklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ei", "au", "ie")]
PUNCTUATION = np.array([".", ".", ".", "?", "!"])


def pseudo_words(count, rng):
    """`count` distinct pseudo-words of 1-4 syllables, the short ones first (they get the high frequencies)."""
    words, seen = [], set()
    while len(words) < count:
        size = min(
            4, 1 + len(words) // max(1, count // 8)
        )  # frequent words are short, as in natural languages
        word = "".join(rng.choice(SYLLABLES, size=size + int(rng.integers(0, 2))))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return np.array(words)


class Corpus:
    """Draws pairs of sentences; `pairs(n)` returns two lists of `n` lines."""

    def __init__(self, vocab, seed):
        self.rng = np.random.default_rng(seed)
        self.source_words = pseudo_words(vocab, self.rng)
        self.target_words = pseudo_words(vocab, np.random.default_rng(seed + 1))
        ranks = np.arange(1, vocab + 1, dtype=np.float64)
        weights = ranks**-1.1
        self.cumulative = np.cumsum(weights / weights.sum())

    def zipfian(self, count):
        """`count` word ids drawn with Zipfian frequencies."""
        return np.minimum(np.searchsorted(self.cumulative, self.rng.random(count)), len(self.cumulative) - 1)

    def pairs(self, n):
        rng = self.rng
        lengths = np.clip(np.round(rng.lognormal(np.log(22.0), 0.55, n)), 1, 150).astype(np.int64)
        words = self.zipfian(int(lengths.sum()))
        ends = np.cumsum(lengths)
        sources, targets = [], []
        swap = rng.random(len(words)) < 0.15
        drop = rng.random(len(words)) < 0.05
        add = rng.random(len(words)) < 0.05
        extra = self.zipfian(len(words))
        stops = PUNCTUATION[rng.integers(0, len(PUNCTUATION), n)]
        start = 0
        for i, end in enumerate(ends):
            ids = words[start:end]
            sources.append(" ".join(self.source_words[ids]).capitalize() + stops[i])
            target = ids.copy()
            for j in range(0, len(target) - 1, 2):  # local reordering
                if swap[start + j]:
                    target[j], target[j + 1] = target[j + 1], target[j]
            kept = [
                self.target_words[t] for j, t in enumerate(target) if not drop[start + j] or len(target) == 1
            ]
            kept += [self.target_words[extra[start + j]] for j in range(len(target)) if add[start + j]]
            targets.append(" ".join(kept).capitalize() + stops[i])
            start = end
        return sources, targets


def write_corpus(
    output_dir,
    pairs,
    src="en",
    tgt="de",
    validation=3000,
    test=3003,
    vocab=50000,
    seed=0,
):
    """Write the train, validation ("val") and test splits of a synthetic corpus into `output_dir`, 100,000 pairs at
    a time."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    corpus = Corpus(vocab, seed)
    for split, count in (("train", pairs), ("val", validation), ("test", test)):
        with open(output_dir / f"{split}.{src}", "w") as fs, open(output_dir / f"{split}.{tgt}", "w") as ft:
            for begin in range(0, count, 100_000):
                sources, targets = corpus.pairs(min(100_000, count - begin))
                fs.write("\n".join(sources) + "\n")
                ft.write("\n".join(targets) + "\n")
    return output_dir


def main(argv):
    parser = argparse.ArgumentParser(
        "python -m bench corpus", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=4_500_000, help="training pairs (WMT14 en-de: 4.5M)")
    parser.add_argument("--validation", type=int, default=3000, help="validation pairs (newstest2013: 3000)")
    parser.add_argument("--test", type=int, default=3003, help="test pairs (newstest2014: 3003)")
    parser.add_argument("--output-dir", required=True)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    out = write_corpus(args.output_dir, args.pairs, validation=args.validation, test=args.test)
    print(f"{args.pairs} training pairs in {out} ({time.perf_counter() - started:.1f} s)")
    return out
