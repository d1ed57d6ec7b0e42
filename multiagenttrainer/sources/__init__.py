"""Data sources: one module per `type`, collected in a registry."""

from multiagenttrainer.sources.base import Snapshot, Source, SourceContext, SourceInfo, Tree
from multiagenttrainer.sources.registry import make_source, make_sources, repo_argument_to_source

__all__ = [
    "Snapshot",
    "Source",
    "SourceContext",
    "SourceInfo",
    "Tree",
    "make_source",
    "make_sources",
    "repo_argument_to_source",
]
