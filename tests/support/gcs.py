"""Cloud Storage on 127.0.0.1: the ``gcp-storage-emulator`` plus a fake GCE metadata server.

Beam's GCS filesystem sends its requests to ``STORAGE_EMULATOR_HOST`` when that is set, but it
still looks for credentials first: with none, google-auth probes the metadata server at
169.254.169.254 and Beam retries for about 20 s, in every process (each ``multi_processing``
worker too). A tiny server that answers like the metadata service (a dummy token, which the
emulator ignores) makes that lookup instant; ``GCE_METADATA_HOST`` and ``GCE_METADATA_IP`` point
google-auth at it. ``cloud_env`` is the environment a child process needs; ``use_in_process``
applies it to the test process itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

PROJECT = "beam-dataprep-test"
SERVICE_ACCOUNT = f"dataflow-worker@{PROJECT}.iam.gserviceaccount.com"
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
STARTUP_TIMEOUT_S = 30.0
PRECONDITIONS = Path(__file__).with_name("gcs_preconditions.py")

_TEXT = {
    "/computeMetadata/v1/project/project-id": PROJECT,
    "/computeMetadata/v1/project/numeric-project-id": "1234",
    "/computeMetadata/v1/instance/service-accounts/default/email": SERVICE_ACCOUNT,
    "/computeMetadata/v1/universe/universe-domain": "googleapis.com",
}
_JSON = {
    "/computeMetadata/v1/instance/service-accounts/default/": {
        "email": SERVICE_ACCOUNT, "scopes": SCOPES, "aliases": ["default"]},
    "/computeMetadata/v1/instance/service-accounts/default/token": {
        "access_token": "emulator-token", "expires_in": 3600, "token_type": "Bearer"},
}


def free_port() -> int:
    """A port that was free a moment ago on 127.0.0.1 (the emulator binds it by number)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _MetadataHandler(BaseHTTPRequestHandler):
    """Answers the few metadata paths google-auth reads; every answer carries the flavor header
    that its detection probe checks."""

    def do_GET(self) -> None:
        # The account is asked for by name as well as as "default" (newer google-auth does).
        path = urlsplit(self.path).path.replace(f"/{SERVICE_ACCOUNT}/", "/default/")
        if path in _JSON:
            body, content_type, status = json.dumps(_JSON[path]), "application/json", 200
        elif path in _TEXT or path == "/":
            body, content_type, status = _TEXT.get(path, ""), "application/text", 200
        else:
            body, content_type, status = "not found", "text/plain", 404
        data = body.encode()
        self.send_response(status)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        """Silent: pytest would show every probe."""


@contextlib.contextmanager
def metadata_server() -> Iterator[str]:
    """Serves the fake metadata service in a thread; yields its ``host:port``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _MetadataHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextlib.contextmanager
def storage_emulator(bucket: str) -> Iterator[str]:
    """Runs ``gcp-storage-emulator`` in memory with ``bucket`` created, and with the generation
    preconditions of real GCS (``gcs_preconditions.py``); yields its base URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, str(PRECONDITIONS), "start", "--host=127.0.0.1",
         f"--port={port}", "--in-memory", f"--default-bucket={bucket}", "--quiet"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_until_up(url, process)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr:
            process.stderr.close()


def _wait_until_up(url: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            stderr = process.stderr.read().decode(errors="replace") if process.stderr else ""
            raise RuntimeError(f"gcp-storage-emulator exited with {process.returncode}: {stderr}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url + "/", timeout=1) as resp:
            if resp.status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"gcp-storage-emulator did not answer on {url} in {STARTUP_TIMEOUT_S}s")


def cloud_env(emulator_url: str, metadata_host: str) -> dict[str, str]:
    """The variables that send every GCS client in a process to the emulator, credentials and
    all; merge them into a child process's environment."""
    return {
        "STORAGE_EMULATOR_HOST": emulator_url,
        "GCE_METADATA_HOST": metadata_host,
        "GCE_METADATA_IP": metadata_host,
        "GOOGLE_CLOUD_PROJECT": PROJECT,
    }


def child_env(env: dict[str, str]) -> dict[str, str]:
    """This process's environment plus ``env``, without credentials that would win over it."""
    merged = {k: v for k, v in os.environ.items() if k != "GOOGLE_APPLICATION_CREDENTIALS"}
    merged.update(env)
    return merged


def use_in_process(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """Applies ``env`` to this process for one test, undoing it afterwards.

    google-auth reads ``GCE_METADATA_HOST`` once, when it is imported, and Beam caches the
    credentials it found, so both are reset here as well as the variables.
    """
    from apache_beam.internal.gcp import auth
    from google.auth.compute_engine import _metadata

    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(_metadata, "_GCE_METADATA_HOST", env["GCE_METADATA_HOST"])
    monkeypatch.setattr(auth._Credentials, "_credentials_init", False)
    monkeypatch.setattr(auth._Credentials, "_credentials", None)
