"""GGUF files under attack (issue 28: S1, C1-C4, C7, C14, W4-W6, U1-U3)."""

from __future__ import annotations

import errno
import json
import os
import signal
import struct
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gguf_builders import rewrite_gguf, write_tiny_gguf

from interlock.core import disk_cache
from interlock.core.errors import ModelError
from interlock.runners.model import sources
from interlock.runners.model.gguf.layout import MAX_STRINGS


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(path, "llama", "F32")
    return path


@pytest.fixture
def gguf_copy(tiny_gguf: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "model.gguf"
    copy.write_bytes(tiny_gguf.read_bytes())
    return copy


def _explain(cli: Callable[..., Any], model: Path) -> Any:
    start = time.monotonic()
    res = cli("explain", "--model", model, "--platform", "cpu", "--json")
    assert time.monotonic() - start < 20
    assert "Traceback" not in res.err
    return res


def _refused(cli: Callable[..., Any], model: Path, *words: str) -> str:
    """Refused by `policy explain --model`: exit 1, the model being input to the policy
    there (`policy run` says 4: the model cannot run)."""
    res = _explain(cli, model)
    assert res.code == 1, (res.code, res.err)
    message = res.json()["error"]["message"]
    for word in words:
        assert word in message, message
    return message


def _entries() -> list[Path]:
    directory = disk_cache.cache_dir()
    return sorted(directory.glob("gguf-*")) if directory.exists() else []


def _header(kv: list[bytes], tensors: list[bytes] = (), tensor_count: int | None = None) -> bytes:
    count = len(tensors) if tensor_count is None else tensor_count
    return b"GGUF" + struct.pack("<IQQ", 3, count, len(kv)) + b"".join(kv) + b"".join(tensors)


def _string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def _kv_string(key: str, value: str) -> bytes:
    return _string(key.encode()) + struct.pack("<I", 8) + _string(value.encode())


def _tensor(name: str, dims: list[int], kind: int, offset: int) -> bytes:
    return (_string(name.encode()) + struct.pack("<I", len(dims))
            + b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", kind, offset))


# -- S1 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("pinned", [False, True])
def test_s1_gguf_cache_toctou(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pinned) -> None:
    """The file is swapped (an atomic rename) the moment it is opened for hashing: the
    cache entry under A's sha256 still holds A's conversion."""
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    write_tiny_gguf(a, "llama", "F32", seed=1)
    write_tiny_gguf(b, "llama", "F32", seed=2)
    digest_a = sources.file_sha256(a)
    reference = sources.converted(a)  # A's conversion, in the cache
    expected = (reference / "model.safetensors").read_bytes()
    sources._remove(reference)
    real_open = sources.open_regular

    def open_then_swap(path: Any, *args: Any) -> Any:
        fh = real_open(path, *args)
        os.replace(b, a)  # the attacker's rename, just after the open
        return fh

    monkeypatch.setattr(sources, "open_regular", open_then_swap)
    entry = sources.converted(a, sha256=digest_a if pinned else None)
    assert entry.name.startswith(f"gguf-{digest_a}")
    assert (entry / "model.safetensors").read_bytes() == expected


def test_s1_a_file_written_during_conversion_is_not_cached(
    gguf_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from interlock.runners.model import gguf

    real = gguf.convert

    def convert_while_written(model: Any, target: Path) -> None:
        real(model, target)
        with open(gguf_copy, "ab") as fh:  # an in-place write of the same file
            fh.write(b"\0" * 32)

    monkeypatch.setattr(gguf, "convert", convert_while_written)
    with pytest.raises(ModelError, match="changed while it was converted"):
        sources.converted(gguf_copy)
    assert _entries() == []


# -- C1, C2, C3, W5, U1: the layout -------------------------------------------------------


def test_c1_an_array_of_2_62_elements_is_refused_at_once(cli, tmp_path: Path) -> None:
    path = tmp_path / "c1.gguf"
    kv = _string(b"general.architecture") + struct.pack("<IIQ", 9, 0, 1 << 62)
    path.write_bytes(_header([kv]) + b"\0" * 40)
    assert path.stat().st_size < 200
    _refused(cli, path, "c1.gguf", "truncated", "general.architecture", str(1 << 62))


def test_c2_two_million_strings_are_refused_quickly(cli, tmp_path: Path) -> None:
    path = tmp_path / "c2.gguf"
    count = 2_000_000
    kv = _string(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, count)
    path.write_bytes(_header([_kv_string("general.architecture", "llama"), kv])
                     + b"\0" * (8 * count))
    _refused(cli, path, "tokenizer.ggml.tokens", f"{count} strings", str(MAX_STRINGS))


@pytest.mark.parametrize(
    ("tensors", "words"),
    [
        ([_tensor("a", [4], 0, 0), _tensor("b", [4], 0, 0)], "overlap"),
        ([_tensor("a", [4], 0, 0), _tensor("b", [8], 0, 0)], "overlap"),
        ([_tensor("a", [4], 0, (1 << 64) - 32)], "runs past the end"),
        ([_tensor("a", [1 << 40], 0, 0)], "runs past the end"),
        ([_tensor("a", [4], 0, 4)], "not aligned"),
        ([_tensor("a", [5], 2, 0)], "blocks"),
        ([_tensor("a", [4], 999, 0)], "unknown type 999"),
        ([_tensor("a", [1, 1, 1, 1, 1], 0, 0)], "5 dimensions"),
    ],
    ids=["same-offset", "nested", "wraps-uint64", "past-end", "misaligned", "partial-block",
         "unknown-type", "five-dims"],
)
def test_c3_w5_tensor_ranges_must_be_aligned_inside_and_disjoint(
    cli, tmp_path: Path, tensors: list[bytes], words: str
) -> None:
    path = tmp_path / "t.gguf"
    head = _header([_kv_string("general.architecture", "llama")], tensors)
    path.write_bytes(head + b"\0" * (-len(head) % 32) + b"\0" * 64)
    _refused(cli, path, words)
    assert _entries() == []


def test_u1_truncated_files_say_what_is_missing(cli, tiny_gguf: Path, tmp_path: Path) -> None:
    data = tiny_gguf.read_bytes()
    for cut in (10, 30, 200, 5000):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(data[:cut])
        message = _refused(cli, path, f"cut{cut}.gguf")
        assert "truncated" in message or "shorter than a GGUF header" in message, message
        assert "index" not in message and "unpack" not in message
    path = tmp_path / "kv.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1 << 63))
    _refused(cli, path, f"kv_count {1 << 63}", "truncated")


# -- U2, U3 -------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_u2_nan_metadata_names_the_gguf_key_and_caches_nothing(
    cli, tiny_gguf: Path, tmp_path: Path, value: float
) -> None:
    path = rewrite_gguf(tiny_gguf, tmp_path / "nan.gguf",
                        metadata={"llama.rope.freq_base": value})
    _refused(cli, path, "nan.gguf", "llama.rope.freq_base", "not a finite number")
    assert _entries() == []


def test_u3_non_regular_paths_are_named_as_what_they_are(cli, tmp_path: Path) -> None:
    fifo = tmp_path / "f.gguf"
    os.mkfifo(fifo)
    _refused(cli, fifo, "is a FIFO")
    folder = tmp_path / "d.gguf"
    folder.mkdir()
    _refused(cli, folder, "is a directory")
    link = tmp_path / "z.gguf"
    link.symlink_to("/dev/zero")
    _refused(cli, link, "is a character device")
    _refused(cli, tmp_path / "missing.gguf", "no such GGUF file")


def test_u3_the_extension_is_matched_case_insensitively(cli, gguf_copy: Path) -> None:
    upper = gguf_copy.with_name("model.GGUF")
    gguf_copy.rename(upper)
    res = _explain(cli, upper)
    assert res.code == 0, res.err
    assert res.json()["context"]["architecture"] == "LlamaForCausalLM"


# -- C4, W4: tokenizer metadata -----------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("tokenizer.ggml.bos_token_id", "1"),
        ("tokenizer.ggml.bos_token_id", [1, 2]),
        ("tokenizer.ggml.pre", ["smollm"]),
        ("tokenizer.ggml.tokens", [1, 2, 3]),
        ("tokenizer.ggml.merges", [1, 2]),
        ("tokenizer.ggml.merges", ["zzq qqz"]),
        ("tokenizer.ggml.merges", ["a " + "b" * 100_000]),
        ("tokenizer.ggml.token_type", [1] * 5000),
        ("tokenizer.ggml.add_bos_token", "false"),
        ("tokenizer.ggml.bos_token_id", 1.5),
        ("tokenizer.ggml.eos_token_id", True),
        ("tokenizer.ggml.token_type", ["3", "1"]),
    ],
    ids=["bos-string", "bos-array", "pre-list", "tokens-ints", "merges-ints",
         "merges-unknown", "merge-huge", "token-type-long", "add-bos-string", "bos-float",
         "eos-bool", "token-type-strings"],
)
def test_c4_w4_tokenizer_metadata_is_type_checked(
    cli, tiny_gguf: Path, tmp_path: Path, key: str, value: Any
) -> None:
    path = _with_metadata(tiny_gguf, tmp_path / "tok.gguf", key, value)
    res = cli("run", "--model", path, "--prompt", "hi", "--max-tokens", "1", "--json")
    assert res.code == 1, (res.code, res.err)  # read while resolving the policy's context
    assert "Traceback" not in res.err
    assert key in res.json()["error"]["message"], res.json()["error"]["message"]
    assert _entries() == []


