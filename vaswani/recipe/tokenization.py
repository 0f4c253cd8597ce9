"""Byte-pair encoding vocabularies for translation (Vaswani et al., 2017, §5.1).

§5.1: "Sentences were encoded using byte-pair encoding, which has a shared source-target vocabulary of about
37000 tokens" (WMT 2014 English-German). `train_bpe_tokenizer` learns that joint vocabulary from source and
target text together; `train_separate_tokenizers` is the option of one vocabulary per language.

Where this departs from the paper's preprocessing (subword-nmt on Moses-tokenized text): the BPE here is
byte-level and runs on raw text, so no external tokenizer is needed and nothing is ever `<unk>`:

- normalizer: `Prepend(" ")`, so the first word of a sentence is the same token as that word inside it;
- pre-tokenizer: GPT-2 style byte-level split (words, numbers and punctuation runs, each with its leading
  space), over all 256 bytes as the initial alphabet;
- decoder: byte-level, then `Strip` of exactly the one space the normalizer added.

So `decode(encode(text)) == text` for every string, umlauts, punctuation and repeated spaces included
(no Unicode normalization is applied: NFD input stays NFD).

Option, not the paper (it trained on cased WMT text): `lowercase=True` puts a `Lowercase` normalizer before the
`Prepend`, so the tokenizer lowercases everything it encodes and `decode(encode(text)) == text.lower()`. The model
then reads and writes lowercase only; this is the form most published Multi30k results train on and are scored
on (lowercased BLEU). Its output cannot be scored case-sensitively in any meaningful way.

Conventions shared with the model: `<pad>`=0, `<s>`=1 (bos and decoder start), `</s>`=2 (eos), `<unk>`=3.
The post-processor appends `</s>` to every encoded sequence, source and target alike; the model prepends `<s>`
when it shifts the labels right.
"""

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from ..common.fileio import read_json, replace_files, temporary_sibling, write_json
from ..publishing.model_card import lowercases  # noqa: F401 (the card states it; the recipe asks it too)
from .callbacks import saved_args

logger = logging.getLogger(__name__)

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "<s>", "</s>", "<unk>"
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
# The trainer gives special tokens the first ids in this order.
SPECIAL_TOKENS = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN]
SOURCE_SUBDIR, TARGET_SUBDIR = "source", "target"
# Written into both sides of separate vocabularies: the digest of the pair, so that a source/ and a target/ of two
# different trainings (a save cut short between their renames, or a folder copied over) are refused, not mixed.
PAIR_FILE = "vaswani_tokenizer_pair.json"

# Positions are sinusoidal (§3.5), so this bounds nothing in the model; it only sets when the tokenizer warns.
DEFAULT_MODEL_MAX_LENGTH = 1024
_MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + 256  # the special tokens plus the byte alphabet


def _new_bpe_tokenizer(lowercase=False):
    """An untrained byte-level BPE pipeline whose decode exactly inverts encode (see module docstring); with
    `lowercase`, it inverts the lowercased text."""
    tokenizer = Tokenizer(models.BPE(unk_token=UNK_TOKEN))
    prepend = normalizers.Prepend(" ")
    tokenizer.normalizer = normalizers.Sequence([normalizers.Lowercase(), prepend]) if lowercase else prepend
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.Sequence(
        [decoders.ByteLevel(), decoders.Strip(content=" ", left=1, right=0)]
    )
    # Every sequence ends in </s>: sources, and targets before the model shifts them right behind <s>.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS_TOKEN}",
        pair=f"$A {EOS_TOKEN} $B {EOS_TOKEN}",
        special_tokens=[(EOS_TOKEN, EOS_ID)],
    )
    return tokenizer


def check_special_ids(tokenizer, name="tokenizer"):
    """Raise `ValueError` unless `<pad>`, `<s>`, `</s>`, `<unk>` have the ids 0, 1, 2, 3 the model relies on."""
    expected = {
        kind: (token, i)
        for i, (kind, token) in enumerate(zip(("pad", "bos", "eos", "unk"), SPECIAL_TOKENS, strict=True))
    }
    found = {
        name: (getattr(tokenizer, f"{name}_token"), getattr(tokenizer, f"{name}_token_id"))
        for name in expected
    }
    if found != expected:
        raise ValueError(f"{name} has special tokens {found}, but the model expects {expected}")


