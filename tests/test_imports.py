"""The package's module structure: every module imports on its own, in a fresh interpreter, and no two modules import
each other, directly or through a chain of module-level imports."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "vaswani"


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (`vaswani.interop.export` for `vaswani/interop/export/__init__.py`)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "sacrebleu_chrf":  # copied out and run by `evaluate`, not a module of the package
            continue
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules that `name` imports at module level (`from .x import`, `from vaswani.x import`,
    `import vaswani.x`), not inside functions."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            candidates = [target] + [f"{target}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        found |= {c for c in candidates if c in modules and c != name}
    return found


# Third-party packages the modules import, loaded once before the forks (no module of this package among them).
_PRELOAD = """
import os, sys, importlib, traceback
import numpy, torch, yaml, datasets, accelerate, huggingface_hub, sacrebleu, tokenizers, tqdm.auto
import transformers
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, GenerationMixin, HfArgumentParser, Seq2SeqTrainer
from matplotlib.backends.backend_agg import FigureCanvasAgg
assert not [m for m in sys.modules if m == "vaswani" or m.startswith("vaswani.")]
failed = []
for name in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:  # a child process with no module of the package imported yet
        try:
            importlib.import_module(name)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    if os.waitpid(pid, 0)[1]:
        failed.append(name)
print("failed:", " ".join(failed))
"""


def test_every_module_imports_alone():
    """Each module, imported first in a process of its own, imports: no module relies on another having been
    imported before it. One fresh interpreter loads the third-party packages once; each module is then imported in a
    fork of it, where no module of this package is loaded yet."""
    names = sorted(_modules())
    run = subprocess.run(
        [sys.executable, "-c", _PRELOAD, *names], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0 and run.stdout.strip() == "failed:", run.stdout + run.stderr[-3000:]


def test_no_import_cycle():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    # A package imports its `__init__` first: `vaswani.x` depends on `vaswani` too, which is no cycle of its own.
    state: dict[str, str] = {}
    cycles = []

    def visit(name: str, chain: list[str]) -> None:
        state[name] = "open"
        for child in sorted(graph[name]):
            if state.get(child) == "open":
                cycles.append(" -> ".join(chain[chain.index(child) :] + [child]))
            elif child not in state:
                visit(child, chain + [child])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
    assert (
        graph["vaswani.recipe.trainer"] and "vaswani.commands.cli" not in graph["vaswani.recipe.run"]
    )  # the walk sees imports


def test_library_modules_never_import_the_command_line():
    """`UsageError` comes from `vaswani.common.errors`; only the tools (`vaswani.commands`) use `vaswani.commands.cli`."""
    modules = _modules()
    users = sorted(
        name
        for name, path in modules.items()
        if "vaswani.commands.cli" in _imports(name, path, modules) and not name.startswith("vaswani.commands")
    )
    assert not users, users


# Runs each tool's --help (`main(["--help"])`) in this process, then names the heavy packages loaded.
_HELP = """
import sys
from importlib import import_module

for name in sys.argv[2:]:
    try:
        import_module(f"vaswani.commands.{name}").main(["--help"])
    except SystemExit as exit:
        assert exit.code in (0, None), (name, exit.code)
heavy = [m for m in sys.argv[1].split(",") if m in sys.modules]
print("loaded:", " ".join(heavy))
"""


def _help_loads(tools: list[str], heavy: list[str]) -> list[str]:
    run = subprocess.run(
        [sys.executable, "-c", _HELP, ",".join(heavy), *tools], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.splitlines()[-1].split()[1:]


def test_a_tools_help_loads_neither_torch_nor_datasets():
    """A tool imports its work when it runs: `--help` of the tools whose flags are not transformers'
    TrainingArguments loads neither torch, transformers' models nor datasets."""
    tools = ["translate", "evaluate", "export", "average_checkpoints", "convert", "plot", "push_to_hub"]
    heavy = ["torch", "datasets", "transformers.modeling_utils", "transformers.training_args", "matplotlib"]
    assert _help_loads(tools, heavy) == []


def test_the_training_help_loads_no_training_code():
    """vaswani-train's flags are transformers' Seq2SeqTrainingArguments (torch), but its --help loads neither the
    data nor the training code."""
    heavy = [
        "datasets",
        "vaswani.recipe.run",
        "vaswani.recipe.trainer",
        "vaswani.recipe.finish",
        "matplotlib",
        "torch",
    ]
    assert _help_loads(["train"], heavy) == ["torch"]


# `import vaswani` (light), something else, then the Auto classes build a vaswani model.
_REGISTRATION = """
import sys
{before}
import vaswani
assert {light} == (not {{"torch", "transformers"}} & set(sys.modules)), "import vaswani loaded torch"
{after}
from transformers import AttentionInterface, AutoConfig, AutoModel, AutoModelForSeq2SeqLM
sizes = dict(d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2)
config = AutoConfig.for_model("vaswani", vocab_size=40, encoder_ffn_dim=32, decoder_ffn_dim=32, **sizes)
assert type(config) is vaswani.VaswaniConfig
assert type(AutoModelForSeq2SeqLM.from_config(config)) is vaswani.VaswaniForConditionalGeneration
assert type(AutoModel.from_config(config)) is vaswani.VaswaniModel
assert "vaswani_sdpa" in AttentionInterface._global_mapping and callable(vaswani.use_cpu_kernels)
assert "VaswaniConfig" in dir(vaswani)
print("registered")
"""


@pytest.mark.parametrize(
    "before, after, light",
    [
        (
            "",
            "from vaswani import VaswaniConfig",
            True,
        ),  # README: the first name taken from the package registers
        ("", "from transformers import PreTrainedModel; vaswani.register()", True),  # docs: the explicit call
        (
            "from transformers import AutoConfig",
            "",
            False,
        ),  # the Auto classes loaded first: the import registers
    ],
)
def test_import_vaswani_registers_the_auto_classes_without_loading_torch_itself(before, after, light):
    """`import vaswani` loads neither torch nor transformers (the tools start quickly); the first name taken from the
    package, or `vaswani.register()`, registers the classes with the Auto classes, and `import vaswani` registers at
    once where the Auto classes are loaded already."""
    code = _REGISTRATION.format(before=before, after=after, light=light)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip() == "registered", run.stderr[-3000:]


def test_import_vaswani_alone_installs_no_import_hook():
    """Registration is a plain call (`vaswani.register`), not a finder on `sys.meta_path` that runs on every import."""
    code = "import sys; before = list(sys.meta_path); import vaswani; assert sys.meta_path == before; print('ok')"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


def test_the_flags_decoding_values_are_the_models():
    """`vaswani.common.flag_choices` (light, for the tools' flags) repeats the values of the model's own modules."""
    from vaswani import generation_vaswani
    from vaswani.common import flag_choices
    from vaswani.interop import export

    for name in (
        "PAPER_NUM_BEAMS",
        "PAPER_LENGTH_PENALTY",
        "PAPER_LENGTH_PENALTY_FORM",
        "LENGTH_PENALTY_FORMS",
    ):
        assert getattr(flag_choices, name) == getattr(generation_vaswani, name), name
    assert export.ENGINES is flag_choices.ENGINES
