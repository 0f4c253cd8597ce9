"""The package's folders are its layers (docs/ARCHITECTURE.md), and nothing reaches up:

    model (vaswani/*.py, vaswani/kernels/)  <-  common  <-  publishing  <-  recipe  <-  interop  <-  commands

The model's files (what every saved folder carries) import torch and transformers only; the recipe never imports
interop or the commands. Every public door a user or an old script knows still opens: `import vaswani`, its names,
the console commands, `python -m vaswani.commands.train`."""

import ast
import re
import subprocess
import sys
from pathlib import Path

from helpers import ROOT

import vaswani
from vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani.utils_vaswani import CODE_FILES

PACKAGE = ROOT / "vaswani"
LAYERS = ["model", "common", "publishing", "recipe", "interop", "commands"]


def _layer(module: str) -> str:
    parts = module.split(".")
    if parts[1:2] == ["kernels"]:  # the model's opt-in CPU kernels: a folder of the model's layer
        return "model"
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else "model"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "sacrebleu_chrf":  # run by `evaluate` from a copy, not a module of the package
            continue
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _all_imports(name: str, path: Path) -> set[str]:
    """Every module name `name` imports, at any depth of its code (inside functions too), resolved to absolute."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found |= {f"{target}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


def test_the_tree_shows_the_layers():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(LAYERS[1:]) | {"kernels"}
    model_files = {p.name for p in PACKAGE.glob("*.py")} - {"__init__.py"}
    # The model's top holds the files a saved folder carries, nothing of the recipe; the opt-in CPU kernels, which no
    # folder carries, are a folder of their own in the model's layer.
    assert model_files == {Path(name).name for name in CODE_FILES.values()}


def test_no_layer_imports_a_layer_above_it():
    modules = _modules()
    upward = []
    for name, path in modules.items():
        rank = LAYERS.index(_layer(name))
        for target in _all_imports(name, path):
            if target in modules and LAYERS.index(_layer(target)) > rank:
                upward.append(f"{name} ({_layer(name)}) imports {target} ({_layer(target)})")
    assert not upward, "\n".join(upward)
    # the walk sees imports: the trainer imports its neighbours and the model
    assert {"vaswani.recipe.batching", "vaswani.generation_vaswani"} <= _all_imports(
        "vaswani.recipe.trainer", modules["vaswani.recipe.trainer"]
    )


def test_a_saved_folder_code_imports_only_torch_and_transformers(tmp_path):
    config = VaswaniConfig.from_preset(
        "small", vocab_size=40, d_model=16, encoder_ffn_dim=32, decoder_ffn_dim=32
    )
    VaswaniForConditionalGeneration(config).save_pretrained(tmp_path)
    code = sorted(tmp_path.rglob("*.py"))
    assert {str(p.relative_to(tmp_path)) for p in code} == set(CODE_FILES)
    # huggingface_hub: transformers' own dependency, whose `strict` makes its configurations (MarianConfig too)
    # `@strict` dataclasses; it comes with every transformers
    allowed = {"torch", "transformers", "huggingface_hub", "__future__"} | set(sys.stdlib_module_names)
    for path in code:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.level == 1 and (path.parent / f"{node.module}.py").exists(), (path, node.module)
            elif isinstance(node, ast.ImportFrom):
                assert node.module.split(".")[0] in allowed, (path.name, node.module)
            elif isinstance(node, ast.Import):
                assert all(a.name.split(".")[0] in allowed for a in node.names), (path.name, ast.dump(node))


def test_the_public_names_and_commands():
    assert vaswani.VaswaniConfig is VaswaniConfig and callable(vaswani.use_cpu_kernels)
    assert callable(vaswani.use_plain_modules)  # docs/model.md names it beside use_cpu_kernels
    assert set(vaswani.__all__) <= set(dir(vaswani))
    table = (ROOT / "pyproject.toml").read_text().split("[project.scripts]")[1].split("\n[")[0]
    scripts = dict(re.findall(r'^(vaswani-[a-z-]+) = "([^"]+)"', table, flags=re.M))
    assert len(scripts) == 9
    for command, target in scripts.items():
        module, function = target.split(":")
        assert (ROOT / "scripts" / f"{module.rsplit('.', 1)[1]}.py").exists(), command
        assert callable(getattr(__import__(module, fromlist=[function]), function)), command


def test_python_m_vaswani_commands_train_answers_help():
    run = subprocess.run(
        [sys.executable, "-m", "vaswani.commands.train", "--help"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0 and "--dataset_name" in run.stdout, run.stderr[-2000:]


def test_every_import_of_the_package_names_a_module_that_exists():
    """Imports inside functions too: a name left from the flat layout (`from ..fileio import ...` in a subpackage)
    would fail only when that function runs."""
    modules = _modules()
    missing = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
                names = [f"{target}.{alias.name}" for alias in node.names]
                if target not in modules and not any(n in modules for n in names):
                    missing.append(f"{name}: from {'.' * node.level}{node.module or ''}")
    assert not missing, "\n".join(missing)


OLD_FOLDER = ROOT / "tests" / "fixtures" / "folder_saved_before_the_layers"


# What the release that wrote the folder computed on it (no import of this package: it also runs where it is missing).
# Logits to float32 rounding across CPUs: computed on an Intel Xeon, an AMD EPYC's differ by up to 6e-6 relatively.
CHECK_AGAINST_THE_OLD_RELEASE = """
import json
import torch
expected = json.loads(open(EXPECTED).read())
source = torch.tensor(expected["source"])
with torch.no_grad():
    logits = model(input_ids=source, labels=torch.tensor(expected["labels"])).logits[0]
torch.testing.assert_close(logits, torch.tensor(expected["logits"]), rtol=1e-5, atol=2e-5)
assert model.generate(source, max_new_tokens=8, num_beams=1, do_sample=False).tolist() == expected["greedy"]
assert model.generate(source, max_new_tokens=8, num_beams=3, do_sample=False).tolist() == expected["beam3"]
"""
EXPECTED = str(OLD_FOLDER.with_name(OLD_FOLDER.name + ".expected.json"))


def test_a_folder_saved_before_the_layers_loads_after_import_vaswani():
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(OLD_FOLDER).eval()
    assert type(model) is VaswaniForConditionalGeneration
    exec(CHECK_AGAINST_THE_OLD_RELEASE, {"model": model, "EXPECTED": EXPECTED})  # noqa: S102


def test_a_folder_saved_before_the_layers_loads_with_its_own_code_where_vaswani_is_missing(tmp_path):
    """The folder's own code files (the flat layout's), through `trust_remote_code=True`, in an interpreter where the
    package cannot be imported."""
    code = f"""
import json, sys
sys.modules["vaswani"] = None  # not installed
from transformers import AutoModelForSeq2SeqLM
model = AutoModelForSeq2SeqLM.from_pretrained({str(OLD_FOLDER)!r}, trust_remote_code=True).eval()
assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
EXPECTED = {EXPECTED!r}
{CHECK_AGAINST_THE_OLD_RELEASE}
print("ok")
"""
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]
