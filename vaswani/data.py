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

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import datasets
from datasets import Dataset, DatasetDict

logger = logging.getLogger(__name__)

Splits = Sequence[str] | Mapping[str, str] | None

_JSON_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz")
_SAVED_DATASET_MARKERS = ("dataset_dict.json", "state.json")


def _open_binary(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def read_lines(path: str | os.PathLike) -> Iterator[str]:
    """Yield the lines of a UTF-8 text file (`.gz` decompressed on the fly) without their line ending.

    Only "\\n" ends a line, as for `wc -l` and the Moses scripts, and a trailing "\\r" is dropped. Unicode
    separators such as U+2028 or U+0085 stay inside their line (`str.splitlines` would split there and shift
    every later line of a parallel file).

    Raises `ValueError` naming the file and line of text that is not UTF-8, or of a truncated `.gz` file.
    """
    path = Path(path)
    number = 0
    try:
        with _open_binary(path) as f:
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


def count_lines(path: str | os.PathLike) -> int:
    """Number of lines `read_lines` yields for `path` (which checks that they are UTF-8)."""
    return sum(1 for _ in read_lines(path))


def _generate_pairs(src_path: str, tgt_path: str, src_lang: str, tgt_lang: str) -> Iterator[dict[str, str]]:
    for src, tgt in zip(read_lines(src_path), read_lines(tgt_path), strict=True):
        yield {src_lang: src, tgt_lang: tgt}


def _find_text_file(directory: Path, split: str, lang: str) -> Path:
    candidates = [directory / f"{split}.{lang}", directory / f"{split}.{lang}.gz"]
    found = [path for path in candidates if path.is_file()]
    if not found:
        raise FileNotFoundError(
            f"No {lang!r} text for split {split!r}: neither {candidates[0]} nor {candidates[1]} exists"
        )
    if len(found) > 1:
        raise ValueError(f"Both {found[0]} and {found[1]} exist for split {split!r}: keep only one")
    return found[0]


def _text_splits(directory: Path, langs: Sequence[str]) -> list[str]:
    """Split names of the files `{split}.{lang}[.gz]` in `directory`, for any of `langs`."""
    splits = set()
    for path in directory.iterdir():
        name = path.name.removesuffix(".gz")
        for lang in langs:
            if path.is_file() and name.endswith(f".{lang}") and len(name) > len(lang) + 1:
                splits.add(name[: -len(lang) - 1])
    return sorted(splits)


def _load_text_split(
    src_path: Path, tgt_path: Path, src_lang: str, tgt_lang: str, cache_dir: str | None
) -> Dataset:
    n_src, n_tgt = count_lines(src_path), count_lines(tgt_path)
    if n_src == n_tgt == 0:
        raise ValueError(f"{src_path} and {tgt_path} are empty: no sentence pairs to load")
    if n_src != n_tgt:
        raise ValueError(
            f"Misaligned parallel files: {src_path} has {n_src} lines but {tgt_path} has {n_tgt}"
        )
    # Cached as Arrow under `cache_dir`, keyed by the files' paths, sizes and modification times, so later
    # `map` calls are cached too and an edited file is read again.
    stats = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in (src_path, tgt_path)]
    fingerprint = hashlib.sha256(json.dumps([stats, src_lang, tgt_lang]).encode()).hexdigest()[:32]
    return Dataset.from_generator(
        _generate_pairs,
        features=datasets.Features({src_lang: datasets.Value("string"), tgt_lang: datasets.Value("string")}),
        gen_kwargs={
            "src_path": str(src_path),
            "tgt_path": str(tgt_path),
            "src_lang": src_lang,
            "tgt_lang": tgt_lang,
        },
        cache_dir=cache_dir,
        fingerprint=fingerprint,
    )


def _split_mapping(splits: Splits, available: Sequence[str]) -> dict[str, str]:
    """`{name_wanted: name_in_source}` from the `splits` argument."""
    if splits is None:
        return {name: name for name in available}
    if isinstance(splits, str):
        raise TypeError(f"splits must be a list or a mapping of split names, not the string {splits!r}")
    if isinstance(splits, Mapping):
        return dict(splits)
    return {name: name for name in splits}


def _json_files(directory: Path) -> dict[str, Path]:
    files = {}
    for path in sorted(directory.iterdir()):
        for suffix in _JSON_SUFFIXES:
            if path.is_file() and path.name.endswith(suffix):
                files[path.name.removesuffix(suffix)] = path
                break
    return files


