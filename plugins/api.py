"""The host side of plugin API versioning."""

from __future__ import annotations

ENTRY_POINT_GROUP = "interlock.plugins"

# Bumped in the minor place for additions, in the major place for changes that
# break existing plugins. Plugins declare the range they support.
PLUGIN_API_VERSION = "1.0"


def api_incompatibility(supported: str, host: str = PLUGIN_API_VERSION) -> str | None:
    """Why a plugin supporting the version range ``supported`` cannot run on ``host``, or None."""
    from packaging.specifiers import SpecifierSet

    if SpecifierSet(supported).contains(host, prereleases=True):
        return None
    return f"needs plugin API {supported}; this interlock provides {host}"


def check_api_range(value: str) -> str:
    """Validate a declared range such as ``>=1.0,<2``; returns it unchanged."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        SpecifierSet(value)
    except InvalidSpecifier as exc:
        raise ValueError(
            f"plugin_api {value!r} is not a version range (write e.g. '>=1.0,<2'): {exc}"
        ) from None
    if not value.strip():
        raise ValueError("plugin_api must not be empty (write e.g. '>=1.0,<2')")
    return value
