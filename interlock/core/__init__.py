"""The core layer: what every other layer may use (errors, suggestions, the disk cache, the
decision vocabulary, platform detection). It imports nothing else from interlock."""
