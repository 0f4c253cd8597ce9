"""Parallel text for translation, through 🤗 `datasets`.

`load_parallel_dataset` turns any of the usual shapes of a parallel corpus into one: a `DatasetDict` whose
splits each have exactly two string columns named by language code, source first (e.g. `de`, `en`).
`tokenize_dataset` then encodes it for the model and drops unusable training pairs.

Sources understood:

- a directory of line-aligned text files `{split}.{lang}` or `{split}.{lang}.gz` (the layout of the
  Multi30k repository: `train.de.gz`, `val.de.gz`, `test_2016_flickr.de.gz`, ...);
- a JSON-lines file (one split, called "train") or a directory of `{split}.jsonl` / `.json` files (`.gz`
  allowed), with either a `translation` column of `{lang: text}` dicts or one column per language;
- a directory written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`, in either shape;
- a Hub dataset id, in either shape: `wmt14` (config `de-en`, a `translation` column) or
  `bentrevett/multi30k` (columns `de` and `en`).

`splits` picks and renames splits: `None` keeps every split found, a list keeps those names, and a mapping
`{name_wanted: name_in_source}` renames, e.g. `{"train": "train", "validation": "val", "test":
"test_2016_flickr"}` for Multi30k.
"""

import gzip
import logging
from collections.abc import Mapping
from functools import partial
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, DatasetDict
from datasets.fingerprint import Hasher
from tokenizers import Tokenizer

from .batching import LENGTH_COLUMN

logger = logging.getLogger(__name__)


_JSON_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz")
_SAVED_DATASET_MARKERS = ("dataset_dict.json", "state.json")
# What `tokenize_dataset` writes: token ids as int32 lists, and the longer side's length for the batch sampler.
_ENCODED_FEATURES = datasets.Features(
    {
        "input_ids": datasets.Sequence(datasets.Value("int32")),
        "labels": datasets.Sequence(datasets.Value("int32")),
        LENGTH_COLUMN: datasets.Value("int32"),
    }
)
_IDS = pa.list_(pa.int32())


def read_lines(path):
    """Yield the lines of a UTF-8 text file (`.gz` decompressed on the fly) without their line ending.

    Only "\\n" ends a line, as for `wc -l` and the Moses scripts, and a trailing "\\r" is dropped. Unicode
    separators such as U+2028 or U+0085 stay inside their line (`str.splitlines` would split there and shift
    every later line of a parallel file).

    Raises `ValueError` naming the file and line of text that is not UTF-8, or of a truncated `.gz` file.
    """
    path = Path(path)
    number = 0
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise ValueError(
                        f"{path}, line {number}: not UTF-8 text ({error.reason} at byte {error.start} of the line)"
                    ) from None
                yield line.rstrip("\r\n")
    except (EOFError, gzip.BadGzipFile) as error:
        raise ValueError(f"{path}: corrupt or truncated gzip file after line {number} ({error})") from None


def count_lines(path):
    """Number of lines `read_lines` yields for `path` (which checks that they are UTF-8)."""
    return sum(1 for _ in read_lines(path))


def _generate_pairs(paths, langs):
    for pair in zip(*map(read_lines, paths), strict=True):
        yield dict(zip(langs, pair, strict=True))


def _find_text_file(directory, split, lang):
    candidates = [directory / f"{split}.{lang}", directory / f"{split}.{lang}.gz"]
    found = [path for path in candidates if path.is_file()]
    if not found:
        raise FileNotFoundError(
            f"No {lang!r} text for split {split!r}: neither {candidates[0]} nor {candidates[1]} exists"
        )
    if len(found) > 1:
        raise ValueError(f"Both {found[0]} and {found[1]} exist for split {split!r}: keep only one")
    return found[0]


