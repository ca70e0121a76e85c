"""Subcommands of ``policy``; see :mod:`policy.cli` for the contract each module follows."""
