"""Work pools (pools.py) and deployment registration (register.py): what `mat deploy` creates.

Nothing is imported here, so the light pools module can be used without loading Prefect.
"""
