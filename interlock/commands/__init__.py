"""Subcommands of ``policy``; :mod:`interlock.cli` states the contract of each module."""
