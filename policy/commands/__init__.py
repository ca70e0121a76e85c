"""Subcommands of ``policy``; :mod:`interlock.policy.cli` states the contract of each module."""
