"""Issue 24 item 14: a measurement record keeps a digest of each runner and kernel source file it
ran (``software.code``), and ``policy check`` calls its evidence stale once any of them
changed, whatever git dates say; a record without digests says the code is unchecked."""

from __future__ import annotations

import json
from pathlib import Path

from checkout import REPO

from interlock.core.code_digest import changed_code, code_digests

SITE = (REPO / "examples" / "measured-cpu.yaml").read_text()
RECORD = json.loads((REPO / "evidence" / "cpu-demo-2x2.json").read_text())


def bundle(tmp_path: Path, code: dict[str, str] | None) -> Path:
    """The measured-cpu example and its record, copied out of git, with ``code`` digests."""
    (tmp_path / "examples").mkdir()
    (tmp_path / "evidence").mkdir()
    site = tmp_path / "examples" / "measured-cpu.yaml"
    site.write_text(SITE)
    record = json.loads(json.dumps(RECORD))
    if code is None:
        record["software"].pop("code", None)
    else:
        record["software"]["code"] = code
    (tmp_path / "evidence" / "cpu-demo-2x2.json").write_text(json.dumps(record))
    return site


def findings(cli, site: Path) -> list[dict]:
    res = cli("check", "--policy", "@shipped", "--policy", site, "--json")
    return [f for f in res.json()["findings"] if f["code"].startswith("evidence")]


def test_the_digests_cover_the_runners_and_kernels() -> None:
    digests = code_digests()
    assert "runners/graphs/runner.py" in digests and "runners/mrv1/runner.py" in digests
    assert any(name.startswith("kernels/native/") and name.endswith(".c") for name in digests)
    assert changed_code(digests) == []
    assert changed_code({**digests, "runners/mrv1/runner.py": "0" * 16}) == [
        "runners/mrv1/runner.py"
    ]
    # A file the measurement did not run cannot make it stale; one it ran that is gone does.
    assert changed_code({"runners/mrv1/runner.py": digests["runners/mrv1/runner.py"]}) == []
    assert changed_code({"runners/gone.py": "0" * 16}) == ["runners/gone.py"]


def test_a_record_keeps_the_files_the_process_ran() -> None:
    import interlock.runners.mrv1.runner  # noqa: F401  (the runner a bench would run)

    ran = code_digests(loaded=True)
    assert "runners/mrv1/runner.py" in ran and "runners/graphs/runner.py" in ran
    assert set(ran) <= set(code_digests())


def test_unchanged_code_is_said_so(cli, tmp_path) -> None:
    site = bundle(tmp_path, code_digests())
    (note,) = [f for f in findings(cli, site) if f["code"] == "evidence"]
    assert "runner and kernel files it measured are unchanged" in note["message"]
    assert not [f for f in findings(cli, site) if f["code"] == "evidence-stale"]


def test_changed_code_makes_the_evidence_stale(cli, tmp_path) -> None:
    code = code_digests()
    code["runners/graphs/runner.py"] = "0" * 16
    site = bundle(tmp_path, code)
    (stale,) = [f for f in findings(cli, site) if f["code"] == "evidence-stale"]
    assert "the runner and kernel code it measured changed since" in stale["message"]
    assert "runners/graphs/runner.py" in stale["message"]
    res = cli("check", "--policy", "@shipped", "--policy", site, "--strict")
    assert res.code == 1


def test_a_record_without_digests_does_not_claim_fresh_code(cli, tmp_path) -> None:
    site = bundle(tmp_path, None)
    (note,) = [f for f in findings(cli, site) if f["code"] == "evidence"]
    assert "code: the record names no code digests" in note["message"]


def test_the_shipped_record_names_its_code() -> None:
    assert RECORD["software"].get("code"), "evidence/cpu-demo-2x2.json was measured before " \
        "records kept code digests: re-measure it"
    # Measured before `policy bench` was renamed `policy measure`: the record keeps what ran.
    assert RECORD["command"].startswith("policy bench demo --vary runner=mrv1,mrv2")
