"""Items 1-4 of the hostile-inputs issue: the cache, shard paths, `diff git:`, terminal escapes."""

from __future__ import annotations

import os
import pickle
import stat
from pathlib import Path

import pytest

from interlock.core import disk_cache
from interlock.policy import load_policy, make_context, resolve


class _Exploit:
    """Pickled, this would create ``marker`` when unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


def _entries(kind: str = "policy") -> list[Path]:
    return sorted(disk_cache.cache_dir().glob(f"{kind}-*.entry"))


def test_01_cache_never_unpickles_a_planted_entry(policy_file: Path, tmp_path: Path) -> None:
    from interlock import plugins

    load_policy([policy_file])
    plugins.reset()
    plugins.load_registry()
    marker = tmp_path / "pwned"
    for entry in [*_entries("policy"), *_entries("plugins")]:
        entry.write_bytes(pickle.dumps(_Exploit(marker)))
    plugins.reset()
    assert "mrv1" in plugins.load_registry().runner_names()
    policy = load_policy([policy_file])
    assert policy.defaults["runner"].value == "mrv2"
    assert not marker.exists()
    # The rebuilt entries are plain data again.
    assert all(e.read_bytes().startswith(b"interlock-cache 1 ") for e in _entries())


def test_01_cache_directory_is_created_private(policy_file: Path) -> None:
    load_policy([policy_file])
    assert stat.S_IMODE(disk_cache.cache_dir().stat().st_mode) == 0o700


def test_01_group_writable_cache_directory_is_refused(
    policy_file: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    directory = disk_cache.cache_dir()
    directory.mkdir(mode=0o700)
    directory.chmod(0o777)
    load_policy([policy_file])
    load_policy([policy_file])
    assert _entries() == []
    err = capfd.readouterr().err
    assert err.count("running without the cache") == 1
    assert "writable by group or others (mode 0777)" in err


def test_01_foreign_cache_directory_is_refused(
    policy_file: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    disk_cache.cache_dir().mkdir(mode=0o700)
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(policy_file).st_uid + 1)
    assert load_policy([policy_file]).version == "t1"
    assert _entries() == []
    assert "not by you" in capfd.readouterr().err


def test_01_symlinked_entry_is_not_followed(policy_file: Path, tmp_path: Path) -> None:
    load_policy([policy_file])
    (entry,) = _entries()
    elsewhere = tmp_path / "victim"
    elsewhere.write_bytes(entry.read_bytes())
    entry.unlink()
    entry.symlink_to(elsewhere)
    before = elsewhere.read_bytes()
    assert disk_cache.read_entry("policy", entry.name[len("policy-") : -len(".entry")]) is None
    load_policy([policy_file])  # a miss: rebuilt, and the link is replaced, not written through
    assert not entry.is_symlink()
    assert elsewhere.read_bytes() == before


def test_01_symlinked_cache_directory_is_refused(
    policy_file: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    disk_cache.cache_dir().symlink_to(real)
    load_policy([policy_file])
    assert list(real.iterdir()) == []
    assert "is a symbolic link" in capfd.readouterr().err


def test_01_tampered_entry_costs_a_rebuild(policy_file: Path) -> None:
    load_policy([policy_file])
    (entry,) = _entries()
    data = entry.read_bytes()
    entry.write_bytes(data.replace(b'"mrv2"', b'"mrv1"'))  # payload edited, digest kept
    assert load_policy([policy_file]).defaults["runner"].value == "mrv2"
    assert entry.read_bytes() == data


def test_01_entry_renamed_over_another_key_is_refused(policy_file: Path, tmp_path: Path) -> None:
    other = tmp_path / "q.yaml"
    other.write_text(policy_file.read_text().replace("runner: mrv2", "runner: mrv1"))
    load_policy([other])
    (planted,) = _entries()
    planted_bytes = planted.read_bytes()
    planted.unlink()
    load_policy([policy_file])
    (entry,) = _entries()
    entry.write_bytes(planted_bytes)  # valid digest, but for the other key
    assert load_policy([policy_file]).defaults["runner"].value == "mrv2"


def test_01_well_formed_json_of_the_wrong_shape_is_rebuilt(policy_file: Path) -> None:
    load_policy([policy_file])
    (entry,) = _entries()
    key = entry.name[len("policy-") : -len(".entry")]
    for junk in ({}, [], {"catalog": "x"}, {"rules": [{"id": 1}]}, 7):
        assert disk_cache.write_json("policy", key, junk)
        policy = load_policy([policy_file])
        assert policy.defaults["runner"].value == "mrv2"
        ctx = make_context("DsaModel", platform="cuda", features={"tensor_parallel_size": 2})
        assert resolve(policy, ctx).decision.runner == "mrv1"
