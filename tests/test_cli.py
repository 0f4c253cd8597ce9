"""The tools' shared conventions (`vaswani.commands.cli`): console commands, arguments files, flag names, --help, and a
non-editable install that ships the commands and the card template."""

import json
import logging
import os
import re
import shlex
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field

import pytest
import tomllib
from helpers import BIN, ROOT

from vaswani.commands import push_to_hub, train, translate
from vaswani.commands import translate as translate_command
from vaswani.commands.cli import build_parser, command, parse_args, read_arguments_file
from vaswani.common.errors import UsageError

OUR_COMMANDS = {
    "vaswani-train": "vaswani.commands.train:main",
    "vaswani-train-tokenizer": "vaswani.commands.train_tokenizer:main",
    "vaswani-average-checkpoints": "vaswani.commands.average_checkpoints:main",
    "vaswani-translate": "vaswani.commands.translate:main",
    "vaswani-evaluate": "vaswani.commands.evaluate:main",
    "vaswani-plot": "vaswani.commands.plot:main",
    "vaswani-push-to-hub": "vaswani.commands.push_to_hub:main",
    "vaswani-export": "vaswani.commands.export:main",
    "vaswani-convert": "vaswani.commands.convert:main",
}


@dataclass
class Example:
    source_lang: str = field(default="de", metadata={"help": "source"})
    num_beams: int = field(default=4, metadata={"help": "beams"})
    references: list[str] | None = field(default=None, metadata={"help": "files"})
    lowercase: bool = field(default=False, metadata={"help": "lowercase"})


def test_arguments_files_json_and_yaml_with_command_line_overrides(tmp_path):
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("source_lang: en\nnum_beams: 2\nreferences: [a.txt, b.txt]\nlowercase: true\n")
    json_file = tmp_path / "run.json"
    json_file.write_text(json.dumps({"source_lang": "fr", "num_beams": 5}))
    (args,) = parse_args(Example, [str(yaml_file)], description="")
    assert (args.source_lang, args.num_beams, args.references, args.lowercase) == (
        "en",
        2,
        ["a.txt", "b.txt"],
        True,
    )
    (args,) = parse_args(Example, [str(yaml_file), "--num_beams", "8"], description="")  # later flags win
    assert (args.source_lang, args.num_beams) == ("en", 8)
    # the command line overrides the file wherever --args_file stands
    (args,) = parse_args(Example, ["--num_beams=3", "--args_file", str(json_file)], description="")
    assert (args.source_lang, args.num_beams) == ("fr", 3)
    (args,) = parse_args(Example, ["--args_file", str(json_file)], description="")
    assert (args.source_lang, args.num_beams) == ("fr", 5)
    bad = tmp_path / "bad.yaml"
    bad.write_text("num_beams: [1, [2]]\n")
    with pytest.raises(UsageError, match="bad.yaml: num_beams holds a nested list"):
        read_arguments_file(bad)
    bad.write_text("- just\n- a list\n")
    with pytest.raises(UsageError, match="bad.yaml must hold a mapping"):
        read_arguments_file(bad)
    with pytest.raises(UsageError, match="missing.json does not exist"):
        parse_args(Example, ["--args_file", str(tmp_path / "missing.json")], description="")
    with pytest.raises(UsageError, match="unrecognized arguments: --no_such_flag"):
        parse_args(Example, [str(json_file), "--no_such_flag", "1"], description="")


def test_an_arguments_file_is_checked_and_its_values_converted_as_flags_are(tmp_path):
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("source_lang: en\nnum_beam: 2\n")
    with pytest.raises(UsageError, match="unknown.yaml: num_beam is not a flag of"):
        parse_args(Example, [str(unknown)], description="")
    values = tmp_path / "values.yaml"
    values.write_text("num_beams: '7'\nlowercase: 'yes'\nreferences: a.txt\n")  # strings, converted by type
    (args,) = parse_args(Example, [str(values)], description="")
    assert (args.num_beams, args.lowercase, args.references) == (7, True, ["a.txt"])
    values.write_text("num_beams: two\n")
    with pytest.raises(UsageError, match="argument --num_beams: invalid int value: 'two'"):
        parse_args(Example, [str(values)], description="")
    values.write_text("preset: huge\n")
    with pytest.raises(UsageError, match="argument --preset: invalid choice: 'huge'"):
        parse_args(train.ModelArguments, [str(values)], description="")


