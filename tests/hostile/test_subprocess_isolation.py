"""Security items of the second hostile pass (issue 28): S2-S5."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from interlock.core.git import run_git
from interlock.policy.evidence import staleness

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _plain_git(repo: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, check=False)


@pytest.fixture
def bundle(tmp_path: Path) -> tuple[Path, Path]:
    """A committed policy and record in a repository whose ``.git/config`` names ``evil``
    (a script appending to ``marker``) for every config key that runs a program."""
    repo, marker = tmp_path / "bundle", tmp_path / "marker"
    (repo / "evidence").mkdir(parents=True)
    (repo / "policy.yaml").write_text("a: 1\nb: 2\n")
    (repo / "evidence" / "r.json").write_text("{}\n")
    (repo / ".gitattributes").write_text("* diff=x filter=y\n")
    _plain_git(repo, "init", "-q")
    _plain_git(repo, "add", ".")
    _plain_git(repo, "commit", "-qm", "bundle")
    evil = tmp_path / "evil.sh"
    evil.write_text(f'#!/bin/sh\necho "$0" >> {marker}\ncat\n')
    evil.chmod(0o755)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    for hook in ("post-index-change", "post-checkout", "reference-transaction"):
        shutil.copy(evil, hooks / hook)
    for key, value in {
        "core.fsmonitor": evil, "core.hooksPath": hooks, "core.pager": evil,
        "diff.external": evil, "diff.x.textconv": evil, "diff.x.command": evil,
        "filter.y.clean": evil, "filter.y.smudge": evil, "log.showSignature": "true",
        "gpg.program": evil,
    }.items():
        _plain_git(repo, "config", key, str(value))
    return repo, marker


def _stat_dirty(repo: Path) -> None:
    """Touch the files so that git must re-read them (where filters and hooks run)."""
    for path in (repo / "policy.yaml", repo / "evidence" / "r.json"):
        os.utime(path, (1, 1))


def _vector_reaches_plain_git(repo: Path, marker: Path, *args: str) -> None:
    """The planted config really is a vector: the same git call without interlock runs it."""
    _stat_dirty(repo)
    _plain_git(repo, *args)
    assert marker.exists(), f"git {' '.join(args)} did not run the planted program"
    marker.unlink()


@needs_git
@pytest.mark.parametrize(
    "vector",
    [
        ("status", "--porcelain"),  # fsmonitor, the clean filter, post-index-change
        ("blame", "--porcelain", "-L", "1,1", "--", "policy.yaml"),  # textconv, clean
        ("diff", "HEAD"),  # diff.external
    ],
    ids=["fsmonitor-filter-hooks", "textconv", "diff-external"],
)
def test_s2_policy_check_git_runs_no_repository_config(
    bundle: tuple[Path, Path], vector: tuple[str, ...]
) -> None:
    repo, marker = bundle
    if vector[0] == "diff":
        (repo / "policy.yaml").write_text("a: 1\nb: 3\n")
    _vector_reaches_plain_git(repo, marker, *vector)
    _stat_dirty(repo)
    result = staleness(repo / "policy.yaml", [1, 2], repo / "evidence" / "r.json")
    run_git(list(vector), repo)  # even the call that reaches the vector runs nothing
    assert not marker.exists(), marker.read_text()
    assert result.method == "git"  # the check still ran


@needs_git
def test_s2_git_pager_and_system_config_are_off(bundle: tuple[Path, Path]) -> None:
    repo, marker = bundle
    assert run_git(["var", "GIT_PAGER"], repo).stdout.strip() == b"cat"
    assert b"core.pager=cat" in run_git(["config", "--list"], repo).stdout
    # A GIT_* variable of the caller does not redirect git to another repository or program.
    os.environ["GIT_EXTERNAL_DIFF"] = str(repo.parent / "evil.sh")
    try:
        (repo / "policy.yaml").write_text("a: 1\nb: 3\n")
        run_git(["diff", "HEAD"], repo)
    finally:
        del os.environ["GIT_EXTERNAL_DIFF"]
    assert not marker.exists()


@needs_git
def test_s2_policy_diff_git_show_runs_no_repository_config(
    bundle: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from interlock.commands.diff import read_policy_arg

    repo, marker = bundle
    monkeypatch.chdir(repo)
    _stat_dirty(repo)
    [(name, data)] = read_policy_arg("git:HEAD:policy.yaml")
    assert data == b"a: 1\nb: 2\n"
    assert not marker.exists()


@needs_git
@pytest.mark.skipif(os.geteuid() != 0, reason="needs to chown the repository")
def test_s2_a_repository_of_another_owner_stays_refused(bundle: tuple[Path, Path]) -> None:
    """safe.directory is respected: interlock does not widen it, so git refuses a repository
    owned by someone else and the check says it was not made."""
    repo, marker = bundle
    for path in [repo, *repo.rglob("*")]:
        os.lchown(path, 54321, 54321)
    done = run_git(["status", "--porcelain"], repo)
    assert done.returncode != 0 and b"dubious ownership" in done.stderr
    result = staleness(repo / "policy.yaml", [1], repo / "evidence" / "r.json")
    assert result.stale is None
    assert not marker.exists()


@pytest.mark.parametrize("name", ["--enforce-eager", "-cc.mode=NONE", "--", "-O0"])
def test_s4_a_model_named_like_a_flag_reaches_vllm_as_a_path(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    import json

    monkeypatch.chdir(tmp_path)
    (tmp_path / name).mkdir()
    config = {"architectures": ["LlamaForCausalLM"]}
    (tmp_path / name / "config.json").write_text(json.dumps(config))
    res = cli("vllm", "args", "--platform", "cuda", "--json", "--", name)
    assert res.code == 0, res.err
    argv = res.json()["argv"]
    assert argv[:3] == ["vllm", "serve", f"./{name}"]
    assert (tmp_path / argv[2]).resolve() == (tmp_path / name).resolve()
    # The name was not read as a flag of the user's either: interlock still sets both.
    assert any(a.startswith("-cc.mode=") for a in argv[3:])
    assert not any(a.startswith("-") and not a.startswith("-cc.") for a in argv[3:])


# -- no subprocess is steered by the folder it was pointed at ------------------------------

PLANTED = {
    "sitecustomize.py": "open({marker!r}, 'a').write('sitecustomize\\n')\n",
    "usercustomize.py": "open({marker!r}, 'a').write('usercustomize\\n')\n",
    "torch.py": "open({marker!r}, 'a').write('torch\\n')\n",
    "interlock.py": "open({marker!r}, 'a').write('interlock\\n')\n",
    ".env": "VLLM_USE_V2_MODEL_RUNNER=0\nPYTHONPATH=.\nGIT_DIR=/tmp\n",
    "vllm.yaml": "enforce-eager: true\n",
    ".gitconfig": "[core]\n\tfsmonitor = touch {marker}\n",
}


def _plant(directory: Path, marker: Path) -> None:
    for name, text in PLANTED.items():
        (directory / name).write_text(text.format(marker=str(marker)))


def test_no_subprocess_is_steered_by_the_folder_it_was_pointed_at_vllm(tmp_path: Path) -> None:
    """`policy vllm serve MODEL` execs vllm with the model as one argument, in the caller's
    folder, with the caller's environment and interlock's decisions: nothing planted in the
    model's folder (.env, vllm.yaml, sitecustomize.py) takes part."""
    import json
    import sys

    model, marker, record = tmp_path / "model", tmp_path / "marker", tmp_path / "record.json"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    _plant(model, marker)
    fake = tmp_path / "vllm"
    fake.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        "json.dump({'argv': sys.argv, 'cwd': os.getcwd(), 'env': dict(os.environ)},"
        " open(os.environ['RECORD'], 'w'))\n"
    )
    fake.chmod(0o755)
    caller = tmp_path / "caller"
    caller.mkdir()
    env = {**os.environ, "RECORD": str(record), "NO_COLOR": "1"}
    for name in ("VLLM_USE_V2_MODEL_RUNNER", "VLLM_USE_BREAKABLE_CUDAGRAPH", "PYTHONPATH"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from interlock.cli import main; sys.exit(main())",
         "vllm", "serve", "--vllm", str(fake), "--platform", "cuda", str(model)],
        cwd=caller, env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(record.read_text())
    assert seen["argv"][1:3] == ["serve", str(model)]
    assert not any(a.startswith("--config") for a in seen["argv"])
    assert seen["cwd"] == str(caller)
    assert seen["env"]["VLLM_USE_V2_MODEL_RUNNER"] == "1"  # the policy's, not .env's 0
    assert "PYTHONPATH" not in seen["env"] and "GIT_DIR" not in seen["env"]
    assert not marker.exists()