def _text_splits(directory, langs):
    """Split names of the files `{split}.{lang}[.gz]` in `directory`, for any of `langs`."""
    names = [path.name.removesuffix(".gz") for path in directory.iterdir() if path.is_file()]
    return sorted(
        {
            name[: -len(lang) - 1]
            for name in names
            for lang in langs
            if name.endswith(f".{lang}") and len(name) > len(lang) + 1
        }
    )


def _load_text_split(paths, langs, cache_dir):
    """The line-aligned text files `paths` (source, target) as a `Dataset` with the columns `langs`."""
    (src_path, tgt_path), (n_src, n_tgt) = paths, map(count_lines, paths)
    if n_src == n_tgt == 0:
        raise ValueError(f"{src_path} and {tgt_path} are empty: no sentence pairs to load")
    if n_src != n_tgt:
        raise ValueError(
            f"Misaligned parallel files: {src_path} has {n_src} lines but {tgt_path} has {n_tgt}"
        )
    # Cached as Arrow under `cache_dir`, keyed by the files' paths, sizes and modification times, so later
    # `map` calls are cached too and an edited file is read again.
    stats = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in paths]
    return Dataset.from_generator(
        _generate_pairs,
        features=datasets.Features(dict.fromkeys(langs, datasets.Value("string"))),
        gen_kwargs={"paths": tuple(map(str, paths)), "langs": langs},
        cache_dir=cache_dir,
        fingerprint=Hasher.hash([stats, langs]),
    )


def _split_mapping(splits, available):
    """`{name_wanted: name_in_source}` from the `splits` argument."""
    if isinstance(splits, str):
        raise TypeError(f"splits must be a list or a mapping of split names, not the string {splits!r}")
    if isinstance(splits, Mapping):
        return dict(splits)
    return {name: name for name in (available if splits is None else splits)}


def _json_files(directory):
    """`{split: file}` of the JSON-lines files in `directory` (a name ends in at most one of the suffixes)."""
    return {
        path.name.removesuffix(suffix): path
        for path in sorted(directory.iterdir())
        for suffix in _JSON_SUFFIXES
        if path.is_file() and path.name.endswith(suffix)
    }


def _to_language_columns(ds, langs, origin):
    """Reduce either dataset shape to the two columns `langs`."""
    if "translation" in ds.column_names and not set(langs) <= set(ds.column_names):
        flat = ds.select_columns(["translation"]).flatten()  # a column "translation.{lang}" per language
        languages = [name.removeprefix("translation.") for name in flat.column_names if name != "translation"]
        if missing := [lang for lang in langs if lang not in languages]:
            raise ValueError(
                f"{origin}: no language {missing} in its 'translation' column (it has {languages})"
            )
        ds = flat.rename_columns({f"translation.{lang}": lang for lang in languages})
    if missing := [lang for lang in langs if lang not in ds.column_names]:
        raise ValueError(
            f"{origin}: no column for language {missing} (columns: {ds.column_names}); expected a 'translation' "
            "column of {language: text} dicts or one column per language"
        )
    return ds.select_columns(list(langs))


def _select_and_normalize(dataset, splits, langs, origin):
    mapping = _split_mapping(splits, list(dataset))
    if missing := [name for name in mapping.values() if name not in dataset]:
        raise ValueError(f"{origin} has no split {missing} (it has {list(dataset)})")
    return DatasetDict(
        {
            wanted: _to_language_columns(dataset[name], langs, f"{origin} [{name}]")
            for wanted, name in mapping.items()
        }
    )


def _load_text_directory(directory, langs, splits, cache_dir):
    result = DatasetDict()
    for wanted, name in _split_mapping(splits, _text_splits(directory, langs)).items():
        paths = [_find_text_file(directory, name, lang) for lang in langs]
        result[wanted] = _load_text_split(paths, langs, cache_dir)
        logger.info("Loaded %d pairs for split %r from %s and %s", len(result[wanted]), wanted, *paths)
    return result


