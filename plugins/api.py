"""The host side of plugin API versioning."""

from __future__ import annotations

import re

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


# The ranges a plugin may declare: comma-separated clauses over release numbers, a subset
# of PEP 440 specifier sets. Checked without ``packaging``, whose import costs a warm
# ``policy explain`` more than the rest of the plugin layer (the range is re-checked on
# every start, when the registry is rebuilt from its cache).
_CLAUSE = r"(?:~=\s*\d+(?:\.\d+)+|(?:==|!=)\s*\d+(?:\.\d+)*(?:\.\*)?|(?:>=|<=|>|<)\s*\d+(?:\.\d+)*)"
_RANGE = re.compile(rf"\s*{_CLAUSE}\s*(?:,\s*{_CLAUSE}\s*)*")


def check_api_range(value: str) -> str:
    """Validate a declared range such as ``>=1.0,<2``; returns it unchanged."""
    if not value.strip():
        raise ValueError("plugin_api must not be empty (write e.g. '>=1.0,<2')")
    if not _RANGE.fullmatch(value):
        raise ValueError(
            f"plugin_api {value!r} is not a version range: write clauses such as '>=1.0', "
            "'<2', '==1.*' or '~=1.0', separated by commas"
        )
    return value
