"""Loading: every error names file:line:col and a dotted path; layering; revision; limits."""

from __future__ import annotations

import pytest

from interlock.policy import PolicyError, load_policy, load_policy_text
from interlock.policy.loader import read_source, shipped_policy_path
from interlock.policy.source import MAX_ALIAS_NODES, parse_yaml


def error_of(text: str, name: str = "p.yaml") -> PolicyError:
    with pytest.raises(PolicyError) as info:
        load_policy_text(text, name)
    return info.value


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_shipped_policy_loads() -> None:
    policy = load_policy(use_cache=False)
    assert policy.schema_version == 1
    assert policy.version == "vllm-0.33.0..0.34.0"
    assert [f.path for f in policy.files] == ["policies.yaml"]
    assert len(policy.revision) == 16


def test_malformed_yaml_points_at_the_problem() -> None:
    err = error_of("schema_version: 1\nversion: [x\nrules: []\n")
    assert (err.file, err.line) == ("p.yaml", 3)
    assert "invalid YAML" in str(err)
    assert str(err).startswith("p.yaml:3:")


def test_duplicate_key_is_an_error_at_the_second_key(base: str) -> None:
    text = base.replace("defaults:", "defaults: {runner: mrv1}\ndefaults:")
    err = error_of(text)
    assert err.line == line_of(text, "defaults: {runner: mrv2")
    assert err.path == "defaults"
    assert "duplicate key 'defaults' (first defined at line" in err.message


def test_duplicate_key_nested(base: str) -> None:
    text = base.replace("{moe: true, attention: dsa}", "{moe: true, attention: dsa, moe: false}")
    err = error_of(text)
    assert err.path == "catalog.DsaModel.moe"
    assert err.line == line_of(text, "DsaModel")


def test_unknown_field_names_the_allowed_ones(base: str) -> None:
    text = base.replace(
        "rules: []",
        "rules:\n  - id: r\n    when: {platform: rocm}\n    set: {runnr: mrv1}\n    reason: x\n",
    )
    err = error_of(text)
    assert str(err).startswith(f"p.yaml:{line_of(text, 'runnr')}:")
    assert err.path == "rules[0].set.runnr"
    assert "unknown field 'runnr'" in err.message
    assert "allowed: runner, cudagraph, breakable, compile, capture_sizes" in err.message
    assert "did you mean 'runner'" in err.message


@pytest.mark.parametrize(
    ("old", "new", "path", "needle"),
    [
        (
            "cudagraph: full_and_piecewise",
            "cudagraph: fullish",
            "defaults.cudagraph",
            "'piecewise'",
        ),
        ("breakable: false", "breakable: 'no'", "defaults.breakable", "valid boolean"),
        ("runner: mrv2,", "runner: MRV2,", "defaults.runner", "should match pattern"),
        (
            "{moe: true, attention: dsa}",
            "{moe: true, attention: sparse}",
            "catalog.DsaModel.attention",
            "'dsa'",
        ),
        ('"1": mrv2', '"1": MRV2', "env.USE_V2.values.1", "allowed: a runner name"),
        ("field: runner", "field: runer", "env.USE_V2.field", "'runner'"),
        ("runner: mrv2,", "runner: null,", "defaults.runner", "valid string"),
        ('"0": mrv1', "0: mrv1", "env.USE_V2.values[0]", "must be a string"),
    ],
)
def test_bad_values_are_located(base: str, old: str, new: str, path: str, needle: str) -> None:
    text = base.replace(old, new)
    assert text != base
    err = error_of(text)
    assert err.path == path
    assert err.line == line_of(text, new)
    assert needle in err.message


def test_rule_errors_name_the_rule_index(base: str) -> None:
    rules = (
        "rules:\n"
        "  - {id: a, when: {platform: rocm}, set: {runner: mrv1}, reason: ok}\n"
        "  - {id: b, when: {architecture: 5}, set: {runner: mrv1}, reason: ok}\n"
    )
    text = base.replace("rules: []\n", rules)
    err = error_of(text)
    assert err.path == "rules[1].when.architecture"
    assert err.line == line_of(text, "id: b")
    assert "a valid string or a valid list (got 5)" in err.message


