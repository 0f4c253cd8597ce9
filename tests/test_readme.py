"""The README's Python example runs as written, and its two commands are the Makefile's."""

import json
import os
import re
import subprocess
import sys

from helpers import ROOT


def test_readme_python_example_runs():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python example"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)  # noqa: S102
    assert namespace["beams"].shape[0] == 1


def test_the_seq2seq_trainer_example_runs_offline(tmp_path, monkeypatch):
    """The fine-tuning example of docs/recipe.md, on a tiny model folder in place of a trained run's: the metric loads without
    the network (transformers' guide's `evaluate.load("sacrebleu")` does not), and evaluation gives BLEU and chrF."""
    from helpers import tiny_tokenizer, tool_model

    text = (ROOT / "docs" / "recipe.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "Seq2SeqTrainer(" in b]
    tokenizer = tiny_tokenizer()
    tool_model(len(tokenizer)).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert '"runs/de-en/averaged"' in block and "max_steps=100" in block
    block = block.replace('"runs/de-en/averaged"', repr(str(tmp_path / "model"))).replace(
        "max_steps=100", "max_steps=2"
    )
    namespace: dict = {}
    exec(compile(block, "docs/recipe.md", "exec"), namespace)  # noqa: S102
    assert {"eval_bleu", "eval_chrf"} <= set(namespace["metrics"])
    assert namespace["model"].config.dropout == 0.3
    assert (
        json.loads((tmp_path / "runs" / "de-en-tuned" / "checkpoint-2" / "config.json").read_text())[
            "dropout"
        ]
        == 0.3
    )


def test_readme_commands_exist_in_makefile_and_ci():
    readme = (ROOT / "README.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert "make run" in readme and "make test" in readme
    assert re.search(r"^run:", makefile, flags=re.M) and re.search(r"^test:", makefile, flags=re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_the_readme_is_a_front_page_whose_links_lead_somewhere():
    """The README is a front page (about 8 KB) and every page it sends a reader to exists."""
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) < 9 * 1024
    links = re.findall(r"\]\(((?:docs|recipes)/[^)#]+|[A-Z]+\.md)\)", text)
    assert {"docs/model.md", "docs/recipe.md", "docs/interop.md", "docs/ARCHITECTURE.md"} <= set(links)
    for link in links:
        assert (ROOT / link).is_file(), link
    assert len((ROOT / "BENCHMARKS.md").read_text().encode()) <= 16 * 1024


def test_the_documented_commands_translate_the_test_split_the_training_command_reads():
    """README and docs/ told a new user to translate `test.de`, which no data set has: every `--input` of their
    command blocks is the test split of the data their `vaswani-train` command reads, as that folder names it."""
    readme = (ROOT / "README.md").read_text()
    data, split = re.search(r"--dataset_name (\S+)", readme)[1], re.search(r"--test_split (\S+)", readme)[1]
    for page in ("README.md", "docs/recipe.md", "docs/interop.md"):
        commands = " ".join(re.findall(r"```bash\n(.*?)```", (ROOT / page).read_text(), flags=re.S))
        inputs = re.findall(r"--input (\S+)", commands)
        assert inputs, page
        for path in inputs:
            assert path in (f"{data}/{split}.de.gz", f"{data}/{split}.en.gz"), (page, path)


def test_the_readme_pipeline_works_on_every_folder_the_tools_write(finished_run, tmp_path):
    """The `pipeline("translation", ...)` example of docs/recipe.md, run as written in an interpreter where `vaswani` cannot
    be imported, on a checkpoint, the final model and the averaged model of a run."""
    readme = (ROOT / "docs" / "recipe.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "pipeline(" in b]
    assert 'model="runs/de-en/averaged"' in block
    folders = [finished_run / "checkpoint-8", finished_run, finished_run / "averaged"]
    script = "import sys\nsys.modules['vaswani'] = None\n"
    for folder in folders:
        script += block.replace('"runs/de-en/averaged"', repr(str(folder)))
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": "",
        "HF_MODULES_CACHE": str(tmp_path / "modules"),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [eval(line) for line in done.stdout.strip().splitlines()]  # noqa: S307 (our own child's output)
    from vaswani.recipe.translation import load_translation_model, translate

    assert len(printed) == len(folders)
    for folder, result in zip(folders, printed, strict=True):
        model, tokenizer, _ = load_translation_model(folder, device="cpu")
        expected = translate(["Ein Mann fährt Fahrrad.", ""], model, tokenizer, show_progress=False)
        assert result == [{"translation_text": text} for text in expected], folder