def test_an_arguments_file_names_its_mistakes_and_keeps_its_values_whole(tmp_path, caplog):
    config = tmp_path / "run.yaml"
    config.write_text("num_beams: [1, 2]\n")  # a list for a flag of one value
    with pytest.raises(
        UsageError, match=r"argument --num_beams: expected one argument, got 2 \(.*run.yaml\)"
    ):
        parse_args(Example, [str(config)], description="")
    config.write_text("no_plots: true\n")  # the negative spelling of a switch is no entry of a file
    with pytest.raises(UsageError, match="run.yaml: no_plots is not a flag of"):
        parse_args(train.FinishArguments, [str(config)], description="")
    config.write_text("source_lang: -x\nbeams: 3\n")  # a value that starts with a dash; a renamed flag
    with caplog.at_level(logging.WARNING, logger="vaswani.commands.cli"):
        (args,) = parse_args(Example, [str(config)], description="", renamed={"beams": "num_beams"})
    assert (args.source_lang, args.num_beams) == ("-x", 3)
    assert "run.yaml: beams is deprecated; use num_beams" in caplog.text
    config.write_text("source_lang: 2024-13-01\n")  # a YAML date that cannot be is named with its file
    with pytest.raises(UsageError, match=r"run.yaml is not valid YAML: month must be in 1\.\.12"):
        parse_args(Example, [str(config)], description="")


