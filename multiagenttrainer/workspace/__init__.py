"""Training workspaces: the built-in autoresearch template and the run-summary parser."""

from multiagenttrainer.workspace.builtin import render_template, write_builtin_data
from multiagenttrainer.workspace.summary import parse_run_summary

__all__ = ["parse_run_summary", "render_template", "write_builtin_data"]
