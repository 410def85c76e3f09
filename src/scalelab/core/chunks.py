"""Files too big for one call to the GPU machine, sent in numbered chunks and verified on arrival.

    python -m scalelab.core.chunks split PATH OUT_DIR [--max-mib M]   PATH: a file, or a folder (tarred first)
    python -m scalelab.core.chunks stage OUT_DIR INDEX STAGE_DIR      STAGE_DIR := chunk INDEX + the manifest only
    python -m scalelab.core.chunks join DEST INPUT...                 INPUT: folders or files holding the chunks

split writes NAME.partNNNN files of at most max bytes and NAME.manifest.json (name, kind, total size, sha256 of the
whole and of each chunk); join finds the manifest and every chunk among its inputs, checks each chunk's size and
sha256 in manifest order and then the whole's, and writes DEST (a folder input is untarred into DEST). Any fault
is one line naming the chunk. A folder is tarred uncompressed with sorted names, mtime 0 and no owner, so the same
folder always gives the same chunks. Stdlib only: runs with just src/ on PYTHONPATH (bench/TRANSFER.md).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO, Iterable

FORMAT = 1
CALL_LIMIT_BYTES = 60 * 2**20  # what one call to the GPU machine may carry, the tracked tree included
SLACK_BYTES = 2 * 2**20        # untracked files that travel too, and the manifest
TREE_CAP_BYTES = 12_000_000    # the tracked tree's limit (tests/test_tree_size.py), when git cannot say
BLOCK = 2**20


class ChunkError(ValueError):
    """A missing, damaged or misplaced chunk, or a manifest that does not describe its chunks."""


@dataclass(frozen=True)
class Chunk:
    index: int
    name: str
    size_bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    name: str               # the file's or folder's own name
    kind: str               # "file" | "dir" (chunks hold an uncompressed tar of the folder)
    total_bytes: int        # of the chunks joined (the tar for a folder)
    sha256: str             # of the chunks joined
    max_chunk_bytes: int
    chunks: tuple[Chunk, ...]
    format: int = FORMAT

    @staticmethod
    def path_in(folder: Path, name: str) -> Path:
        return folder / f"{name}.manifest.json"

    def write(self, folder: Path) -> Path:
        path = self.path_in(folder, self.name)
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")
        return path

    @classmethod
    def read(cls, path: Path) -> "Manifest":
        try:
            d = json.loads(path.read_text())
            chunks = tuple(Chunk(**c) for c in d.pop("chunks"))
            m = cls(**d, chunks=chunks)
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise ChunkError(f"{path}: not a chunk manifest ({type(e).__name__}: {e})") from None
        if m.format != FORMAT or [c.index for c in m.chunks] != list(range(len(m.chunks))):
            raise ChunkError(f"{path}: manifest format {m.format} or chunk numbering not understood")
        return m


# ---------------------------------------------------------------------------------------------
# split


class _ChunkWriter:
    """A write-only stream that rolls over to a new NAME.partNNNN every max_bytes, hashing as it goes."""

    def __init__(self, out_dir: Path, name: str, max_bytes: int):
        self.out_dir, self.name, self.max_bytes = out_dir, name, max_bytes
        self.whole, self.total, self.chunks = hashlib.sha256(), 0, []
        self._f: BinaryIO | None = None
        self._h, self._n = hashlib.sha256(), 0

    def _roll(self) -> None:
        self._finish()
        self._f = open(self.out_dir / f"{self.name}.part{len(self.chunks):04d}", "wb")
        self._h, self._n = hashlib.sha256(), 0

    def _finish(self) -> None:
        if self._f is not None:
            self._f.close()
            self.chunks.append(Chunk(len(self.chunks), Path(self._f.name).name, self._n, self._h.hexdigest()))
            self._f = None

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            if self._f is None or self._n == self.max_bytes:
                self._roll()
            take = view[: self.max_bytes - self._n]
            self._f.write(take)
            self._h.update(take)
            self.whole.update(take)
            self._n, self.total, view = self._n + len(take), self.total + len(take), view[len(take):]
        return len(data)

    def close(self) -> None:
        if self._f is None and not self.chunks:
            self._roll()  # an empty input is one empty chunk
        self._finish()


def _reset_owner(info: tarfile.TarInfo) -> tarfile.TarInfo:
    # the same folder gives the same bytes on any machine, whoever ran it and whenever
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    return info


def _tar_into(folder: Path, stream: _ChunkWriter) -> None:
    with tarfile.open(fileobj=stream, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        for p in sorted(folder.rglob("*"), key=lambda q: q.relative_to(folder).as_posix()):
            tar.add(p, arcname=p.relative_to(folder).as_posix(), recursive=False, filter=_reset_owner)


def split(path: str | Path, out_dir: str | Path, max_bytes: int) -> Manifest:
    """Chunks of at most max_bytes and their manifest in out_dir (which must hold no chunks of the same name)."""
    path, out_dir = Path(path), Path(out_dir)
    if max_bytes < 1:
        raise ChunkError(f"max chunk size must be at least 1 byte, got {max_bytes}")
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder to split")
    out_dir.mkdir(parents=True, exist_ok=True)
    if any(out_dir.glob(f"{path.name}.part*")):
        raise ChunkError(f"{out_dir}: already holds chunks of {path.name}; split into an empty folder")
    stream = _ChunkWriter(out_dir, path.name, max_bytes)
    if path.is_dir():
        _tar_into(path, stream)
    else:
        with open(path, "rb") as f:
            while block := f.read(BLOCK):
                stream.write(block)
    stream.close()
    m = Manifest(path.name, "dir" if path.is_dir() else "file", stream.total, stream.whole.hexdigest(), max_bytes,
                 tuple(stream.chunks))
    m.write(out_dir)
    return m


# ---------------------------------------------------------------------------------------------
# join


def _files(inputs: Iterable[str | Path]) -> dict[str, Path]:
    """Every file among the inputs (folders listed one level deep), by name; the first of a name wins."""
    found: dict[str, Path] = {}
    for i in map(Path, inputs):
        if not i.exists():
            raise FileNotFoundError(f"{i}: no such chunk file or folder")
        for f in sorted(i.iterdir()) if i.is_dir() else [i]:
            if f.is_file():
                found.setdefault(f.name, f)
    return found


def find_manifest(files: dict[str, Path]) -> Manifest:
    manifests = sorted(n for n in files if n.endswith(".manifest.json"))
    if len(manifests) != 1:
        raise ChunkError(f"expected one *.manifest.json among the inputs, found {len(manifests)}: "
                         f"{', '.join(manifests) or 'none'}")
    return Manifest.read(files[manifests[0]])


def _copy_checked(c: Chunk, m: Manifest, files: dict[str, Path], out: BinaryIO, whole: "hashlib._Hash") -> None:
    where = f"chunk {c.name} ({c.index + 1} of {len(m.chunks)})"
    src = files.get(c.name)
    if src is None:
        raise ChunkError(f"{where}: missing from the inputs")
    if src.stat().st_size != c.size_bytes:
        raise ChunkError(f"{src}: {where} has {src.stat().st_size} bytes, the manifest says {c.size_bytes}")
    h = hashlib.sha256()
    with open(src, "rb") as f:
        while block := f.read(BLOCK):
            h.update(block)
            whole.update(block)
            out.write(block)
    if h.hexdigest() != c.sha256:
        raise ChunkError(f"{src}: {where} sha256 {h.hexdigest()[:16]}… is not the manifest's {c.sha256[:16]}… "
                         "(damaged, or another chunk in its place)")


def _assemble(m: Manifest, files: dict[str, Path], tmp: Path) -> None:
    whole = hashlib.sha256()
    with open(tmp, "wb") as out:
        for c in m.chunks:
            _copy_checked(c, m, files, out, whole)
    if tmp.stat().st_size != m.total_bytes or whole.hexdigest() != m.sha256:
        raise ChunkError(f"{m.name}: joined {tmp.stat().st_size} bytes with sha256 {whole.hexdigest()[:16]}…, the "
                         f"manifest says {m.total_bytes} bytes, {m.sha256[:16]}…")


def _untar(tar_path: Path, dest: Path) -> None:
    with tarfile.open(tar_path, mode="r:") as tar:
        # the "data" filter (Python >= 3.11.4) refuses absolute paths, links out of dest and device files
        kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(dest, **kw)


def join(inputs: Iterable[str | Path], dest: str | Path) -> Manifest:
    """Reassemble the chunks found among `inputs` into dest (a file, or a folder for a split folder), verified."""
    dest = Path(dest)
    files = _files(inputs)
    m = find_manifest(files)
    if dest.exists():
        raise ChunkError(f"{dest}: already exists; join into a new path")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".joining")
    try:
        _assemble(m, files, tmp)
        if m.kind == "dir":
            _untar(tmp, dest)
            tmp.unlink()
        else:
            os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()
    return m


def stage(out_dir: str | Path, index: int, stage_dir: str | Path) -> Path:
    """Empty stage_dir, then put chunk `index` and the manifest in it: what one call to the GPU machine carries."""
    out_dir, stage_dir = Path(out_dir), Path(stage_dir)
    m = find_manifest({p.name: p for p in out_dir.glob("*.manifest.json")})
    if not 0 <= index < len(m.chunks):
        raise ChunkError(f"chunk index {index} out of range: {m.name} has chunks 0..{len(m.chunks) - 1}")
    if stage_dir.exists():
        shutil.rmtree(stage_dir)
    stage_dir.mkdir(parents=True)
    for src in (out_dir / m.chunks[index].name, Manifest.path_in(out_dir, m.name)):
        shutil.copyfile(src, stage_dir / src.name)
    return stage_dir / m.chunks[index].name


# ---------------------------------------------------------------------------------------------
# the default chunk size and the command line


def tracked_tree_bytes(where: Path | None = None) -> int | None:
    """Sum of the sizes of the files git tracks in the checkout around `where` (default: cwd); None outside one."""
    try:
        top = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=where, capture_output=True,
                                  check=True, text=True).stdout.strip())
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=top, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    names = [n for n in listed.decode().split("\0") if n]
    return sum((top / n).stat().st_size for n in names if (top / n).is_file())


def default_chunk_bytes(tree_bytes: int | None) -> int:
    """Whole MiB such that chunk + tracked tree + slack <= the per-call limit."""
    tree = TREE_CAP_BYTES if tree_bytes is None else tree_bytes
    return max(1, (CALL_LIMIT_BYTES - tree - SLACK_BYTES) // 2**20) * 2**20


def _parser(tree_bytes: int | None) -> argparse.ArgumentParser:
    default = default_chunk_bytes(tree_bytes)
    where = (f"this checkout's tracked tree is {tree_bytes / 2**20:.1f} MiB (git ls-files)" if tree_bytes is not None
             else f"not in a git checkout: the tree is taken at its {TREE_CAP_BYTES / 1e6:.0f} MB cap")
    why = (f"default chunk size {default // 2**20} MiB: {CALL_LIMIT_BYTES // 2**20} MiB a call, less the tracked "
           f"tree, less {SLACK_BYTES // 2**20} MiB slack; {where}")
    ap = argparse.ArgumentParser(prog="python -m scalelab.core.chunks", description=__doc__.split("\n\n")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=why[0].upper() + why[1:])
    verbs = ap.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("split", help="a file or folder -> NAME.partNNNN chunks + NAME.manifest.json")
    p.add_argument("path", type=Path)
    p.add_argument("out_dir", type=Path, help="an empty (or new) folder for the chunks")
    p.add_argument("--max-mib", type=float, default=default / 2**20,
                   help=f"largest chunk in MiB ({why})")
    p = verbs.add_parser("stage", help="empty STAGE_DIR and copy chunk INDEX and the manifest into it")
    p.add_argument("out_dir", type=Path, help="the folder split wrote")
    p.add_argument("index", type=int, help="chunk number, from 0")
    p.add_argument("stage_dir", type=Path, help="the folder one call carries, e.g. .gpu-chunks")
    p = verbs.add_parser("join", help="verify the chunks and reassemble them into DEST")
    p.add_argument("dest", type=Path, help="new path: the file, or the folder a split folder is unpacked into")
    p.add_argument("inputs", nargs="+", type=Path, help="folders or files holding the chunks and the manifest")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser(tracked_tree_bytes()).parse_args(argv)
    try:
        if args.verb == "split":
            m = split(args.path, args.out_dir, int(args.max_mib * 2**20))
            print(f"{m.name}: {m.total_bytes} bytes ({m.kind}) in {len(m.chunks)} chunk(s) of at most "
                  f"{m.max_chunk_bytes} bytes, sha256 {m.sha256}, in {args.out_dir}")
        elif args.verb == "stage":
            print(f"staged {stage(args.out_dir, args.index, args.stage_dir)}")
        else:
            m = join(args.inputs, args.dest)
            print(f"{args.dest}: {m.total_bytes} bytes from {len(m.chunks)} chunk(s), sha256 {m.sha256} verified")
    except (ChunkError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