def _with_metadata(source: Path, target: Path, key: str, value: Any) -> Path:
    """``source`` with ``key`` set to ``value`` written with the type ``value`` has."""
    import gguf

    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(str(target), reader.fields["general.architecture"].contents())
    for f in reader.fields.values():
        if f.name.startswith(("GGUF.", "general.architecture", "general.alignment")):
            continue
        if f.name == key:
            continue
        sub_type = f.types[-1] if len(f.types) > 1 else None
        writer.add_key_value(f.name, f.contents(), f.types[0], sub_type)
    T = gguf.GGUFValueType
    if isinstance(value, list):
        inner = T.STRING if value and isinstance(value[0], str) else T.INT32
        writer.add_key_value(key, value, T.ARRAY, inner)
    else:
        kind = {bool: T.BOOL, str: T.STRING, float: T.FLOAT32, int: T.INT32}[type(value)]
        writer.add_key_value(key, value, kind)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


# -- C7, C14, W6: the cache ---------------------------------------------------------------


def test_c7_a_full_cache_falls_back_to_a_temporary_conversion(
    gguf_copy: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    real = sources._convert
    cache = disk_cache.cache_dir()

    def full(path: Path, fh: Any, target: Path, *args: Any) -> None:
        if cache in target.parents:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, fh, target, *args)

    monkeypatch.setattr(sources, "_convert", full)
    directory = sources.converted(gguf_copy)
    assert cache not in directory.parents and (directory / "config.json").is_file()
    assert "ENOSPC" in capfd.readouterr().err
    assert not list(cache.glob(".gguf-*"))  # the staging copy went too