def _load_json(path, langs, splits, cache_dir):
    files = {"train": path} if path.is_file() else _json_files(path)
    mapping = _split_mapping(splits, list(files))
    missing = [name for name in mapping.values() if name not in files]
    if missing and path.is_file():
        raise ValueError(
            f"{path} is a single JSON-lines file, loaded as the split 'train'; it has no split {missing}"
        )
    if missing:
        expected = " or ".join(str(path / f"{missing[0]}{suffix}") for suffix in _JSON_SUFFIXES)
        raise FileNotFoundError(
            f"No JSON-lines file for split {missing[0]!r}: expected {expected} (found {files})"
        )
    return DatasetDict(
        {wanted: _load_json_file(files[name], langs, cache_dir) for wanted, name in mapping.items()}
    )


def _load_json_file(file, langs, cache_dir):
    if not any(line.strip() for line in read_lines(file)):  # also checks that it is UTF-8
        raise ValueError(f"{file} is empty: no sentence pairs to load")
    loaded = datasets.load_dataset("json", data_files={"data": str(file)}, cache_dir=cache_dir)["data"]
    return _to_language_columns(loaded, langs, str(file))


def load_parallel_dataset(
    source,
    src_lang,
    tgt_lang,
    splits=None,
    *,
    config_name=None,
    cache_dir=None,
):
    """Load a parallel corpus as a `DatasetDict` with two string columns, `src_lang` then `tgt_lang`.

    Args:
        source: a directory of `{split}.{lang}[.gz]` text files, a JSON-lines file or directory, a directory
            saved with `save_to_disk`, or a Hub dataset id (see the module docstring).
        src_lang, tgt_lang: language codes, e.g. "de" and "en"; they name the file suffixes, the keys of a
            `translation` column or the per-language columns, and the columns of the result.
        splits: `None` for every split, a list of names, or `{name_wanted: name_in_source}`.
        config_name: the Hub dataset configuration (`"de-en"` for `wmt14`); Hub only.
        cache_dir: where `datasets` keeps its Arrow cache (its default if `None`).

    Raises:
        FileNotFoundError: a local path that does not exist, or a split or language without its file; the
            message names the file(s) looked for.
        ValueError: text files of one split with different line counts (naming both files), or a split or
            language that a dataset lacks.
    """
    path, origin, langs = Path(source), str(source), (src_lang, tgt_lang)
    if path.is_file():
        if not path.name.endswith(_JSON_SUFFIXES):
            raise ValueError(f"{path}: a single file must be JSON lines ({', '.join(_JSON_SUFFIXES)})")
        return _load_json(path, langs, splits, cache_dir)
    if path.is_dir():
        if any((path / marker).is_file() for marker in _SAVED_DATASET_MARKERS):
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, Dataset):
                loaded = DatasetDict({"train": loaded})
            return _select_and_normalize(loaded, splits, langs, origin)
        if _text_splits(path, langs):
            return _load_text_directory(path, langs, splits, cache_dir)
        if _json_files(path):
            return _load_json(path, langs, splits, cache_dir)
        raise FileNotFoundError(
            f"{path} holds no parallel data for {src_lang}-{tgt_lang}: expected text files such as "
            f"{path / f'train.{src_lang}'}[.gz] and {path / f'train.{tgt_lang}'}[.gz], JSON-lines files "
            f"({', '.join(_JSON_SUFFIXES)}) or a dataset saved with save_to_disk"
        )
    # Hub ids are "name" or "owner/name": anything else that does not exist is a mistyped local path.
    if path.is_absolute() or origin.startswith(".") or origin.count("/") > 1:
        raise FileNotFoundError(f"No such file or directory: {origin}")
    loaded = datasets.load_dataset(origin, name=config_name, cache_dir=cache_dir)
    dataset = _select_and_normalize(loaded, splits, langs, origin)
    if empty := [split for split, ds in dataset.items() if len(ds) == 0]:
        raise ValueError(f"{origin}: split {empty[0]!r} holds no sentence pairs")
    return dataset


