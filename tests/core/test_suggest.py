from __future__ import annotations

from interlock.core.suggest import did_you_mean, edit_distance, hint


def test_edit_distance_counts_single_edits() -> None:
    assert edit_distance("mrv1", "mrv1") == 0
    assert edit_distance("mrv1", "mrv2") == 1
    assert edit_distance("mrv", "mrv2") == 1
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance("", "abc") == 3
    assert edit_distance("abc", "") == 3


def test_a_swap_of_adjacent_characters_is_one_edit() -> None:
    assert edit_distance("mvr2", "mrv2") == 1
    assert edit_distance("ab", "ba") == 1
    assert did_you_mean("mvr2", ["mrv1", "mrv2"]) == "mrv2"


def test_case_is_ignored_when_measuring() -> None:
    names = ["GlmMoeDsaForCausalLM", "DeepseekV32ForCausalLM"]
    assert did_you_mean("GlmMoeDSAForCausalLM", names) == "GlmMoeDsaForCausalLM"


def test_ties_prefer_the_exact_case_then_the_name() -> None:
    assert did_you_mean("ab", ["AB", "ab"]) == "AB"  # the word itself is never suggested
    assert did_you_mean("mrv3", ["mrv2", "mrv1"]) == "mrv1"
    assert did_you_mean("Mrv3", ["mrv2", "Mrv2"]) == "Mrv2"


def test_far_names_are_not_suggested() -> None:
    assert did_you_mean("v2", ["mrv1", "mrv2"]) is None
    assert hint("LlamaForCausalLM", ["Qwen2MoeForCausalLM"]) == ""
    assert hint("mrv3", ["mrv2"]) == " (did you mean 'mrv2'?)"
