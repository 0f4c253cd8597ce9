"""Parallel data: every source shape becomes `{split: [src_lang, tgt_lang]}`; errors name files; filtering."""

import gzip
import itertools
import json
from pathlib import Path

import pytest
from datasets import Dataset, DatasetDict, Features, Translation
from transformers import AutoTokenizer

import vaswani.recipe.data
from vaswani.recipe.data import (
    count_lines,
    iter_text,
    load_parallel_dataset,
    read_lines,
    sample_pairs,
    tokenize_dataset,
)
from vaswani.recipe.tokenization import EOS_ID, train_bpe_tokenizer

_DE = (
    ["Ein Mann", "Eine Frau", "Zwei Hunde", "Ein Mädchen", "Der Junge"],
    ["läuft über", "spielt auf", "fährt durch"],
    ["die Straße.", "der grünen Wiese.", "den Schnee!"],
)
_EN = (
    ["A man", "A woman", "Two dogs", "A girl", "The boy"],
    ["runs across", "plays on", "drives through"],
    ["the street.", "the green meadow.", "the snow!"],
)


def corpus(n: int = 45) -> tuple[list[str], list[str]]:
    """`n` German-English-like sentence pairs with umlauts and punctuation."""
    de = [" ".join(words) for words in itertools.product(*_DE)][:n]
    en = [" ".join(words) for words in itertools.product(*_EN)][:n]
    return de, en


def write_lines(path: Path, lines: list[str]) -> Path:
    text = "".join(line + "\n" for line in lines)
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def multi30k_like(tmp_path) -> Path:
    """The Multi30k repository layout in miniature: gzip train and test, plain val."""
    de, en = corpus()
    directory = tmp_path / "multi30k"
    directory.mkdir()
    for name, rows in [("train", slice(0, 30)), ("val", slice(30, 38)), ("test_2016_flickr", slice(38, 45))]:
        suffix = "" if name == "val" else ".gz"
        write_lines(directory / f"{name}.de{suffix}", de[rows])
        write_lines(directory / f"{name}.en{suffix}", en[rows])
    (directory / "README.md").write_text("not data\n")
    return directory


def test_text_directory_with_gzip_and_plain_files(multi30k_like, tmp_path):
    de, en = corpus()
    ds = load_parallel_dataset(multi30k_like, "de", "en", cache_dir=tmp_path / "cache")
    assert list(ds) == ["test_2016_flickr", "train", "val"]
    for split in ds.values():
        assert split.column_names == ["de", "en"]
    assert ds["train"]["de"] == de[:30] and ds["train"]["en"] == en[:30]
    assert ds["val"]["de"] == de[30:38] and ds["test_2016_flickr"]["en"] == en[38:]
    reversed_direction = load_parallel_dataset(
        multi30k_like, "en", "de", ["val"], cache_dir=tmp_path / "cache"
    )
    assert reversed_direction["val"].column_names == ["en", "de"]


def test_split_names_are_mapped(multi30k_like, tmp_path):
    mapping = {"train": "train", "validation": "val", "test": "test_2016_flickr"}
    ds = load_parallel_dataset(multi30k_like, "de", "en", mapping, cache_dir=tmp_path / "cache")
    assert list(ds) == ["train", "validation", "test"]
    assert [len(ds[split]) for split in ds] == [30, 8, 7]
    with pytest.raises(TypeError, match="not the string 'train'"):
        load_parallel_dataset(multi30k_like, "de", "en", "train")


def test_lines_split_only_on_newline(tmp_path):
    lines = ["Zeile mit\u2028Trenner", "und\x85NEL", "Windows-Zeile\r", "", "Ende ohne Umbruch"]
    path = tmp_path / "odd.de.gz"
    with gzip.open(path, "wb") as f:
        f.write("\n".join(lines).encode("utf-8"))
    assert list(read_lines(path)) == [
        "Zeile mit\u2028Trenner",
        "und\x85NEL",
        "Windows-Zeile",
        "",
        "Ende ohne Umbruch",
    ]
    assert count_lines(path) == 5


def test_missing_split_names_the_files(multi30k_like):
    with pytest.raises(FileNotFoundError, match=r"test_2017_flickr\.de.*test_2017_flickr\.de\.gz"):
        load_parallel_dataset(multi30k_like, "de", "en", {"test": "test_2017_flickr"})