def test_missing_reason_and_empty_set(base: str) -> None:
    text = base.replace("rules: []\n", "rules:\n  - {id: a, when: {}, set: {}}\n")
    err = error_of(text)
    messages = [err.message, *(e.message for e in err.more)]
    assert "missing required field 'reason'" in messages
    assert any("name at least one of" in m for m in messages)
    assert err.line == line_of(text, "id: a")


def test_feature_comparison_errors(base: str) -> None:
    text = base.replace(
        "rules: []\n",
        "rules:\n  - {id: a, when: {features: {tp: {gtt: 1}}}, set: {runner: mrv1}, reason: x}\n",
    )
    err = error_of(text)
    assert err.path == "rules[0].when.features.tp.gtt"
    assert "allowed: gt, ge, lt, le, eq, ne, in" in err.message


def test_future_schema_version_is_refused_clearly(base: str) -> None:
    text = base.replace("schema_version: 1", "schema_version: 2")
    err = error_of(text)
    assert (err.line, err.path) == (1, "schema_version")
    assert "newer than this interlock understands" in err.message
    assert "upgrade interlock" in err.message


@pytest.mark.parametrize("version", ["0", "'1'", "1.0"])
def test_other_schema_versions(base: str, version: str) -> None:
    err = error_of(base.replace("schema_version: 1", f"schema_version: {version}"))
    assert "unsupported schema_version" in err.message


def test_not_a_mapping_and_empty_file() -> None:
    assert "a policy file is a mapping" in error_of("- 1\n").message
    assert error_of("").message == "empty policy file"
    assert "schema_version is missing" in error_of("version: x\n").message


def test_unsafe_tag_is_refused() -> None:
    err = error_of("schema_version: 1\nx: !!python/object/apply:os.system ['true']\n")
    assert err.line == 2
    assert "not allowed" in err.message or "could not determine a constructor" in err.message
    err = error_of("schema_version: 1\nx: !!python/object:os.system {}\n")
    assert "is not allowed in a policy file" in err.message


def test_billion_laughs_is_refused() -> None:
    levels = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i, name in enumerate("bcdefghi"):
        prev = "abcdefghi"[i]
        levels.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 10) + "]")
    err = error_of("\n".join(levels) + "\n")
    assert f"alias expansion exceeds {MAX_ALIAS_NODES} nodes" in err.message
    assert err.file == "p.yaml" and err.line is not None


def test_recursive_alias_is_refused() -> None:
    assert error_of("a: &a [*a]\n").message == "recursive alias"


def test_small_aliases_and_merge_keys_work(base: str) -> None:
    text = base.replace(
        "rules: []\n",
        "x-rocm: &rocm {platform: rocm}\n"
        "rules:\n"
        "  - {id: a, when: {<<: *rocm, attention: dsa}, set: {runner: mrv1}, reason: ok}\n",
    )
    err = error_of(text)  # x-rocm is not a policy key: the anchor has to live somewhere valid
    assert err.path == "x-rocm"
    text = base.replace(
        "rules: []\n",
        "rules:\n"
        "  - {id: a, when: &w {platform: rocm}, set: {runner: mrv1}, reason: ok}\n"
        "  - {id: b, when: {<<: *w, attention: dsa}, set: {compile: false}, reason: ok}\n",
    )
    policy = load_policy_text(text)
    assert policy.rules[1].when.to_data() == {"platform": "rocm", "attention": "dsa"}


def test_size_limit(tmp_path) -> None:
    path = tmp_path / "big.yaml"
    path.write_bytes(b"#" * 2048)
    with pytest.raises(PolicyError, match="larger than the 1024 byte limit") as info:
        read_source(path, "big.yaml", limit=1024)
    assert info.value.file == "big.yaml"
    with pytest.raises(PolicyError, match="cannot read policy file"):
        load_policy([tmp_path / "missing.yaml"])


