"""Runners: the runner contract, the built-in runners, and the model execution they share.

Importing this package is cheap and torch-free; torch is imported by the
modules that execute models (``interlock.runners.model.*``, ``interlock.runners.mrv1.runner``, ...).
"""

if __name__ == "runners":  # the checkout root on sys.path: see core/bare_name.py
    from interlock.core.bare_name import hand_over

    hand_over(__name__, __file__)
