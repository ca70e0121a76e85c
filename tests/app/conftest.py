"""A site policy of the kind an operator layers on the shipped one, for the workflow tests."""

from __future__ import annotations

from pathlib import Path

import pytest

SITE = """\
schema_version: 1
version: "site-1"
rules:
  - id: site-mi355x-tp-mrv1
    when: {platform: rocm, device_arch: gfx950, features: {tensor_parallel_size: {gt: 1}}}
    set: {runner: mrv1}
    reason: >-
      on our MI355X hosts tensor-parallel serving measured faster on mrv1 than mrv2
      (the site's own bench, TP=8)
    ref: https://example.invalid/site/bench/2026-11
"""


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """``site.yaml``: one rule, no defaults, so it only loads layered on a base."""
    path = tmp_path / "site.yaml"
    path.write_text(SITE)
    return path


@pytest.fixture
def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """install(dist, entry_points, modules): an installed-looking distribution on sys.path for
    one test; the plugin registry is rediscovered (and not cached) before and after."""
    import sys
    import textwrap

    from plugin_builders import make_dist

    from interlock import plugins

    monkeypatch.setenv("INTERLOCK_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("INTERLOCK_DISABLE_PLUGINS", "INTERLOCK_PLUGINS_STRICT"):
        monkeypatch.delenv(name, raising=False)
    path = list(sys.path)
    site = tmp_path / "site"

    def _install(
        dist: str, entry_points: dict[str, str], modules: dict[str, str], *,
        at: Path | None = None, code_at: Path | None = None,
    ) -> Path:
        """``at``: the site folder (default: one under tmp_path); ``code_at``: where the
        modules live instead, as an editable install keeps them in the project. Returns the
        folder of the modules."""
        root = site if at is None else at
        make_dist(root, dist, "1.0", entry_points, {} if code_at else modules)
        if code_at is not None:
            code_at.mkdir(parents=True, exist_ok=True)
            for module, source in modules.items():
                (code_at / f"{module}.py").write_text(textwrap.dedent(source))
        for folder in (root, code_at):
            if folder is not None and str(folder) not in sys.path:
                sys.path.insert(0, str(folder))
        plugins.reset()
        return root if code_at is None else code_at

    yield _install
    sys.path[:] = path
    for name in [m for m in sys.modules if m.startswith("wf_")]:
        del sys.modules[name]
    plugins.reset()
