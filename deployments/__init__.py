"""Work pools and deployment registration (`mat deploy`)."""

from deployments.register import DEFAULT_WORK_POOL, register_deployments

__all__ = ["DEFAULT_WORK_POOL", "register_deployments"]
