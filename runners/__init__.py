"""Runners: the runner contract, the built-in runners, and the model execution they share.

Importing this package is cheap and torch-free; torch is imported by the
modules that execute models (``interlock.runners.model.*``, ``interlock.runners.mrv1.runner``, ...).
"""
