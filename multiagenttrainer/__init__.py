"""MultiAgentTrainer: code and knowledge bases in; a corpus, experiments and fine-tuned models out.

The public names are imported on first use (PEP 562), so `mat status` and the other quick commands do
not pay for the experiment loop, the sources and pydantic's models at start-up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from multiagenttrainer.config import Config, load_config
    from multiagenttrainer.errors import ConfigError, MatError, SourceError
    from multiagenttrainer.experiments.runner import Runner
    from multiagenttrainer.ingest import Ingester, IngestResult

__version__ = "0.1.0"

_PUBLIC = {
    "Config": "multiagenttrainer.config",
    "load_config": "multiagenttrainer.config",
    "ConfigError": "multiagenttrainer.errors",
    "MatError": "multiagenttrainer.errors",
    "SourceError": "multiagenttrainer.errors",
    "Runner": "multiagenttrainer.experiments.runner",
    "Ingester": "multiagenttrainer.ingest",
    "IngestResult": "multiagenttrainer.ingest",
}

__all__ = [
    "Config",
    "ConfigError",
    "IngestResult",
    "Ingester",
    "MatError",
    "Runner",
    "SourceError",
    "__version__",
    "load_config",
]


def __getattr__(name: str) -> Any:
    """Import a public name from its module the first time it is asked for."""
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'multiagenttrainer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