def _to_language_columns(ds: Dataset, src_lang: str, tgt_lang: str, origin: str) -> Dataset:
    """Reduce either dataset shape to the two columns `[src_lang, tgt_lang]`."""
    if "translation" in ds.column_names and not {src_lang, tgt_lang} <= set(ds.column_names):
        feature = ds.features["translation"]
        if isinstance(feature, datasets.Translation):
            languages = feature.languages
        else:
            languages = list(feature) if isinstance(feature, dict) else []
        missing = [lang for lang in (src_lang, tgt_lang) if lang not in languages]
        if missing:
            raise ValueError(
                f"{origin}: no language {missing} in its 'translation' column (it has {languages})"
            )
        flat = ds.select_columns(["translation"]).flatten()
        return flat.select_columns([f"translation.{src_lang}", f"translation.{tgt_lang}"]).rename_columns(
            {f"translation.{src_lang}": src_lang, f"translation.{tgt_lang}": tgt_lang}
        )
    missing = [lang for lang in (src_lang, tgt_lang) if lang not in ds.column_names]
    if missing:
        raise ValueError(
            f"{origin}: no column for language {missing} (columns: {ds.column_names}); expected a 'translation' "
            "column of {language: text} dicts or one column per language"
        )
    return ds.select_columns([src_lang, tgt_lang])


def _select_and_normalize(
    dataset: DatasetDict, splits: Splits, src_lang: str, tgt_lang: str, origin: str
) -> DatasetDict:
    mapping = _split_mapping(splits, list(dataset))
    missing = [name for name in mapping.values() if name not in dataset]
    if missing:
        raise ValueError(f"{origin} has no split {missing} (it has {list(dataset)})")
    return DatasetDict(
        {
            wanted: _to_language_columns(dataset[name], src_lang, tgt_lang, f"{origin} [{name}]")
            for wanted, name in mapping.items()
        }
    )


def _load_text_directory(
    directory: Path, src_lang: str, tgt_lang: str, splits: Splits, cache_dir: str | None
) -> DatasetDict:
    mapping = _split_mapping(splits, _text_splits(directory, [src_lang, tgt_lang]))
    result = {}
    for wanted, name in mapping.items():
        src_path = _find_text_file(directory, name, src_lang)
        tgt_path = _find_text_file(directory, name, tgt_lang)
        result[wanted] = _load_text_split(src_path, tgt_path, src_lang, tgt_lang, cache_dir)
        logger.info(
            "Loaded %d pairs for split %r from %s and %s", len(result[wanted]), wanted, src_path, tgt_path
        )
    return DatasetDict(result)


def _load_json(
    path: Path, src_lang: str, tgt_lang: str, splits: Splits, cache_dir: str | None
) -> DatasetDict:
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
    dataset = DatasetDict()
    for wanted, name in mapping.items():
        if not any(line.strip() for line in read_lines(files[name])):  # also checks that it is UTF-8
            raise ValueError(f"{files[name]} is empty: no sentence pairs to load")
        loaded = datasets.load_dataset("json", data_files={"data": str(files[name])}, cache_dir=cache_dir)
        dataset[wanted] = _to_language_columns(loaded["data"], src_lang, tgt_lang, str(files[name]))
    return dataset


def load_parallel_dataset(
    source: str | os.PathLike,
    src_lang: str,
    tgt_lang: str,
    splits: Splits = None,
    *,
    config_name: str | None = None,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> DatasetDict:
    """Load a parallel corpus as a `DatasetDict` with two string columns, `src_lang` then `tgt_lang`.

    Args:
        source: a directory of `{split}.{lang}[.gz]` text files, a JSON-lines file or directory, a directory
            saved with `save_to_disk`, or a Hub dataset id (see the module docstring).
        src_lang, tgt_lang: language codes, e.g. "de" and "en"; they name the file suffixes, the keys of a
            `translation` column or the per-language columns, and the columns of the result.
        splits: `None` for every split, a list of names, or `{name_wanted: name_in_source}`.
        config_name: the Hub dataset configuration (`"de-en"` for `wmt14`); Hub only.
        revision: the Hub dataset revision; Hub only.
        cache_dir: where `datasets` keeps its Arrow cache (its default if `None`).

    Raises:
        FileNotFoundError: a local path that does not exist, or a split or language without its file; the
            message names the file(s) looked for.
        ValueError: text files of one split with different line counts (naming both files), or a split or
            language that a dataset lacks.
    """
    cache_dir = None if cache_dir is None else str(cache_dir)
    path = Path(source)
    origin = str(source)
    if path.is_file():
        if not path.name.endswith(_JSON_SUFFIXES):
            raise ValueError(f"{path}: a single file must be JSON lines ({', '.join(_JSON_SUFFIXES)})")
        return _load_json(path, src_lang, tgt_lang, splits, cache_dir)
    if path.is_dir():
        if any((path / marker).is_file() for marker in _SAVED_DATASET_MARKERS):
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, Dataset):
                loaded = DatasetDict({"train": loaded})
            return _select_and_normalize(loaded, splits, src_lang, tgt_lang, origin)
        if _text_splits(path, [src_lang, tgt_lang]):
            return _load_text_directory(path, src_lang, tgt_lang, splits, cache_dir)
        if _json_files(path):
            return _load_json(path, src_lang, tgt_lang, splits, cache_dir)
        raise FileNotFoundError(
            f"{path} holds no parallel data for {src_lang}-{tgt_lang}: expected text files such as "
            f"{path / f'train.{src_lang}'}[.gz] and {path / f'train.{tgt_lang}'}[.gz], JSON-lines files "
            f"({', '.join(_JSON_SUFFIXES)}) or a dataset saved with save_to_disk"
        )
    # Hub ids are "name" or "owner/name": anything else that does not exist is a mistyped local path.
    if path.is_absolute() or origin.startswith(".") or origin.count("/") > 1:
        raise FileNotFoundError(f"No such file or directory: {origin}")
    loaded = datasets.load_dataset(origin, name=config_name, revision=revision, cache_dir=cache_dir)
    return _check_not_empty(_select_and_normalize(loaded, splits, src_lang, tgt_lang, origin), origin)