def test_alias_limit_is_configurable() -> None:
    text = b"a: &a [1, 2, 3]\nb: [*a, *a]\n"
    assert parse_yaml(text, "x").data["b"] == [[1, 2, 3], [1, 2, 3]]
    with pytest.raises(PolicyError, match="alias expansion exceeds 5 nodes"):
        parse_yaml(text, "x", max_alias_nodes=5)


def test_every_value_has_a_mark(base: str) -> None:
    doc = parse_yaml(base.encode(), "p.yaml")
    assert doc.mark(("defaults", "runner")).line == line_of(base, "defaults:")
    assert doc.mark(("catalog", "DenseModel"), key=True).line == line_of(base, "DenseModel")
    assert doc.mark(("catalog", "DenseModel", "nope")) == doc.mark(("catalog", "DenseModel"))


SITE = """\
schema_version: 1
version: "site-3"
catalog:
  DenseModel: {moe: false, attention: mha}
  SiteModel: {moe: true, attention: mla}
defaults: {cudagraph: piecewise}
env:
  USE_V2: {field: runner, values: {"0": mrv1, "1": mrv2, "2": mrv2}}
rules:
  - {id: site-mla, when: {attention: mla}, set: {runner: mrv1}, reason: site choice}
"""


def test_layering(write, base: str) -> None:
    base = write("base.yaml", base.replace("rules: []", RULE_A))
    site = write("site.yaml", SITE)
    policy = load_policy([base, site], use_cache=False)
    assert [f.path for f in policy.files] == [str(base), str(site)]
    assert policy.version == "t1+site-3"
    assert [r.id for r in policy.rules] == ["a", "site-mla"]
    assert [r.index for r in policy.rules] == [0, 1]
    assert policy.defaults["cudagraph"].value == "piecewise"
    assert policy.defaults["cudagraph"].location.file == str(site)
    assert policy.defaults["runner"].location.file == str(base)
    assert policy.catalog["DenseModel"].traits == {"moe": False, "attention": "mha"}
    assert "DsaModel" in policy.catalog and "SiteModel" in policy.catalog
    assert set(policy.env["USE_V2"].values) == {"0", "1", "2"}


RULE_A = "rules:\n  - {id: a, when: {platform: rocm}, set: {runner: mrv1}, reason: ok}"


def test_layering_rejects_a_duplicate_rule_id_across_files(write, base: str) -> None:
    base = write("base.yaml", base.replace("rules: []", RULE_A))
    site = write("site.yaml", SITE.replace("id: site-mla", "id: a"))
    with pytest.raises(PolicyError) as info:
        load_policy([base, site], use_cache=False)
    err = info.value
    assert (err.file, err.line, err.path) == (str(site), line_of(SITE, "site-mla"), "rules[0].id")
    assert f"first defined at {base}:" in err.message


def test_defaults_must_be_complete_after_layering(write) -> None:
    site = write("site.yaml", SITE)
    with pytest.raises(PolicyError, match="defaults must set runner, breakable, compile"):
        load_policy([site], use_cache=False)


def test_interlock_policy_env_var(write, monkeypatch, base: str) -> None:
    import os

    base = write("base.yaml", base)
    site = write("site.yaml", SITE)
    monkeypatch.setenv("INTERLOCK_POLICY", f"{base}{os.pathsep}{site}")
    assert [f.path for f in load_policy().files] == [str(base), str(site)]
    assert [f.path for f in load_policy([base]).files] == [str(base)]


def test_revision_is_a_content_hash(write, base: str) -> None:
    a = write("a.yaml", base)
    b = write("b.yaml", base)
    assert load_policy([a]).revision == load_policy([b]).revision
    changed = write("c.yaml", base.replace('"t1"', '"t2"'))
    assert load_policy([changed]).revision != load_policy([a]).revision
    site = write("site.yaml", SITE)
    assert load_policy([a, site]).revision != load_policy([a]).revision


def test_shipped_file_is_the_top_level_policies_yaml() -> None:
    from pathlib import Path

    top = Path(__file__).resolve().parents[2] / "policies.yaml"
    assert shipped_policy_path().resolve() == top.resolve()
    assert shipped_policy_path().read_bytes() == top.read_bytes()