def test_missing_language_names_the_file(multi30k_like):
    with pytest.raises(FileNotFoundError, match=r"train\.fr"):
        load_parallel_dataset(multi30k_like, "de", "fr", ["train"])


def test_misaligned_files_name_both(tmp_path):
    de, en = corpus(5)
    write_lines(tmp_path / "train.de.gz", de)
    write_lines(tmp_path / "train.en", en[:4])
    with pytest.raises(ValueError, match=r"train\.de\.gz has 5 lines but .*train\.en has 4"):
        load_parallel_dataset(tmp_path, "de", "en")


def test_plain_and_gzip_copies_of_one_file_are_ambiguous(tmp_path):
    de, en = corpus(3)
    write_lines(tmp_path / "train.de", de)
    write_lines(tmp_path / "train.de.gz", de)
    write_lines(tmp_path / "train.en", en)
    with pytest.raises(ValueError, match=r"train\.de and .*train\.de\.gz"):
        load_parallel_dataset(tmp_path, "de", "en")


def test_paths_that_hold_nothing(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no parallel data"):
        load_parallel_dataset(tmp_path, "de", "en")
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        load_parallel_dataset(str(tmp_path / "does-not-exist"), "de", "en")  # never sent to the Hub
    (tmp_path / "pairs.tsv").write_text("Ein Mann\tA man\n")
    with pytest.raises(ValueError, match=r"pairs\.tsv: a single file must be JSON lines"):
        load_parallel_dataset(tmp_path / "pairs.tsv", "de", "en")


def test_json_lines_file_and_directory(tmp_path):
    de, en = corpus(6)
    single = tmp_path / "pairs.jsonl"
    single.write_text(
        "".join(json.dumps({"translation": {"en": e, "de": d}}) + "\n" for d, e in zip(de, en, strict=True))
    )
    ds = load_parallel_dataset(single, "de", "en", cache_dir=tmp_path / "cache")
    assert list(ds) == ["train"] and ds["train"].column_names == ["de", "en"] and ds["train"]["de"] == de
    with pytest.raises(ValueError, match=r"pairs\.jsonl is a single JSON-lines file.*'validation'"):
        load_parallel_dataset(single, "de", "en", ["validation"], cache_dir=tmp_path / "cache")

    directory = tmp_path / "jsonl"
    directory.mkdir()
    (directory / "train.jsonl").write_text(
        "".join(json.dumps({"de": d, "en": e, "id": 1}) + "\n" for d, e in zip(de, en, strict=True))
    )
    with gzip.open(directory / "valid.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(json.dumps({"de": de[0], "en": en[0]}) + "\n")
    ds = load_parallel_dataset(
        directory, "de", "en", {"train": "train", "validation": "valid"}, cache_dir=tmp_path / "c"
    )
    assert ds["train"]["en"] == en and ds["validation"]["de"] == de[:1]
    assert ds["train"].column_names == ["de", "en"]
    with pytest.raises(FileNotFoundError, match=r"test\.jsonl"):
        load_parallel_dataset(directory, "de", "en", ["test"], cache_dir=tmp_path / "c")


def _hub_like(shape: str) -> DatasetDict:
    """The two shapes of translation datasets on the Hub, built locally."""
    de, en = corpus(10)
    splits = {"train": slice(0, 8), "validation": slice(8, 10)}
    if shape == "translation":  # like wmt14 (config "de-en")
        features = Features({"translation": Translation(languages=["de", "en"])})
        return DatasetDict(
            {
                name: Dataset.from_dict(
                    {"translation": [{"de": d, "en": e} for d, e in zip(de[rows], en[rows], strict=True)]},
                    features=features,
                )
                for name, rows in splits.items()
            }
        )
    # like bentrevett/multi30k: one column per language, here in the other order and with an extra column
    return DatasetDict(
        {
            name: Dataset.from_dict({"en": en[rows], "de": de[rows], "id": list(range(10))[rows]})
            for name, rows in splits.items()
        }
    )


@pytest.mark.parametrize("shape", ["translation", "columns"])
def test_hub_shapes_are_normalised(tmp_path, monkeypatch, shape):
    de, en = corpus(10)
    # Saved to disk: read back with load_from_disk.
    _hub_like(shape).save_to_disk(tmp_path / "saved")
    ds = load_parallel_dataset(tmp_path / "saved", "de", "en")
    assert list(ds) == ["train", "validation"]
    assert ds["train"].column_names == ["de", "en"]
    assert ds["train"]["de"] == de[:8] and ds["validation"]["en"] == en[8:]

    # A Hub id goes through datasets.load_dataset; stand in for the Hub so no network is touched.
    calls = []

    def fake_load_dataset(path, name=None, revision=None, cache_dir=None):
        calls.append((path, name))
        return _hub_like(shape)

    monkeypatch.setattr(vaswani.recipe.data.datasets, "load_dataset", fake_load_dataset)
    ds = load_parallel_dataset("wmt14", "en", "de", {"test": "validation"}, config_name="de-en")
    assert calls == [("wmt14", "de-en")]
    assert list(ds) == ["test"] and ds["test"].column_names == ["en", "de"] and ds["test"]["de"] == de[8:]
    with pytest.raises(ValueError, match=r"wmt14 has no split \['test'\]"):
        load_parallel_dataset("wmt14", "de", "en", ["test"])


def test_a_saved_single_dataset_is_the_train_split(tmp_path):
    _hub_like("translation")["validation"].save_to_disk(tmp_path / "one")
    ds = load_parallel_dataset(tmp_path / "one", "en", "de")
    assert list(ds) == ["train"] and ds["train"].column_names == ["en", "de"] and len(ds["train"]) == 2


@pytest.mark.parametrize("shape", ["translation", "columns"])
def test_missing_language_in_a_dataset(tmp_path, shape):
    _hub_like(shape).save_to_disk(tmp_path / "saved")
    with pytest.raises(ValueError, match=r"saved \[train\].*'fr'"):
        load_parallel_dataset(tmp_path / "saved", "de", "fr", ["train"])


def test_iter_text_yields_batches_of_each_column():
    ds = Dataset.from_dict({"de": ["a", "b", "c"], "en": ["x", "y", "z"]})
    assert list(iter_text(ds, ["de", "en"], batch_size=2)) == [["a", "b"], ["x", "y"], ["c"], ["z"]]


@pytest.fixture
def noisy(tmp_path):
    """A text corpus with empty sides and over-long sentences in train and in val, plus a tokenizer."""
    de, en = corpus(20)
    long_de = " ".join(de[:6])
    train_de = de[:14] + ["", "Ein Hund.", "   ", long_de]
    train_en = en[:14] + ["An empty source", "", "A blank source", "A long one"]
    write_lines(tmp_path / "train.de", train_de)
    write_lines(tmp_path / "train.en", train_en)
    write_lines(tmp_path / "val.de", de[14:] + [long_de])
    write_lines(tmp_path / "val.en", en[14:] + ["A long one"])
    ds = load_parallel_dataset(tmp_path, "de", "en", cache_dir=tmp_path / "cache")
    tok = train_bpe_tokenizer(iter_text(ds["train"], ["de", "en"]), vocab_size=400, show_progress=False)
    return ds, tok


def test_tokenize_and_filter(noisy):
    ds, tok = noisy
    long_length = len(tok(ds["val"]["de"][-1])["input_ids"])
    ordinary = ds["train"]["de"][:14] + ds["train"]["en"][:14] + ds["val"]["de"][:6] + ds["val"]["en"][:]
    max_length = max(len(tok(text)["input_ids"]) for text in ordinary)
    assert long_length > max_length  # the long pair is over the limit, every ordinary pair within it
    out, dropped = tokenize_dataset(ds, tok, tok, "de", "en", max_length=max_length)
    assert dropped == {"train": 4, "val": 0}  # 3 pairs with an empty side and 1 long pair; val is kept whole
    assert len(out["train"]) == 14 and len(out["val"]) == 7
    assert out["train"].column_names == ["input_ids", "labels", "length"]  # the collator makes attention_mask
    assert max(map(len, out["val"]["input_ids"])) == long_length
    for example, de, en in zip(out["train"], ds["train"]["de"][:14], ds["train"]["en"][:14], strict=True):
        assert example["input_ids"][-1] == EOS_ID and example["labels"][-1] == EOS_ID
        assert example["length"] == max(len(example["input_ids"]), len(example["labels"]))
        assert tok.decode(example["input_ids"], skip_special_tokens=True) == de
        assert tok.decode(example["labels"], skip_special_tokens=True) == en


def test_separate_tokenizers_tokenize_their_own_side(noisy):
    ds, tok = noisy
    src_tok = train_bpe_tokenizer(iter_text(ds["train"], ["de"]), vocab_size=300, show_progress=False)
    out, _ = tokenize_dataset(ds, src_tok, tok, "de", "en")
    assert out["val"]["input_ids"][0] == src_tok(ds["val"]["de"][0])["input_ids"]
    assert out["val"]["labels"][0] == tok(ds["val"]["en"][0])["input_ids"]


def test_tokenization_is_cached_across_tokenizer_reloads(noisy, tmp_path):
    ds, tok = noisy
    first, _ = tokenize_dataset(ds, tok, tok, "de", "en")
    tok.save_pretrained(tmp_path / "tok")
    reloaded = AutoTokenizer.from_pretrained(tmp_path / "tok")
    again, _ = tokenize_dataset(ds, reloaded, reloaded, "de", "en")
    assert again["train"].cache_files == first["train"].cache_files
    assert again["train"]["labels"] == first["train"]["labels"]
    # A different vocabulary must not hit that cache.
    other = train_bpe_tokenizer(iter_text(ds["train"], ["de", "en"]), vocab_size=300, show_progress=False)
    different, _ = tokenize_dataset(ds, other, other, "de", "en")
    assert different["train"].cache_files != first["train"].cache_files
    assert different["train"]["labels"] != first["train"]["labels"]


def test_one_pass_gives_the_tokenizers_own_ids_as_int32(noisy, tmp_path):
    """The single `map` pass calls the Rust tokenizer directly: its ids are exactly `tok(text)["input_ids"]` (special
    tokens as the tokenizer adds them, nothing truncated even where the tokenizer's own settings truncate), stored as
    int32 lists with the longer side's length beside them."""
    ds, tok = noisy
    odd = ["<s> Ein </s> Hund <pad>", "  Zwei  Leerzeichen ", "Straße, Wiese; Größe!", "x" * 300]
    extra = Dataset.from_dict({"de": odd, "en": list(reversed(odd))})
    tok.backend_tokenizer.enable_truncation(3)  # ignored, as tok(texts, truncation=False) ignores it
    try:
        out, dropped = tokenize_dataset(
            DatasetDict({"train": ds["train"], "extra": extra}), tok, tok, "de", "en", max_length=1000
        )
    finally:
        tok.backend_tokenizer.no_truncation()
    assert tok.backend_tokenizer.truncation is None  # the caller's tokenizer is left as it was
    kept_de = [
        d for d, e in zip(ds["train"]["de"], ds["train"]["en"], strict=True) if d.strip() and e.strip()
    ]
    assert dropped == {"train": 3, "extra": 0}
    assert out["train"]["input_ids"] == tok(kept_de)["input_ids"]
    assert out["extra"]["input_ids"] == tok(odd)["input_ids"]
    assert out["extra"]["labels"] == tok(list(reversed(odd)))["input_ids"]
    pairs = zip(out["extra"]["input_ids"], out["extra"]["labels"], strict=True)
    assert out["extra"]["length"] == [max(len(s), len(t)) for s, t in pairs]
    features = out["train"].features
    assert features["input_ids"].feature.dtype == features["labels"].feature.dtype == "int32"
    assert features["length"].dtype == "int32"


def test_the_collator_makes_the_attention_mask(noisy):
    """No attention_mask is stored: DataCollatorForSeq2Seq's padding makes it, and pads the labels with -100."""
    from transformers import DataCollatorForSeq2Seq

    ds, tok = noisy
    out, _ = tokenize_dataset(ds, tok, tok, "de", "en")
    rows = [out["train"].select_columns(["input_ids", "labels"])[i] for i in (0, 5, 13)]
    batch = DataCollatorForSeq2Seq(tok, label_pad_token_id=-100)(rows)
    lengths = [len(row["input_ids"]) for row in rows]
    assert batch["attention_mask"].tolist() == [[1] * n + [0] * (max(lengths) - n) for n in lengths]
    assert batch["input_ids"][batch["attention_mask"] == 0].eq(tok.pad_token_id).all()
    labels = [len(row["labels"]) for row in rows]
    assert batch["labels"].tolist()[0] == rows[0]["labels"] + [-100] * (max(labels) - labels[0])


def test_the_filter_settings_are_part_of_the_cache_key(noisy):
    ds, tok = noisy
    first, dropped = tokenize_dataset(ds, tok, tok, "de", "en", max_length=1000)
    again, _ = tokenize_dataset(ds, tok, tok, "de", "en", max_length=1000)
    assert (
        again["train"].cache_files == first["train"].cache_files
    )  # a rerun maps the file the first run wrote
    shorter, dropped_shorter = tokenize_dataset(ds, tok, tok, "de", "en", max_length=8)
    assert shorter["train"].cache_files != first["train"].cache_files
    assert dropped_shorter["train"] > dropped["train"] and max(shorter["train"]["length"]) <= 8
    # The same rows outside "train" are not filtered: another key, every pair kept.
    unfiltered, none_dropped = tokenize_dataset(
        DatasetDict(test=ds["train"]), tok, tok, "de", "en", max_length=1000
    )
    assert unfiltered["test"].cache_files != first["train"].cache_files
    assert none_dropped == {"test": 0} and len(unfiltered["test"]) == len(ds["train"])


def test_a_null_text_outside_the_training_split_is_named(noisy):
    ds, tok = noisy
    broken = DatasetDict({"test": Dataset.from_dict({"de": ["Ein Hund.", None], "en": ["A dog.", "A cat."]})})
    with pytest.raises(ValueError, match="test: .* no de text"):
        tokenize_dataset(broken, tok, tok, "de", "en")
    dropped = tokenize_dataset(DatasetDict(train=broken["test"]), tok, tok, "de", "en")[1]
    assert dropped == {"train": 1}  # where pairs are filtered, a null side is an empty one


def test_sample_pairs_draws_a_fixed_uniform_sample_in_corpus_order():
    ds = Dataset.from_dict({"de": [str(i) for i in range(1000)], "en": [str(i) for i in range(1000)]})
    sample = sample_pairs(ds, 100)
    picked = [int(x) for x in sample["de"]]
    assert len(picked) == len(set(picked)) == 100 and picked == sorted(picked)
    assert picked == [int(x) for x in sample_pairs(ds, 100)["de"]]  # the same on every run and rank
    assert picked != [int(x) for x in sample_pairs(ds, 100, seed=1)["de"]]
    assert 300 < sum(picked) / 100 * 2 / 3 < 700 and max(picked) > 900  # spread over the corpus, not its head
    assert sample_pairs(ds, None) is ds and sample_pairs(ds, 5000) is ds


class PythonTokenizer:
    """A tokenizer with no Rust backend (as Marian's and FSMT's are): only `tok(texts)` to call."""

    def __init__(self, fast):
        self.fast = fast

    def __call__(self, texts, **kwargs):
        return self.fast(texts, **kwargs)


def test_a_tokenizer_without_a_rust_backend_is_called(noisy):
    ds, tok = noisy
    out, dropped = tokenize_dataset(ds, PythonTokenizer(tok), tok, "de", "en")
    expected, _ = tokenize_dataset(ds, tok, tok, "de", "en")
    assert dropped == {"train": 3, "val": 0}
    assert out["train"]["input_ids"] == expected["train"]["input_ids"]
    assert out["val"]["labels"] == expected["val"]["labels"]


def test_the_training_text_is_released_once_tokenized(tmp_path, monkeypatch):
    """At WMT scale the training text is gigabytes of memory-mapped pages: nothing holds it once the token ids exist,
    so a training process keeps only the model and the ids resident (BENCHMARKS.md, "Data at WMT scale")."""
    import gc
    import weakref

    from helpers import run_args, write_corpus

    from vaswani.commands import train as train_command
    from vaswani.recipe import run

    texts, alive_at_build = {}, {}
    load_split, build_model = run.load_split, run.build_model

    def recording_load_split(data_args, split):
        dataset = load_split(data_args, split)
        texts[split] = weakref.ref(dataset)
        return dataset

    def checking_build_model(*args, **kwargs):
        gc.collect()
        alive_at_build.update((split, ref() is not None) for split, ref in texts.items())
        return build_model(*args, **kwargs)

    monkeypatch.setattr(run, "load_split", recording_load_split)
    monkeypatch.setattr(run, "build_model", checking_build_model)
    corpus = write_corpus(tmp_path)
    argv = run_args(
        corpus, tmp_path / "run", "--max_steps", "1", "--do_predict", "false", "--eval_strategy", "steps"
    )
    train_command.main(argv + ["--eval_steps", "1"])
    # The validation split was sorted by length into a new dataset: its first one is gone too.
    assert alive_at_build == {"train": False, "validation": False}
