"""Registering `model_type="vaswani"` with transformers' Auto classes as soon as they are loaded, not before.

`import vaswani` registers the classes (`AutoConfig`, `AutoModel`, `AutoModelForSeq2SeqLM` then build and load
`model_type="vaswani"`), but the classes need torch and transformers' modelling code: seconds of imports that a
tool's `--help`, or a tool that scores text files, never uses. So `import vaswani` registers at once only when
transformers' Auto classes are already loaded; otherwise it watches the imports of `transformers` and `vaswani`
modules (`_Watcher`) and registers when the first import that loaded the Auto classes' configuration mapping
(`AUTO_MODULE`) has finished, no module of either package being half-executed then. Every way to an Auto class
imports that mapping first, so the classes are registered before an Auto class can look for them:

    import vaswani                                    # light: nothing of torch or transformers
    from transformers import AutoModelForSeq2SeqLM    # loads the Auto classes; vaswani registers here
    AutoModelForSeq2SeqLM.from_config(vaswani.VaswaniConfig(...))
"""

from __future__ import annotations

import importlib.abc
import sys
import threading

# The module of transformers' Auto configuration mapping: every Auto class imports it.
AUTO_MODULE = "transformers.models.auto.configuration_auto"
_WATCHED = ("transformers", "vaswani")

_lock = threading.RLock()
_importing = threading.local()  # how many watched modules this thread is executing
_registered = False


def register() -> None:
    """Register the configuration and the model classes with the Auto classes (and `attn_implementation=
    "vaswani_sdpa"`), once; stop watching imports."""
    global _registered
    with _lock:
        if _registered:
            return
        _registered = True  # the imports below pass through the watcher
        try:
            from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

            from . import kernels  # noqa: F401 (registers attn_implementation="vaswani_sdpa")
            from .configuration_vaswani import VaswaniConfig
            from .modeling_vaswani import VaswaniForConditionalGeneration, VaswaniModel

            AutoConfig.register("vaswani", VaswaniConfig, exist_ok=True)
            AutoModel.register(VaswaniConfig, VaswaniModel, exist_ok=True)
            AutoModelForSeq2SeqLM.register(VaswaniConfig, VaswaniForConditionalGeneration, exist_ok=True)
        except BaseException:
            _registered = False
            raise
        sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _Watcher)]


def register_when_auto_classes_load() -> None:
    """Register now if transformers' Auto classes are loaded, else as soon as they are (see the module docstring)."""
    if AUTO_MODULE in sys.modules:
        register()
    elif not any(isinstance(finder, _Watcher) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Watcher())


class _Watcher(importlib.abc.MetaPathFinder):
    """Finds a `transformers` or `vaswani` module as the other finders do, and gives it a loader that registers the
    classes after executing it (`_Loader`)."""

    def find_spec(self, fullname, path, target=None):
        if fullname.partition(".")[0] not in _WATCHED or _registered:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


class _Loader:
    """A module's own loader (every other attribute is its), whose `exec_module` registers the classes when it has
    executed the outermost watched module of this thread and the Auto classes are loaded."""

    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        depth = getattr(_importing, "depth", 0)
        _importing.depth = depth + 1
        try:
            self._loader.exec_module(module)
        finally:
            _importing.depth = depth
        if depth == 0 and AUTO_MODULE in sys.modules:
            register()
