"""Thin Dagster assets, one module per stage; asset key prefixes match Iceberg namespaces."""

from assets.raw import raw_assets


def all_assets() -> list:
    return [*raw_assets()]


__all__ = ["all_assets"]