def parallel_file_paths(path, src_lang, tgt_lang):
    """The file(s) behind `load_parallel_file(path, ...)`: the JSON-lines file itself, or the text files
    `{path}.{src_lang}[.gz]` and `{path}.{tgt_lang}[.gz]`. Raises `FileNotFoundError` naming what was looked for."""
    path = Path(path)
    if path.name.endswith(_JSON_SUFFIXES):
        if not path.is_file():
            raise FileNotFoundError(f"No such JSON-lines file: {path}")
        return [path]
    return [_find_text_file(path.parent, path.name, lang) for lang in (src_lang, tgt_lang)]


def load_parallel_file(path, src_lang, tgt_lang, cache_dir=None):
    """One split from files, as `run_translation.py --train_file` takes it: a JSON-lines file (`.jsonl`, `.json`,
    `.gz` allowed; a `translation` column or one column per language), or a prefix `PREFIX` of the line-aligned text
    files `PREFIX.{src_lang}` and `PREFIX.{tgt_lang}` (`.gz` allowed), fairseq's `--trainpref` convention."""
    files, langs = parallel_file_paths(path, src_lang, tgt_lang), (src_lang, tgt_lang)
    if len(files) == 1:
        return _load_json_file(files[0], langs, cache_dir)
    split = _load_text_split(files, langs, cache_dir)
    logger.info("Loaded %d pairs from %s and %s", len(split), *files)
    return split


def iter_text(dataset, columns, batch_size=1000):
    """Yield batches of sentences from `columns` of `dataset`, e.g. both languages to train a joint BPE."""
    for batch in dataset.iter(batch_size=batch_size):
        for column in columns:
            yield batch[column]


def sample_pairs(dataset, max_samples, seed=0):
    """`max_samples` pairs of `dataset` drawn uniformly at random without replacement by a generator seeded with
    `seed`, in their order in the corpus (the same sample on every run and rank); the whole dataset when `max_samples`
    is None or not smaller than it. To train a BPE vocabulary on a sample of a WMT-sized corpus."""
    if max_samples is None or max_samples >= len(dataset):
        return dataset
    return dataset.select(
        np.sort(np.random.default_rng(seed).choice(len(dataset), max_samples, replace=False))
    )


