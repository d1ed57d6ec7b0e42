"""Prefect tasks: thin wrappers over `multiagenttrainer` calls, adding cache policies and retries."""

from tasks.ingest import build_corpus, fetch_source, reporting_progress, resolve_source

__all__ = ["build_corpus", "fetch_source", "reporting_progress", "resolve_source"]
