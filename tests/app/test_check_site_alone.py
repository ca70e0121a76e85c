"""Issue 24 item 6: ``policy check --policy site.yaml`` says how to layer the site policy on
the shipped one, and locations in the shipped policy resolve from any directory."""

from __future__ import annotations

import re
from pathlib import Path

from interlock.policy.loader import shipped_policy_path


def test_a_site_policy_alone_is_told_to_layer_on_the_shipped_one(cli, site) -> None:
    res = cli("check", "--policy", site)
    assert res.code == 1
    assert f"give --policy @shipped --policy {site}" in res.out
    assert f"INTERLOCK_POLICY=@shipped:{site}" in res.out


def test_shipped_locations_open_from_another_directory(cli, site, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    doc = cli("explain", "LlamaForCausalLM", "--platform", "cuda", "--json").json()
    where = doc["provenance"]["runner"]["file"]
    assert Path(where).is_absolute() and Path(where) == shipped_policy_path().resolve()
    text = cli("diff", "@shipped", "@shipped:site.yaml").out
    (location,) = set(re.findall(r"defaults \((\S+):\d+\)", text))
    assert Path(location).is_file()


def test_in_the_checkout_the_shipped_file_keeps_its_short_name(cli) -> None:
    doc = cli("explain", "LlamaForCausalLM", "--platform", "cuda", "--json").json()
    assert doc["provenance"]["runner"]["file"] == "policies.yaml"
