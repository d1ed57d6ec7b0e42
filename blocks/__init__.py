"""Prefect Blocks mat uses: Secret blocks standing in for tokens missing from the environment."""

from blocks.secrets import environment_with_secrets, load_secret, save_secret, secret_block_name

__all__ = ["environment_with_secrets", "load_secret", "save_secret", "secret_block_name"]