def _check_not_empty(dataset: DatasetDict, origin: str) -> DatasetDict:
    for split, ds in dataset.items():
        if len(ds) == 0:
            raise ValueError(f"{origin}: split {split!r} holds no sentence pairs")
    return dataset


def parallel_file_paths(path: str | os.PathLike, src_lang: str, tgt_lang: str) -> list[Path]:
    """The file(s) behind `load_parallel_file(path, ...)`: the JSON-lines file itself, or the text files
    `{path}.{src_lang}[.gz]` and `{path}.{tgt_lang}[.gz]`. Raises `FileNotFoundError` naming what was looked for."""
    path = Path(path)
    if path.name.endswith(_JSON_SUFFIXES):
        if not path.is_file():
            raise FileNotFoundError(f"No such JSON-lines file: {path}")
        return [path]
    return [_find_text_file(path.parent, path.name, lang) for lang in (src_lang, tgt_lang)]


def load_parallel_file(
    path: str | os.PathLike, src_lang: str, tgt_lang: str, cache_dir: str | os.PathLike | None = None
) -> Dataset:
    """One split from files, as `run_translation.py --train_file` takes it: a JSON-lines file (`.jsonl`, `.json`,
    `.gz` allowed; a `translation` column or one column per language), or a prefix `PREFIX` of the line-aligned text
    files `PREFIX.{src_lang}` and `PREFIX.{tgt_lang}` (`.gz` allowed), fairseq's `--trainpref` convention."""
    files = parallel_file_paths(path, src_lang, tgt_lang)
    cache_dir = None if cache_dir is None else str(cache_dir)
    if len(files) == 1:
        return _load_json(files[0], src_lang, tgt_lang, ["train"], cache_dir)["train"]
    source, target = files
    split = _load_text_split(source, target, src_lang, tgt_lang, cache_dir)
    logger.info("Loaded %d pairs from %s and %s", len(split), source, target)
    return split


def iter_text(dataset: Dataset, columns: Sequence[str], batch_size: int = 1000) -> Iterator[list[str]]:
    """Yield batches of sentences from `columns` of `dataset`, e.g. both languages to train a joint BPE."""
    for batch in dataset.iter(batch_size=batch_size):
        for column in columns:
            yield batch[column]


def _encoding_fingerprint(
    ds: Dataset, src_tok, tgt_tok, src_lang: str, tgt_lang: str, keep_text: bool
) -> str:
    """A cache key for `_encode_batch` from what decides its output: the input rows and both tokenizers' JSON.

    `datasets` would otherwise hash the tokenizer objects, whose state (e.g. `name_or_path`) differs between
    a freshly trained and a reloaded tokenizer, so every run would tokenize again.
    """
    digest = hashlib.sha256()
    for part in (ds._fingerprint, src_lang, tgt_lang, str(keep_text), "encode-v1"):
        digest.update(part.encode())
    for tok in (src_tok, tgt_tok):
        digest.update(tok.backend_tokenizer.to_str().encode())
    return digest.hexdigest()[:32]


def _encode_batch(batch, src_tok, tgt_tok, src_lang: str, tgt_lang: str):
    encoded = src_tok(batch[src_lang], truncation=False)
    return {
        "input_ids": encoded["input_ids"],
        "attention_mask": encoded["attention_mask"],
        "labels": tgt_tok(batch[tgt_lang], truncation=False)["input_ids"],
    }


