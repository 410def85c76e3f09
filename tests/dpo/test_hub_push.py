"""The Hub push through huggingface_hub's real client, against a loopback stand-in of the Hub API: the repo is
created private, every file of the adapter folder arrives with its bytes, the token comes from HF_TOKEN only
(sent as the Authorization header, never printed or logged), and no token means no request at all."""
from __future__ import annotations

import base64
import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from scalelab.dpo.export import push_folder

TOKEN = "hf_standin_secret_0123456789"


class HubStandIn(BaseHTTPRequestHandler):
    """The endpoints HfApi.create_repo and upload_folder call (regular uploads, no LFS): create, preupload, commit."""
    log: list = []
    files: dict = {}

    def _send(self, obj, status=200):
        out = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_POST(self):  # noqa: N802 (http.server's name)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).log.append((self.command, self.path, self.headers.get("Authorization"), raw))
        if self.path == "/api/repos/create":
            body = json.loads(raw)
            return self._send({"url": f"http://{self.headers['Host']}/{body.get('organization') or 'me'}/{body['name']}"})
        if "/preupload/" in self.path:
            files = json.loads(raw)["files"]
            return self._send({"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                         for f in files]})
        if "/commit/" in self.path:
            for line in raw.decode().splitlines():
                item = json.loads(line)
                if item["key"] == "file":
                    type(self).files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
            return self._send({"commitUrl": f"http://{self.headers['Host']}/me/adapter/commit/abc123",
                               "commitOid": "abc123",
                               "pullRequestUrl": None})
        self._send({"error": f"stand-in: no {self.path}"}, 404)

    def do_GET(self):  # noqa: N802
        type(self).log.append((self.command, self.path, self.headers.get("Authorization"), b""))
        self._send({"error": f"stand-in: no {self.path}"}, 404)

    def log_message(self, *args):
        pass


@pytest.fixture
def hub():
    HubStandIn.log, HubStandIn.files = [], {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), HubStandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def adapter_folder(tmp_path):
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    (folder / "adapter_model.safetensors").write_bytes(bytes(range(256)) * 4)
    return folder


def test_push_to_the_stand_in(hub, tmp_path, monkeypatch, capsys, caplog):
    import huggingface_hub.constants
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    # the client's own side requests (its agent registry) go to the global endpoint: keep them on loopback too
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub)
    folder = adapter_folder(tmp_path)
    with caplog.at_level(logging.DEBUG):
        res = push_folder(folder, "me/adapter", private=True, endpoint=hub)
    assert res.repo_id == "me/adapter" and res.url == f"{hub}/me/adapter/commit/abc123"
    create = [r for r in HubStandIn.log if r[1] == "/api/repos/create"]
    assert len(create) == 1 and json.loads(create[0][3]) == {"name": "adapter", "organization": "me",
                                                              "visibility": "private"}
    assert HubStandIn.files == {p.name: p.read_bytes() for p in folder.iterdir()}
    push = [r for r in HubStandIn.log if r[1].startswith(("/api/repos/", "/api/models/me/adapter/"))]
    assert [r[1].rsplit("/", 2)[-2] for r in push] == ["repos", "preupload", "commit"]
    assert {r[2] for r in push} == {f"Bearer {TOKEN}"}               # each of them authorized by HF_TOKEN
    assert {r[2] for r in HubStandIn.log} - {f"Bearer {TOKEN}"} <= {None}  # and no other credential
    out = capsys.readouterr()
    assert TOKEN not in out.out + out.err + caplog.text and TOKEN not in repr(res)


def test_no_token_no_request(hub, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(RuntimeError, match="HF_TOKEN"):
        push_folder(adapter_folder(tmp_path), "me/adapter", endpoint=hub)
    assert HubStandIn.log == []