@pytest.mark.parametrize("code", [errno.EROFS, errno.EFBIG, errno.ENOSPC])
def test_c7_no_room_anywhere_is_a_model_error_naming_directory_and_errno(
    gguf_copy: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    def nowhere(*args: Any) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(sources, "_convert", nowhere)
    with pytest.raises(ModelError) as caught:
        sources.converted(gguf_copy)
    assert errno.errorcode[code] in str(caught.value)
    assert "TMPDIR" in str(caught.value)


def test_c14_stale_staging_directories_are_swept(gguf_copy: Path) -> None:
    cache = disk_cache.cache_dir()
    cache.mkdir(mode=0o700, exist_ok=True)
    done = subprocess.run(["true"], check=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert done.returncode == 0
    stale = cache / f".gguf-x-v1.{dead.pid}.abc"
    live = cache / f".gguf-x-v1.{os.getpid()}.def"
    for folder in (stale, live):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"\0" * 1024)
    sources.converted(gguf_copy)
    assert not stale.exists() and live.exists()


def test_c14_sigterm_during_conversion_removes_the_staging_copy(
    gguf_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from interlock.runners.model import gguf

    real = gguf.convert

    def killed(model: Any, target: Path) -> None:
        real(model, target)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)

    monkeypatch.setattr(gguf, "convert", killed)
    with pytest.raises(SystemExit) as caught:
        sources.converted(gguf_copy)
    assert caught.value.code == 128 + signal.SIGTERM
    assert not list(disk_cache.cache_dir().glob(".gguf-*"))
    assert _entries() == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_w6_a_damaged_cached_checkpoint_of_the_same_size_is_converted_again(
    gguf_copy: Path,
) -> None:
    entry = sources.converted(gguf_copy)
    weights = entry / "model.safetensors"
    good = weights.read_bytes()
    size = len(good)
    damaged = bytearray(good)
    at = size * 10 // 64  # a sampled block
    damaged[at : at + 64] = bytes(64)
    assert damaged != good
    weights.write_bytes(bytes(damaged))
    again = sources.converted(gguf_copy)
    assert again == entry and (again / "model.safetensors").read_bytes() == good
    manifest = json.loads((entry / sources.MANIFEST).read_text())
    assert "sampled_sha256" in manifest["files"]["model.safetensors"]