def train_bpe_tokenizer(
    sentences,
    vocab_size=37000,
    min_frequency=2,
    model_max_length=DEFAULT_MODEL_MAX_LENGTH,
    show_progress=True,
    lowercase=False,
    length=None,
):
    """Learn a byte-level BPE vocabulary from `sentences` and wrap it as a `PreTrainedTokenizerFast` with `<pad>`=0,
    `<s>`=1, `</s>`=2, `<unk>`=3 that appends `</s>` to every sequence and pads on the right (`tok(sources,
    text_target=targets)` returns `input_ids`, `attention_mask` and `labels`).

    `sentences`: an iterator over sentences or over batches (lists) of them: source and target text together for the
    paper's shared vocabulary (§5.1: about 37000 tokens for EN-DE), e.g. `data.iter_text(train, ["de", "en"])` or
    `itertools.chain(*map(data.read_lines, files))`; a path, list or tuple is refused (`TypeError`), so that file
    names are never learned as text. `vocab_size` counts the special tokens and the 256 byte symbols (a small corpus
    may end with fewer tokens, when no pair is left that occurs `min_frequency` times, the least a merged pair
    occurs). `model_max_length`: the length above which `transformers` warns (positions are sinusoidal, no limit).
    `show_progress`: the trainer's progress bar, which ends at `length` sentences if given. `lowercase`: lowercase
    all text before encoding, and learn on lowercased text (not the paper; see the module docstring).
    """
    if isinstance(sentences, (str, os.PathLike, list, tuple)):
        raise TypeError(
            f"train_bpe_tokenizer takes an iterator over sentences, not a {type(sentences).__name__}: pass "
            "iter(sentences), data.iter_text(dataset, columns) or the lines of files (data.read_lines)"
        )
    if vocab_size < _MIN_VOCAB_SIZE:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: the special tokens and bytes take {_MIN_VOCAB_SIZE}"
        )
    tokenizer = _new_bpe_tokenizer(lowercase)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    tokenizer.train_from_iterator(sentences, trainer=trainer, length=length)
    logger.info(
        "Trained a byte-level BPE vocabulary of %d tokens (asked for %d)%s",
        tokenizer.get_vocab_size(),
        vocab_size,
        " on lowercased text" if lowercase else "",
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=model_max_length,
        padding_side="right",
        truncation_side="right",
        # The decoder already restores the exact text; clean-up would turn "a , b" into "a, b" (transformers 5
        # skips it for BPE with a warning; saying so here keeps it off and silent).
        clean_up_tokenization_spaces=False,
        model_input_names=["input_ids", "attention_mask"],
    )


def train_separate_tokenizers(
    source_sentences,
    target_sentences,
    vocab_size=37000,
    target_vocab_size=None,
    **options,
):
    """One BPE vocabulary per language instead of the paper's shared one (§5.1); same special ids in both.

    With separate vocabularies the encoder and decoder embeddings cannot be shared (§3.4 shares them only
    with a joint vocabulary). `vocab_size` sizes the source vocabulary and, unless `target_vocab_size` is
    given, the target one. `options` are `train_bpe_tokenizer`'s (`min_frequency`, `model_max_length`,
    `show_progress`, `lowercase`, and `length`, the number of sentences of each side, for the progress bar).
    `save_tokenizers` writes them to `<directory>/source` and `<directory>/target`.
    """
    source = train_bpe_tokenizer(source_sentences, vocab_size, **options)
    target = train_bpe_tokenizer(target_sentences, target_vocab_size or vocab_size, **options)
    return source, target


def save_tokenizers(source_tokenizer, target_tokenizer, directory):
    """Write a joint tokenizer (the same object twice) to `directory`, separate ones to `directory/{source,target}`.

    Each file appears whole (written beside `directory`, then renamed into it, `fileio.replace_files`), so a run killed
    while saving never leaves a torn `tokenizer.json`."""
    directory = Path(directory)
    building = temporary_sibling(directory)
    try:
        if source_tokenizer is target_tokenizer:
            source_tokenizer.save_pretrained(building)
        else:
            source_tokenizer.save_pretrained(building / SOURCE_SUBDIR)
            target_tokenizer.save_pretrained(building / TARGET_SUBDIR)
            pair = _pair_digest(building / SOURCE_SUBDIR, building / TARGET_SUBDIR)
            for side in (SOURCE_SUBDIR, TARGET_SUBDIR):
                write_json(building / side / PAIR_FILE, {"pair": pair})
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    replace_files(building, directory)  # the callers log what they saved