@pytest.mark.slow
def test_no_subprocess_is_steered_by_the_folder_it_was_pointed_at_workers(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Tensor-parallel workers import nothing from the model's folder (a planted
    sitecustomize.py or torch.py there would run in every rank)."""
    from interlock.llm import LLM
    from interlock.runners.batching.sampling import SamplingParams
    from interlock.runners.contract import Decision

    marker = tmp_path / "marker"
    _plant(tiny_model, marker)
    with LLM(str(tiny_model), tensor_parallel_size=2, max_num_seqs=1, num_blocks=8,
             decision=Decision(runner="mrv1")) as llm:
        llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=2))
    assert not marker.exists(), marker.read_text()


@needs_git
def test_no_subprocess_is_steered_by_the_folder_it_was_pointed_at_git(
    bundle: tuple[Path, Path]
) -> None:
    """git in the bundle's folder: its .git/config (above), a .gitconfig or .env there, and a
    GIT_DIR of the caller's, steer nothing."""
    repo, marker = bundle
    _plant(repo, marker)
    os.environ["GIT_DIR"] = str(repo.parent)
    try:
        _stat_dirty(repo)
        result = staleness(repo / "policy.yaml", [1], repo / "evidence" / "r.json")
    finally:
        del os.environ["GIT_DIR"]
    assert result.method == "git" and not marker.exists()
