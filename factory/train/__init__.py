"""The training engine: model, trainer loop, checkpoints, guards, replica checks, metrics.

Run it with `python -m factory.train` (see `__main__`), or through the `training_run` asset.
"""