def _both_sides_non_empty(batch, src_lang: str, tgt_lang: str) -> list[bool]:
    return [
        bool(s.strip()) and bool(t.strip()) for s, t in zip(batch[src_lang], batch[tgt_lang], strict=True)
    ]


def _both_sides_fit(batch, max_length: int, max_target_length: int) -> list[bool]:
    return [
        len(src) <= max_length and len(tgt) <= max_target_length
        for src, tgt in zip(batch["input_ids"], batch["labels"], strict=True)
    ]


def tokenize_dataset(
    dataset: DatasetDict,
    src_tok,
    tgt_tok,
    src_lang: str,
    tgt_lang: str,
    max_length: int = 256,
    filter_splits: Sequence[str] | None = ("train",),
    max_target_length: int | None = None,
    keep_text: bool = False,
    num_proc: int | None = None,
    batch_size: int = 1000,
) -> tuple[DatasetDict, dict[str, int]]:
    """Encode every split for the model and drop unusable pairs from the splits in `filter_splits`.

    Each example gets `input_ids` and `attention_mask` (source, ending in `</s>`) and `labels` (target,
    ending in `</s>`; the model prepends `<s>` when shifting right). Nothing is truncated and nothing is
    padded: `DataCollatorForSeq2Seq` pads per batch, labels with -100.

    In the splits named by `filter_splits` (`None`: all), a pair is dropped when either side is empty or
    whitespace, or when the source has more than `max_length` tokens or the target more than `max_target_length`
    (default: `max_length`), `</s>` included. Only "train" is filtered by default, so validation and test BLEU stay
    comparable with published numbers.

    Args:
        dataset: splits with `src_lang` and `tgt_lang` text columns (from `load_parallel_dataset`).
        src_tok, tgt_tok: the tokenizers of each side; pass the same one twice for a joint vocabulary.
        keep_text: keep the two text columns (e.g. as BLEU references), else only model inputs remain.
        num_proc, batch_size: passed to `Dataset.map` and `Dataset.filter`, which cache their results for
            datasets backed by Arrow files.

    Returns:
        The tokenized `DatasetDict` and `{split: number of pairs dropped}`.
    """
    if max_target_length is None:
        max_target_length = max_length
    filtered = set(dataset) if filter_splits is None else set(filter_splits)
    unknown = filtered - set(dataset)
    if unknown:
        raise ValueError(
            f"filter_splits names splits the dataset lacks: {sorted(unknown)} (it has {list(dataset)})"
        )
    result, dropped = DatasetDict(), {}
    for split, ds in dataset.items():
        n_before = len(ds)
        n_empty = n_long = 0
        if split in filtered:
            ds = ds.filter(
                _both_sides_non_empty,
                batched=True,
                batch_size=batch_size,
                num_proc=num_proc,
                fn_kwargs={"src_lang": src_lang, "tgt_lang": tgt_lang},
                desc=f"Dropping empty pairs ({split})",
            )
            n_empty = n_before - len(ds)
        ds = ds.map(
            _encode_batch,
            batched=True,
            batch_size=batch_size,
            num_proc=num_proc,
            fn_kwargs={"src_tok": src_tok, "tgt_tok": tgt_tok, "src_lang": src_lang, "tgt_lang": tgt_lang},
            remove_columns=None if keep_text else [src_lang, tgt_lang],
            new_fingerprint=_encoding_fingerprint(ds, src_tok, tgt_tok, src_lang, tgt_lang, keep_text),
            desc=f"Tokenizing {split}",
        )
        if split in filtered:
            n_kept = len(ds)
            ds = ds.filter(
                _both_sides_fit,
                batched=True,
                batch_size=batch_size,
                num_proc=num_proc,
                fn_kwargs={"max_length": max_length, "max_target_length": max_target_length},
                desc=f"Dropping pairs over {max_length}/{max_target_length} tokens ({split})",
            )
            n_long = n_kept - len(ds)
            logger.info(
                "%s: dropped %d of %d pairs (%d with an empty side, %d over %d source or %d target tokens)",
                split,
                n_empty + n_long,
                n_before,
                n_empty,
                n_long,
                max_length,
                max_target_length,
            )
        result[split] = ds
        dropped[split] = n_empty + n_long
    return result, dropped


__all__ = [
    "count_lines",
    "iter_text",
    "load_parallel_dataset",
    "load_parallel_file",
    "parallel_file_paths",
    "read_lines",
    "tokenize_dataset",
]
