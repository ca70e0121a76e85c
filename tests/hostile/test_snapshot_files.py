"""Conformance snapshots and what explain/conformance print (issue 28: S5, C10, U6)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

HEADER = json.dumps({"snapshot": {"vllm": "0.0.0"}})
ROW = {
    "architecture": "LlamaForCausalLM", "platform": "cuda", "device_arch": "sm_90", "env": {},
    "runner": "mrv2", "cudagraph": "full_and_piecewise", "breakable": False, "compile": True,
    "capture_sizes": None, "outcome": "decided", "task": "generate",
}
SPOOF = "X\nrunner        mrv1                 spoofed"


def _snapshot(tmp_path: Path, *rows: object, raw: bytes | None = None) -> Path:
    path = tmp_path / "snap.jsonl"
    if raw is None:
        raw = "\n".join([HEADER, *(json.dumps(r) for r in rows)]).encode() + b"\n"
    path.write_bytes(raw)
    return path


def _no_line_starts_with_the_spoof(text: str) -> None:
    for line in text.splitlines():
        assert not line.lstrip().startswith("runner        mrv1"), line


def test_s5_newlines_in_a_config_architecture_are_escaped(cli, tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    for sep in ("\n", "\u2028", "\u2029", "\x85", "\r\n"):
        config = {"architectures": [SPOOF.replace("\n", sep)]}
        (model / "config.json").write_text(json.dumps(config))
        res = cli("explain", "--model", model, "--platform", "cuda")
        assert res.code == 0, res.err
        _no_line_starts_with_the_spoof(res.out)
        for raw in ("\u2028", "\u2029", "\x85"):
            assert raw not in res.out
        assert "X\\" in res.out  # shown as an escape
        # JSON keeps the real string.
        res = cli("explain", "--model", model, "--platform", "cuda", "--json")
        assert res.json()["context"]["architecture"] == SPOOF.replace("\n", sep)


def test_s5_newlines_in_snapshot_fields_are_escaped(cli, tmp_path: Path) -> None:
    row = dict(ROW, architecture=SPOOF, runner="mrv1\nagree 100")
    res = cli("conformance", _snapshot(tmp_path, row))
    assert res.code == 1
    _no_line_starts_with_the_spoof(res.out)
    assert "X\\nrunner" in res.out
    assert not any(line.startswith("agree 100") for line in res.out.splitlines())


def test_s5_newlines_in_a_policy_file_name_are_escaped_in_errors(cli, tmp_path: Path) -> None:
    res = cli("explain", "X", "--platform", "cuda", "--policy", str(tmp_path / "a\nrunner mrv1"))
    assert res.code == 1
    assert len(res.err.splitlines()) == 1 and "a\\nrunner mrv1" in res.err


def test_c10_snapshot_fifo_is_refused_not_waited_on(cli, tmp_path: Path) -> None:
    fifo = tmp_path / "snap.jsonl"
    os.mkfifo(fifo)
    done: list[object] = []
    thread = threading.Thread(target=lambda: done.append(cli("conformance", fifo)), daemon=True)
    thread.start()
    thread.join(20)
    assert done, "policy conformance waited on a FIFO"
    res = done[0]
    assert res.code == 1 and "FIFO" in res.err  # type: ignore[attr-defined]


def test_c10_snapshot_link_to_dev_zero_is_refused(cli, tmp_path: Path) -> None:
    link = tmp_path / "snap.jsonl"
    link.symlink_to("/dev/zero")
    res = cli("conformance", link, "--json")
    assert res.code == 1
    assert "character device" in res.json()["error"]["message"]


@pytest.mark.parametrize(
    ("raw", "where", "words"),
    [
        (HEADER.encode() + b"\n" + b'{"architecture": "a\xffb"}\n', ":2:", "not UTF-8"),
        (("\ufeff" + HEADER).encode("utf-16"), ":1:", "not UTF-8"),
        (HEADER.encode() + b'\n{"x": ' + b"1" * 5000 + b"}\n", ":2", "invalid JSON"),
        (HEADER.encode() + b"\n" + b"[" * 100000 + b"]" * 100000 + b"\n", ":2", "nested"),
        (HEADER.encode() + b"\n" + json.dumps(dict(ROW, capture_sizes=5)).encode(), ":2",
         "capture_sizes must be null or a list of positive integers"),
        (HEADER.encode() + b"\n" + json.dumps(dict(ROW, capture_sizes=[1, "2"])).encode(),
         ":2", "capture_sizes"),
        (HEADER.encode() + b"\n" + json.dumps(dict(ROW, breakable="no")).encode(), ":2",
         "breakable must be a bool"),
        (HEADER.encode() + b"\n" + json.dumps(dict(ROW, outcome="refused", refusal=7)).encode(),
         ":2", "refusal must be a string"),
    ],
    ids=["non-utf8", "utf16", "5000-digits", "deep-nesting", "capture-sizes-int",
         "capture-sizes-str", "breakable-str", "refusal-int"],
)
def test_c10_malformed_snapshots_exit_1_with_file_and_line(
    cli, tmp_path: Path, raw: bytes, where: str, words: str
) -> None:
    path = _snapshot(tmp_path, raw=raw)
    res = cli("conformance", path)
    assert res.code == 1, res.err
    assert "Traceback" not in res.err and "internal error" not in res.err
    assert f"snap.jsonl{where}" in res.err and words in res.err, res.err
    res = cli("conformance", path, "--json")
    assert res.code == 1 and res.json()["error"]["kind"] == "policy"


@pytest.mark.parametrize("key", ["architecture", "platform"])
@pytest.mark.parametrize("value", ["", "  "])
def test_u6_snapshot_rows_with_an_empty_name_give_file_and_line(
    cli, tmp_path: Path, key: str, value: str
) -> None:
    path = _snapshot(tmp_path, ROW, dict(ROW, **{key: value}))
    res = cli("conformance", path, "--json")
    assert res.code == 1
    error = res.json()["error"]
    assert f"{key} must not be empty" in error["message"]
    assert error["location"]["line"] == 3 and error["location"]["file"].endswith("snap.jsonl")
