"""Fine-tuning backends as the config sees them: each name and the model of its `finetuner.<name>:` section.

The built-in backends (`opensource`, `bedrock`) are registered by config/__init__.py. A plugin adds one
with `multiagenttrainer.finetune.register_backend(name, FineTunerClass, ConfigModel)`, which registers
its section here, so `finetuner.backend: <name>`, `targets[].backend: <name>` and a `finetuner.<name>:`
section validate with no edit to this package.

Plugins are imported before a config is validated (`load_plugins`): every module named in MAT_PLUGINS
(comma-separated), and every entry point of the group `multiagenttrainer.backends` of the installed
distributions. A plugin that cannot be imported is a config error naming it.
"""

from __future__ import annotations

import importlib
import os
import re
import threading
from collections.abc import Callable
from functools import partial
from importlib.metadata import entry_points

from pydantic import BaseModel

from multiagenttrainer.errors import ConfigError

PLUGINS_ENV = "MAT_PLUGINS"
ENTRY_POINT_GROUP = "multiagenttrainer.backends"
RESERVED_NAMES = frozenset({"backend", "jobs_dir", "targets"})  # finetuner's own fields
_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")

BACKEND_SECTIONS: dict[str, type[BaseModel]] = {}
_loaded: set[str] = set()  # plugins already imported (module names and entry points)
_lock = threading.Lock()


def register_backend_section(name: str, model: type[BaseModel]) -> None:
    """Accept `name` as a backend and validate its `finetuner.<name>:` section with `model`."""
    if not _NAME.fullmatch(name) or name in RESERVED_NAMES:
        raise ValueError(
            f"backend name {name!r}: use lower-case letters, digits and _, starting with a letter, "
            f"and none of {', '.join(sorted(RESERVED_NAMES))}"
        )
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise TypeError(f"backend {name!r}: its config model must be a pydantic model class, got {model!r}")
    BACKEND_SECTIONS[name] = model


def registered_backends() -> list[str]:
    """The backend names a config may use, sorted."""
    return sorted(BACKEND_SECTIONS)


def unknown_backend_message(name: str) -> str:
    """Why `name` is refused, with the registered names and how to add one."""
    return (
        f"unknown backend {name!r}; registered backends: {', '.join(registered_backends())} "
        f"(a plugin registers more: name its module in {PLUGINS_ENV} or install it with an entry point "
        f"in the group {ENTRY_POINT_GROUP})"
    )


def load_plugins() -> None:
    """Import the plugins of MAT_PLUGINS and the entry points, once each; ConfigError naming a broken one."""
    with _lock:
        problems = [problem for loader in _plugin_loaders() if (problem := _load_once(*loader))]
    if problems:
        raise ConfigError(problems)


def _plugin_loaders() -> list[tuple[str, str, Callable[[], object]]]:
    """(key, label, load) for every plugin: the modules in MAT_PLUGINS, then the entry points."""
    names = [n.strip() for n in os.environ.get(PLUGINS_ENV, "").split(",") if n.strip()]
    loaders: list[tuple[str, str, Callable[[], object]]] = [
        (name, f"{PLUGINS_ENV}: plugin module {name!r}", partial(importlib.import_module, name))
        for name in names
    ]
    for point in entry_points(group=ENTRY_POINT_GROUP):
        label = f"entry point {point.name!r} ({point.value}) of the group {ENTRY_POINT_GROUP}"
        loaders.append((f"{point.name}={point.value}", label, point.load))
    return loaders


def _load_once(key: str, label: str, load: Callable[[], object]) -> str | None:
    """Run `load` unless `key` was loaded before; the problem line when it raises."""
    if key in _loaded:
        return None
    try:
        load()
    except Exception as exc:  # a plugin is third-party code: any failure is reported, named
        return f"{label} cannot be loaded ({type(exc).__name__}: {exc}); install it, fix it or remove it"
    _loaded.add(key)
    return None
