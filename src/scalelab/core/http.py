"""JSON over HTTP to a local server (a rollout server, a weight-transfer endpoint), with its errors named.

Standard library only: the trainer's side of a server talks a few endpoints, one request at a time, so a
client library would add a dependency and nothing the calls need.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request

from scalelab.core import errors


class ServerError(errors.ServerError, RuntimeError):
    """The server answered with an error or an unexpected body."""


def _reply(req: urllib.request.Request, timeout_s: float) -> bytes:
    """The body of the server's answer; an HTTP error status as a ServerError naming method, URL and reply."""
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.read()
    except urllib.error.HTTPError as e:
        raise ServerError(f"{req.get_method()} {req.full_url}: HTTP {e.code}: "
                          f"{e.read()[:500].decode('utf-8', 'replace')}") from None


def post_json(url: str, body: dict, timeout_s: float) -> dict:
    raw = _reply(urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                        headers={"Content-Type": "application/json"}), timeout_s)
    try:
        return json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError:  # some endpoints (e.g. /v1/load_lora_adapter) answer in plain text
        return {"text": raw.decode("utf-8", "replace")}


def get_json(url: str, timeout_s: float) -> dict:
    return json.loads(_reply(urllib.request.Request(url, method="GET"), timeout_s))
