"""The project's own errors: bad input a user can fix, as opposed to bugs.

Each carries a one-line message naming what is wrong and where (the file and line, the url, the field);
`kind` is the word the CLI prints before it (`scalelab: data error: shards/train_000.bin: ...`), with exit
status 2 and no traceback unless `--debug`. Classes elsewhere keep their old builtin base beside these
(`class ShardError(DataError, ValueError)`), so code that caught the builtin still does.
"""
from __future__ import annotations


class ScalelabError(Exception):
    """Bad input or a failed outside component, described in one line."""

    kind = "error"


class DataError(ScalelabError):
    """A data file or row that cannot be read: a corrupt shard, a bad row (file and line)."""

    kind = "data error"


class ModelError(ScalelabError):
    """A model, tokenizer or checkpoint that is missing or cannot be used (the path)."""

    kind = "model error"


class ServerError(ScalelabError):
    """A server that did not start, or answered garbage (the url and what came back)."""

    kind = "server error"


class SandboxError(ScalelabError):
    """Untrusted code cannot be run with the isolation the run asked for."""

    kind = "sandbox error"
