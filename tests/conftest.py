"""Fixtures shared by the test modules; the helpers they are built from are in `helpers/`."""

import pytest
from helpers import TOKEN, run_args, tiny_model, tiny_tokenizer, translation_model, write_corpus

# `tests/hf_common/` runs under transformers' own test tree (`make hf-common`), not in this suite.
collect_ignore = ["hf_common"]


@pytest.fixture
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def finished_run(corpus, tmp_path_factory):
    """A finished run: 8 steps, checkpoints at 4 and 8, their average, scores of the val split; the Hub token given
    on the command line (no push)."""
    from vaswani.commands import train as train_command

    out = tmp_path_factory.mktemp("runs") / "run"
    train_command.main(
        run_args(corpus, out, "--max_steps", "8", "--save_steps", "4", "--average_last", "2")
        + ["--test_split", "val", "--hub_token", TOKEN]
    )
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny translation model and its tokenizer, saved as the tools save them."""
    folder = tmp_path_factory.mktemp("model")
    tokenizer = tiny_tokenizer()
    translation_model(len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
