"""tools/import_circles.py: the circles of the import graph, function-local imports included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from checkout import REPO, copy_checkout

LOCAL_UPWARD = '''

def _upward():
    # deliberately wrong: the condition language reaching up into the schema that imports it
    from interlock.policy.schema import validate_when

    return validate_when
'''


def _circles(root: Path, *args: str) -> tuple[int, list[tuple[str, ...]], str]:
    done = subprocess.run(
        [sys.executable, str(root / "tools" / "import_circles.py"), *args],
        cwd=root, capture_output=True, text=True, timeout=300,
    )
    out = done.stdout + done.stderr
    found = [tuple(line.split()[1:]) for line in done.stdout.splitlines()
             if line.startswith("circle:")]
    return done.returncode, found, out


def test_no_module_is_in_a_circle() -> None:
    """Among the circles opened: conditions <-> schema, lint <-> policytest, config <->
    families <-> family and gguf <-> sources, once tied by imports inside functions."""
    code, found, out = _circles(REPO)
    assert (code, found) == (0, []), out
    assert out.splitlines()[-1].startswith("0 circle(s) among "), out


def test_a_circle_closed_inside_a_function_fails(tmp_path: Path) -> None:
    root = copy_checkout(tmp_path)
    conditions = root / "policy" / "conditions.py"
    conditions.write_text(conditions.read_text() + LOCAL_UPWARD)
    code, found, out = _circles(root)
    assert code == 1, out
    assert ("interlock.policy.conditions", "interlock.policy.schema") in found, out
    # Both ends are in the wing interlock.policy: no circle between wings, and still a failure.
    code, found, out = _circles(root, "--wing")
    assert code == 1, out
    assert all("interlock.policy.conditions" not in circle for circle in found), out
    assert " wings of " in out.splitlines()[-1], out