def load_tokenizers(path):
    """Load `(source_tokenizer, target_tokenizer)` from a folder written by `save_tokenizers`, or by `vaswani.interop.convert`.

    Separate vocabularies come from `path/source` and `path/target` (a model folder of such a run also holds the
    target tokenizer as `path/tokenizer.json`, which the Trainer saves); a joint one (`path/tokenizer.json`) gives the
    same object twice. Both layouts are checked for the special ids the model expects. A converted
    model's own tokenizer (Marian's sentencepiece, FSMT's) serves both sides.
    """
    path = Path(path)
    source_dir, target_dir = path / SOURCE_SUBDIR, path / TARGET_SUBDIR
    # Separate ones first: the model folder of such a run also holds the Trainer's copy of the target tokenizer.
    if (source_dir / "tokenizer.json").is_file() and (target_dir / "tokenizer.json").is_file():
        _check_pair(source_dir, target_dir)
        return _load_tokenizer(source_dir), _load_tokenizer(target_dir)
    if (path / "tokenizer.json").is_file():
        tokenizer = _load_tokenizer(path)
        return tokenizer, tokenizer
    if (path / "tokenizer_config.json").is_file():
        # A tokenizer of another kind that encodes the source and decodes the target itself, as a converted Marian
        # (sentencepiece) or FSMT model carries it (`vaswani.interop.convert`); its special ids are the converted config's.
        tokenizer = _load_tokenizer(path, check_ids=False)
        return tokenizer, tokenizer
    raise FileNotFoundError(
        f"No tokenizer in {path}: expected {path / 'tokenizer.json'} (joint vocabulary) or "
        f"{source_dir / 'tokenizer.json'} and {target_dir / 'tokenizer.json'} (separate vocabularies)"
    )


def tokenizer_digest(source_tokenizer, target_tokenizer):
    """A digest of the vocabularies and merges of a run's tokenizers: two tokenizers of the same size but different
    tokens give different digests."""
    models = [
        json.loads(tok.backend_tokenizer.to_str()).get("model")
        if hasattr(tok, "backend_tokenizer")
        else sorted(tok.get_vocab().items())
        for tok in (source_tokenizer, target_tokenizer)
    ]
    text = json.dumps(models, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def saved_tokenizer_digest(folder):
    """The tokenizer digest (`tokenizer_digest`) a checkpoint's `trainer_state.json` records (None for a folder
    without one)."""
    try:
        state = read_json(Path(folder, "trainer_state.json"))
    except (OSError, ValueError):
        return None
    return (saved_args(state.get("stateful_callbacks"), "RunTokenizer") or {}).get("digest")


def load_model_tokenizers(model_path, tokenizer_path=None):
    """`load_tokenizers(tokenizer_path or model_path)`, refusing with a `ValueError` naming both folders a
    `tokenizer_path` whose vocabulary differs from the one the model folder records (`saved_tokenizer_digest`) or
    holds (its token ids would mean other tokens to the model: another run's tokenizer)."""
    tokenizers = load_tokenizers(tokenizer_path or model_path)
    if tokenizer_path is None or not Path(model_path).is_dir():
        return tokenizers
    # A checkpoint's record of its run's tokenizers, else the folder's own.
    own = saved_tokenizer_digest(model_path)
    try:
        own = own or tokenizer_digest(*load_tokenizers(model_path))
    except (OSError, ValueError):  # the folder holds no (usable) tokenizer of its own
        return tokenizers  # nothing to compare with
    if own != tokenizer_digest(*tokenizers):
        raise ValueError(
            f"The tokenizer {tokenizer_path} is not the one the model {model_path} was trained with (its own, in "
            f"that folder, has other tokens): leave the model's own (drop --tokenizer_name)"
        )
    return tokenizers


def _pair_digest(source_dir, target_dir):
    both = b"".join((folder / "tokenizer.json").read_bytes() for folder in (source_dir, target_dir))
    return hashlib.sha256(both).hexdigest()


def _check_pair(source_dir, target_dir):
    """Refuse separate vocabularies whose two sides were not saved together (see `PAIR_FILE`)."""
    marks = [folder / PAIR_FILE for folder in (source_dir, target_dir)]
    if not all(mark.is_file() for mark in marks):
        return  # saved before the mark existed, or by hand
    recorded = {read_json(mark).get("pair") for mark in marks}
    if recorded != {_pair_digest(source_dir, target_dir)}:
        raise ValueError(
            f"{source_dir} and {target_dir} are not one pair of tokenizers (each side is from another training, "
            "e.g. a save cut short between them): train the tokenizers again"
        )


def _load_tokenizer(folder, check_ids=True):
    """`AutoTokenizer.from_pretrained(folder)`, its special ids checked; a file that is not valid JSON (cut short by
    a kill, say) raises `ValueError` naming it."""
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        file = folder / name
        if file.is_file():
            try:
                json.loads(file.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as error:
                raise ValueError(
                    f"Tokenizer file {file} is corrupt or truncated ({error}): delete {folder} to train a new one"
                ) from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except Exception as error:  # tokenizers' own exception types
        raise ValueError(f"Cannot load the tokenizer in {folder}: {' '.join(str(error).split())}") from error
    if check_ids:
        check_special_ids(tokenizer, str(folder))
    return tokenizer
