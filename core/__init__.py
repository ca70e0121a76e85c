"""The core layer: what every other layer may use (errors, suggestions, the disk cache, the
decision vocabulary, platform detection). It imports nothing else from interlock.

A root folder, like policy/ and runners/, installed as ``interlock.core``."""

if __name__ == "core":  # the checkout root on sys.path: see core/bare_name.py
    from interlock.core.bare_name import hand_over

    hand_over(__name__, __file__)
