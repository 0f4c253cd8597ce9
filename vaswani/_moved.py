"""The recipe, interop and publishing modules used to sit at the package's top (`vaswani.data`, `vaswani.run`,
`vaswani.export`, ...); they live in layer subpackages now (`vaswani.recipe.data`, ...). `import vaswani.data`
still works: this finder answers an old name with the module at its new place (the same module object, so a patch
through either name reaches both) and warns once with the new name."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

_RECIPE = (
    "arguments averaging batching callbacks checkpoints checks config_arguments data distributed evaluation finish "
    "losses metrics plotting run run_folder schedule summary tokenization trainer translation"
).split()
MOVED = {f"vaswani.{name}": f"vaswani.recipe.{name}" for name in _RECIPE} | {
    "vaswani.recipe_flags": "vaswani.recipe.flags",
    "vaswani.convert": "vaswani.interop.convert",
    "vaswani.engines": "vaswani.interop.engines",
    "vaswani.export": "vaswani.interop.export",
    "vaswani.hub": "vaswani.publishing.hub",
    "vaswani.model_card": "vaswani.publishing.model_card",
    "vaswani.errors": "vaswani.common.errors",
    "vaswani.fileio": "vaswani.common.fileio",
    "vaswani.cli": "vaswani.commands.cli",
}


def new_name(name: str) -> str | None:
    """The current name of an old module name (or of a submodule of an old package), else None."""
    for old, new in MOVED.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old) :]
    return None


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec):
        module = importlib.import_module(self.new)
        self.own_spec = module.__spec__
        warnings.warn(f"{spec.name} is now {self.new}; import it from there.", FutureWarning, stacklevel=2)
        return module

    def exec_module(self, module):
        # Already executed at its new place; the import system stamped the old name's spec on it: give its own back.
        module.__spec__ = self.own_spec


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = new_name(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
    # First in line: an old package's submodule (`vaswani.export.to_onnx`) would otherwise be found again by the
    # path finder through the old package's `__path__` and executed a second time under the old name.
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
