"""Prefect flows: compositions of the tasks in `tasks/`."""