def _encoder(tok):
    """`texts -> tok(texts, truncation=False)["input_ids"]`, through the Rust tokenizer behind `tok` where it has one,
    set as that call sets it (special tokens added, neither truncation nor padding, special tokens split or not as
    `tok.split_special_tokens` says), as a copy so that `tok` is left as it is; else (a Python "slow" tokenizer)
    through `tok` itself (not called on a batch whose every pair was dropped)."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        return lambda texts: tok(texts, truncation=False)["input_ids"] if texts else []
    encoder = Tokenizer.from_str(backend.to_str())
    encoder.no_truncation()
    encoder.no_padding()
    encoder.encode_special_tokens = tok.split_special_tokens
    return lambda texts: [
        encoding.ids for encoding in encoder.encode_batch_fast(texts, add_special_tokens=True)
    ]


def _encode_pairs(batch, encoders, langs, limits, split):
    """One batch of `tokenize_dataset`'s single pass: both sides (`langs`) encoded as int32 lists, and with `limits`
    (the maximum source and target lengths) the unusable pairs dropped (an empty side, a side too long), so the batch
    may shrink."""
    texts = [batch.column(lang).to_pylist() for lang in langs]
    for lang, side in zip(langs, texts, strict=True):
        if limits is None and None in side:
            raise ValueError(f"{split}: pair {side.index(None)} of a batch has no {lang} text (null)")
    if limits is not None:  # `bool(s.strip())` without the copies; a null side is an empty one
        pairs = [
            (s, t) for s, t in zip(*texts, strict=True) if s and t and not s.isspace() and not t.isspace()
        ]
        texts = [[s for s, _ in pairs], [t for _, t in pairs]]
    ids = [pa.array(encode(side), _IDS) for encode, side in zip(encoders, texts, strict=True)]
    lengths = [pc.list_value_length(side) for side in ids]
    encoded = pa.table({"input_ids": ids[0], "labels": ids[1], LENGTH_COLUMN: pc.max_element_wise(*lengths)})
    if limits is None:
        return encoded
    return encoded.filter(pc.and_(*map(pc.less_equal, lengths, limits)))


def _encoding_fingerprint(ds, toks, langs, limits):
    """A cache key for `_encode_pairs` from what decides its output: the input rows, both tokenizers' JSON, and the
    filter's limits (None: no filter). The main process's cache file is the one every other rank and every rerun maps.

    `datasets` would otherwise hash the tokenizer objects, whose state (e.g. `name_or_path`) differs between
    a freshly trained and a reloaded tokenizer, so every run would tokenize again.
    """
    backends = [tok.backend_tokenizer.to_str() if hasattr(tok, "backend_tokenizer") else tok for tok in toks]
    return Hasher.hash([ds._fingerprint, langs, limits, backends, "encode-v3"])


def tokenize_dataset(
    dataset, src_tok, tgt_tok, src_lang, tgt_lang, max_length=256, max_target_length=None, num_proc=None
):
    """Encode every split for the model and drop unusable pairs from the training split.

    Each example gets `input_ids` (source, ending in `</s>`), `labels` (target, ending in `</s>`; the model prepends
    `<s>` when shifting right), both int32 lists, and `length`, the longer side's token count, which the token-budget
    sampler reads (`batching.example_lengths`) without turning token lists into Python objects. No other column
    remains, and there is no `attention_mask` column: `DataCollatorForSeq2Seq` makes it when it pads. Nothing is
    truncated and nothing is padded: the collator pads per batch, labels with -100. The ids are those of
    `src_tok(texts)["input_ids"]`; the Rust tokenizer is called directly, with both sides in one `Dataset.map` pass.

    In the "train" split, a pair is dropped when either side is empty or whitespace, or when the source has more than
    `max_length` tokens or the target more than `max_target_length` (default: `max_length`), `</s>` included. The
    other splits are kept whole, so that validation and test BLEU stay comparable with published numbers; a null
    text there raises `ValueError` naming the split and the language.

    Datasets backed by Arrow files (every loader of this module) are tokenized once: the result is cached beside
    them under a key of the rows, the tokenizers and these settings, so a rerun, and every other process of a
    distributed run, memory-maps the file the first one wrote.

    Args:
        dataset: splits with `src_lang` and `tgt_lang` text columns (from `load_parallel_dataset`).
        src_tok, tgt_tok: the tokenizers of each side; pass the same one twice for a joint vocabulary.
        num_proc: passed to `Dataset.map`.

    Returns:
        The tokenized `DatasetDict` and `{split: number of pairs dropped}`.
    """
    toks, langs = (src_tok, tgt_tok), (src_lang, tgt_lang)
    encoders = tuple(map(_encoder, toks))
    result = DatasetDict()
    for split, ds in dataset.items():
        limits = (max_length, max_target_length or max_length) if split == "train" else None
        result[split] = (
            ds.with_format("arrow")
            .map(
                partial(_encode_pairs, encoders=encoders, langs=langs, limits=limits, split=split),
                batched=True,
                batch_size=10_000,
                num_proc=num_proc,
                remove_columns=ds.column_names,
                features=_ENCODED_FEATURES,
                new_fingerprint=_encoding_fingerprint(ds, toks, langs, limits),
                desc=f"Tokenizing {split}" + (" and dropping unusable pairs" if limits else ""),
            )
            .with_format(None)
        )
        if limits is not None:
            logger.info(
                "%s: dropped %d of %d pairs (an empty side, or over %d source or %d target tokens)",
                split,
                len(ds) - len(result[split]),
                len(ds),
                *limits,
            )
    return result, {split: len(dataset[split]) - len(result[split]) for split in dataset}
