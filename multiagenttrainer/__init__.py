"""MultiAgentTrainer: code and knowledge bases in; a corpus, experiments and fine-tuned models out."""

from multiagenttrainer.config import Config, load_config
from multiagenttrainer.errors import ConfigError, MatError, SourceError
from multiagenttrainer.experiments.runner import Runner
from multiagenttrainer.ingest import Ingester, IngestResult

__version__ = "0.1.0"

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