def test_a_yaml_learning_rate_arrives_as_a_float_and_the_command_line_wins(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("learning_rate: 1e-3\nwarmup_steps: 10\nbf16: false\naverage_last: [5, 10]\n")
    assert isinstance(__import__("yaml").safe_load(config.read_text())["learning_rate"], str)  # YAML 1.1
    finish_args, training_args = parse_args(
        [train.FinishArguments, train.PaperTrainingArguments],
        [str(config), "--output_dir", str(tmp_path / "run"), "--warmup_steps", "20"],
        description="",
    )
    assert training_args.learning_rate == 1e-3 and isinstance(training_args.learning_rate, float)
    assert training_args.warmup_steps == 20 and finish_args.average_last == [5, 10]
    finish_args, _ = parse_args(
        [train.FinishArguments, train.PaperTrainingArguments],
        [str(config), "--average_last", "3", "--output_dir", str(tmp_path / "run")],
        description="",
    )
    assert finish_args.average_last == [3]


def test_the_training_arguments_file_carries_model_config_and_trainer_flags(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        "dataset_name: somewhere\npreset: small\nd_model: 64\nnormalize_before: true\nmax_steps: 10\n"
        "fsdp_config: {min_num_params: 0}\nlearning_rate: 2.0\n"
    )
    model_args, config_args, data_args, _, training_args = parse_args(
        [train.ModelArguments, train.ModelConfigArguments, train.DataArguments, train.FinishArguments]
        + [train.PaperTrainingArguments],
        [str(config), "--output_dir", str(tmp_path / "run")],
        description="",
    )
    assert model_args.preset == "small" and data_args.dataset_name == "somewhere"
    assert (config_args.d_model, config_args.normalize_before) == (64, True)
    assert training_args.max_steps == 10 and training_args.learning_rate == 2.0


def test_renamed_flags_still_work_and_warn(caplog):
    with caplog.at_level(logging.WARNING, logger="vaswani.commands.cli"):
        (args,) = parse_args(Example, ["--src_lang=en", "--beams", "2"], description="", renamed={
            "src_lang": "source_lang", "beams": "num_beams"
        })  # fmt: skip
    assert (args.source_lang, args.num_beams) == ("en", 2)
    assert "--src_lang is deprecated; use --source_lang" in caplog.text
    assert "--beams is deprecated; use --num_beams" in caplog.text


def test_one_line_errors_exit_statuses_and_debug(capsys):
    @command("vaswani-example")
    def main(argv):
        (args,) = parse_args(Example, argv, description="")
        if args.num_beams == 7:
            raise FileNotFoundError(2, "No such file or directory", "/data/x.de")
        if args.num_beams == 8:
            raise KeyError("oops")
        return args

    assert main(["--num_beams", "2"]).num_beams == 2
    for argv, status, message in [
        (
            ["--num_beams", "two"],
            2,
            "vaswani-example: error: argument --num_beams: invalid int value: 'two' "
            "(vaswani-example --help lists the flags)",
        ),
        (
            ["--num_beams", "7"],
            1,
            "vaswani-example: error: [Errno 2] No such file or directory: '/data/x.de'",
        ),
        (
            ["--num_beams", "8"],
            1,
            "vaswani-example: error: KeyError: 'oops' (run with --debug for the traceback)",
        ),
    ]:
        with pytest.raises(SystemExit) as exit:
            main(argv)
        assert exit.value.code == status
        assert capsys.readouterr().err == message + "\n"
    with pytest.raises(KeyError):
        main(["--num_beams", "8", "--debug"])


def test_train_help_lists_every_flag_by_group(capsys):
    with pytest.raises(SystemExit) as exit:
        train.main(["--help"])
    assert exit.value.code == 0
    text = capsys.readouterr().out
    for title in (
        "Train the Transformer",
        "model configuration (VaswaniConfig fields",
        "the paper's training recipe (§5",
        "data:",
        "after training (§6.1)",
        "common to every vaswani tool",
        "examples:",
    ):
        assert title in text, title
    for flag in (
        "--d_model",
        "--normalize_before",
        "--warmup_steps",
        "--label_smoothing_factor",
        "--dataset_name",
        "--average_last",
        "--args_file",
        "--torch_compile_mode",  # one of the Trainer's own flags
        "--fsdp",
    ):
        assert flag in text, flag
    with pytest.raises(SystemExit) as exit:
        train.main(["--help_all"])  # still accepted: the same help
    assert exit.value.code == 0 and capsys.readouterr().out == text


def test_train_help_lists_the_recipe_first_and_the_rest_of_the_trainer_last(capsys):
    """`vaswani-train --help` shows each flag once, under one name, in transformers' examples' order: model, data,
    the training recipe, what follows training, the common flags; the rest of Seq2SeqTrainingArguments comes last."""
    with pytest.raises(SystemExit):
        train.main(["--help"])
    text = capsys.readouterr().out
    titles = [
        "model:",
        "model configuration (VaswaniConfig fields",
        "data:",
        "the paper's training recipe (§5",
        "after training (§6.1):",
        "common to every vaswani tool:",
        "the rest of transformers' Seq2SeqTrainingArguments",
        "examples:",
    ]
    starts = [text.index("\n" + title) for title in titles]
    assert starts == sorted(starts), titles
    recipe = text[starts[3] : starts[4]]
    trainer = text[starts[6] : starts[7]]
    for flag in (
        "--warmup_steps",
        "--max_tokens",
        "--batch_tokens",
        "--label_smoothing_factor",
        "--save_minutes",
    ):
        assert f"\n  {flag} " in recipe, flag
    for flag in ("--torch_compile_mode", "--fsdp", "--gradient_accumulation_steps", "--seed"):
        assert f"\n  {flag} " in trainer and f"\n  {flag} " not in recipe, flag
    assert "--learning_rate, --lr LEARNING_RATE" in recipe
    assert "--warmup-steps" not in text and "(default: None)" not in text


def test_pyproject_installs_a_console_command_per_tool():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {name: scripts[name] for name in OUR_COMMANDS} == OUR_COMMANDS
    for name, target in OUR_COMMANDS.items():
        module, function = target.split(":")
        assert callable(getattr(__import__(module, fromlist=[function]), function)), name
        assert (BIN / name).is_file(), f"{name} is not installed in this environment"


def _commands_in(text: str) -> list[list[str]]:
    """The `vaswani-*` command lines of a document (continuation lines joined)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    found = []
    for line in joined.splitlines():
        match = re.search(r"(?:^|\s|-m )(vaswani-[a-z-]+|vaswani\.commands\.[a-z_]+)( .*)?$", line)
        if match and not line.lstrip().startswith(("#", "|")):
            found.append([match.group(1), *shlex.split((match.group(2) or "").split(" #")[0], posix=True)])
    return found


def test_documented_commands_use_flags_the_tools_have():
    """Every `vaswani-*` command in the READMEs, docs/ and the Makefile parses with the current flags and no renamed one."""
    from vaswani.commands import average_checkpoints, evaluate, plot, train_tokenizer

    tools = {
        "train": train,
        "translate": translate,
        "push-to-hub": push_to_hub,
        "average-checkpoints": average_checkpoints,
        "evaluate": evaluate,
        "train-tokenizer": train_tokenizer,
        "plot": plot,
    }
    makefile = (ROOT / "Makefile").read_text().replace("$(BIN)/vaswani-", "vaswani-")
    commands = _commands_in((ROOT / "README.md").read_text()) + _commands_in(makefile)
    commands += _commands_in((ROOT / "recipes" / "README.md").read_text())
    for page in sorted((ROOT / "docs").glob("*.md")):  # the README's detail pages
        commands += _commands_in(page.read_text())
    assert any(c[0] == "vaswani-train" for c in commands) and any(
        c[0] == "vaswani-translate" for c in commands
    )
    for tokens in commands:
        name = tokens[0].removeprefix("vaswani-").removeprefix("vaswani.commands.").replace("_", "-")
        if name not in tools:
            continue  # vaswani-export, vaswani-convert: other tools' own tests
        flags = {t.split("=")[0].lstrip("-").replace("-", "_") for t in tokens[1:] if t.startswith("--")}
        module = tools[name]
        for old in getattr(module, "RENAMED", {}):
            assert old not in flags or name == "plot", f"{' '.join(tokens)} uses the renamed --{old}"
        if name == "plot":
            continue
        types = [
            getattr(module, n)
            for n in dir(module)
            if n.endswith("Arguments") and isinstance(getattr(module, n), type)
        ]
        parser = build_parser(types, description="")
        known = {a.dest for a in parser._actions} | {
            o.lstrip("-") for a in parser._actions for o in a.option_strings
        }
        unknown = sorted(f for f in flags if f not in known)
        assert not unknown, f"{' '.join(tokens)}: unknown {unknown}"


def test_a_wheel_ships_the_commands_and_the_card_template(tmp_path):
    """`pip install .` (not editable): the wheel's entry points name every command, and `vaswani-push-to-hub`
    installed from it finds `hub_card.md` inside the package, from outside the repository."""
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(wheels), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("vaswani_transformer-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(archive.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert "vaswani/publishing/hub_card.md" in names and "vaswani/commands/translate.py" in names
    for name, target in OUR_COMMANDS.items():
        assert f"{name} = {target}" in entry_points
    target = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(target), str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-3000:]
    from helpers import tiny_tokenizer, translation_model

    model_dir = tmp_path / "model"
    tokenizer = tiny_tokenizer()
    translation_model(len(tokenizer)).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    env = {**os.environ, "PYTHONPATH": str(target), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    where = subprocess.run(
        [sys.executable, "-c", "import vaswani.publishing.model_card as m; print(m.__file__); print(m.DEFAULT_TEMPLATE)"],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    module_file, template = where.stdout.split()
    assert module_file.startswith(str(target)) and template.startswith(str(target)), where.stdout
    arguments = tmp_path / "publish.yaml"  # the arguments file works from the installed command too
    arguments.write_text(f"model_name_or_path: {model_dir}\ndry_run: true\nhub_model_id: someone/tiny\n")
    published = subprocess.run(
        [str(target / "bin" / "vaswani-push-to-hub"), str(arguments), "--output_dir", str(tmp_path / "hub")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert published.returncode == 0, published.stderr[-3000:]
    card = (tmp_path / "hub" / "README.md").read_text()
    assert 'pipeline("translation"' in card and "someone/tiny" in card


def test_every_tool_lives_in_commands_and_each_script_calls_it():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert all(target.startswith("vaswani.commands.") for target in scripts.values()), scripts
    modules = {target.split(":")[0].rsplit(".", 1)[1] for target in scripts.values()}
    assert {path.stem for path in (ROOT / "scripts").glob("*.py")} == modules
    for module in modules:
        text = (ROOT / "scripts" / f"{module}.py").read_text()
        assert f"from vaswani.commands.{module} import main\n" in text, module


def test_an_unknown_flag_is_reported_before_the_values_are_checked():
    with pytest.raises(UsageError, match="unrecognized arguments: --no_such_flag"):
        parse_args(
            translate.TranslationArguments,
            ["--model_name_or_path", "m", "--num_beams", "0", "--no_such_flag"],
            description="",
        )
    with pytest.raises(UsageError, match="--num_beams"):
        parse_args(
            translate.TranslationArguments, ["--model_name_or_path", "m", "--num_beams", "0"], description=""
        )


def test_fairseq_and_run_translation_flag_names_mean_what_they_mean_there(tmp_path):
    """fairseq's --beam, --nbest, --lenpen and --lr are taken by their full names (no argparse prefixes), and
    vaswani-translate takes the shared flags (--source_lang) as every tool does."""
    from vaswani.recipe.arguments import FinishArguments, PaperTrainingArguments

    tools = [translate.TranslationArguments, translate.ScoringArguments]
    args, _ = parse_args(
        tools,
        ["--model_name_or_path", "m", "--beam", "5", "--nbest", "2", "--lenpen", "1.2"]
        + ["--source_lang", "de", "--target_lang", "en", "--input", "test.de"],
        description="",
    )
    assert (args.num_beams, args.n_best, args.length_penalty, args.length_penalty_form) == (
        5,
        2,
        1.2,
        "power",
    )
    assert (args.source_lang, args.target_lang) == ("de", "en")
    (finish,) = parse_args(FinishArguments, ["--beam", "6", "--lenpen", "1.0"], description="")
    assert (finish.num_beams, finish.length_penalty, finish.length_penalty_form) == (6, [1.0], "power")
    config = tmp_path / "run.yaml"
    config.write_text("lr: 2e-4\nbeam: 3\n")
    (training, finish) = parse_args(
        [PaperTrainingArguments, FinishArguments],
        [str(config), "--output_dir", str(tmp_path)],
        description="",
    )
    assert (training.learning_rate, finish.num_beams) == (2e-4, 3)
    for argv, message in (
        (["--lenpen", "1", "--length_penalty_form", "gnmt"], "--lenpen is fairseq's length penalty"),
        (["--lenpen", "1", "--length_penalty", "0.6"], "give one of them"),
        (["--num_be", "3"], "unrecognized arguments: --num_be"),  # a prefix is never another flag
        (
            ["--source_lang", "de", "--target_lang", "en", "--input", "test.en"],
            "--input test.en is named as en",
        ),
        (["--source_lang", "de", "--target_lang", "de"], "--source_lang and --target_lang are both 'de'"),
    ):
        with pytest.raises(UsageError, match=re.escape(message)):
            parse_args(tools, ["--model_name_or_path", "m", *argv], description="")
    help_text = build_parser(tools, description="").format_help()
    assert "--lenpen" in help_text and "--beam" in help_text and "--nbest" in help_text


def test_two_names_of_one_flag_with_different_values_are_refused(tmp_path, capsys):
    """Two names of one flag (fairseq's and transformers', a renamed flag and its new name, --flag and --no_flag)
    with different values are refused by name, before any work; the same value under both names is accepted."""
    run = tmp_path / "run"
    for main, argv, shown in (
        (train.main, ["--lr", "1e-4", "--learning_rate", "2e-4"], "--lr 1e-4 and --learning_rate 2e-4"),
        (train.main, ["--beam", "4", "--num_beams=5"], "--beam 4 and --num_beams=5"),
        (train.main, ["--data", "a", "--dataset_name", "b"], "--data a and --dataset_name b"),
        (train.main, ["--plots", "--no_plots"], "--plots and --no_plots"),
        (train.main, ["--max_tokens", "100", "--max-tokens", "200"], "--max_tokens 100 and --max-tokens 200"),
        (
            translate.main,
            ["--model_name_or_path", "m", "--nbest", "2", "--n_best", "3"],
            "--nbest 2 and --n_best 3",
        ),
        (
            translate.main,
            ["--model", "a", "--model_name_or_path", "b"],
            "--model a and --model_name_or_path b",
        ),
    ):
        with pytest.raises(SystemExit) as exit:
            main([*argv, "--output_dir", str(run)] if main is train.main else argv)
        assert exit.value.code == 2, argv
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and f"{shown} are two names of one flag" in error, error
        assert not run.exists()
    config = tmp_path / "run.yaml"
    config.write_text("lr: 1e-4\nlearning_rate: 2e-4\n")
    with pytest.raises(SystemExit) as exit:
        train.main([str(config), "--output_dir", str(run)])
    assert exit.value.code == 2 and "run.yaml: lr and learning_rate are two names" in capsys.readouterr().err
    config.write_text("lenpen: 1.5\n")  # fairseq's length penalty in a file, as on the command line
    (finish,) = parse_args([train.FinishArguments], [str(config)], description="")
    assert (finish.length_penalty, finish.length_penalty_form) == ([1.5], "power")
    config.write_text("lenpen: 1.0\nlength_penalty: 0.6\n")
    with pytest.raises(UsageError, match="lenpen is fairseq's name of length_penalty"):
        parse_args([train.FinishArguments], [str(config)], description="")
    assert not run.exists()
    # the same value under two names, or the same name twice (argparse: the last wins), is accepted
    config.write_text("lr: 1e-4\nlearning_rate: 0.0001\n")
    (training,) = parse_args(
        train.PaperTrainingArguments, [str(config), "--output_dir", str(run)], description=""
    )
    assert training.learning_rate == 1e-4
    (training,) = parse_args(
        train.PaperTrainingArguments,
        ["--lr", "1e-4", "--learning_rate", "0.0001", "--warmup_steps", "5", "--warmup_steps", "6"]
        + ["--output_dir", str(run)],
        description="",
    )
    assert (training.learning_rate, training.warmup_steps) == (1e-4, 6)


def test_debug_shows_the_traceback(model_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="No model folder"):
        translate_command.main(["--model_name_or_path", str(tmp_path / "nowhere"), "--debug"])


def test_no_tool_prints_library_noise_while_it_imports():
    """`vaswani-train` and `vaswani-train-tokenizer` import transformers' training arguments (torch, torchao) with
    their flags: the noise filters are in place before any tool's imports (`vaswani.commands` loads `cli` first)."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for tool in scripts:
        done = subprocess.run([BIN / tool, "--help"], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and "usage" in done.stdout and done.stderr == "", (tool, done.stderr[-2000:])


def test_a_tool_prints_nothing_of_what_its_libraries_say_to_their_developers(model_dir, tmp_path):
    """Every tool printed torchao's failure to load extensions built for Python 3.10 and CUDA sm_90a, torch's
    deprecation of torchao's `register_constant` calls, and (int8) torchao's missing Triton: each is silenced by its
    exact text (`cli.NOISE`), and the tool logs only its own lines."""
    source = tmp_path / "src.de"
    source.write_text("Ein Mann .\n")
    for extra in ([], ["--quantization", "int8"]):
        done = subprocess.run(
            [BIN / "vaswani-translate", "--model_name_or_path", model_dir, "--input", source, "--no_progress", *extra],
            capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        for noise in ("Failed to load", "register_constant", "Detected no triton"):
            assert noise not in done.stderr, done.stderr
        assert [line for line in done.stderr.splitlines() if " INFO vaswani." not in line] == [], done.stderr
