"""A fake of the Dataflow REST API (v1b3) on 127.0.0.1, for the Composer DAG's ``dag.test()`` runs.

It answers the three calls the DAG makes, at the paths and with the JSON shapes of the real API,
so the Google provider's own request building and response parsing run unchanged:

- ``GET  .../projects/P/locations/L/jobs?filter=ACTIVE`` lists jobs (active ones with the filter);
- ``POST .../projects/P/locations/L/flexTemplates:launch`` creates a job, or answers 409
  ALREADY_EXISTS while a job of that name is active, as Dataflow keeps names unique among
  active jobs;
- ``GET  .../projects/P/locations/L/jobs/ID`` returns a job. Each read moves the job one step
  along its script of states (queued, running, done by default), which is how a job "runs"
  here; when it reaches ``JOB_STATE_DONE`` the ``on_done`` callback runs (it writes the job's
  manifest, as the real job would).

``drop_launch_responses`` makes the next N launches create their job and then close the
connection without an answer: a launch that reached Dataflow whose answer was lost.
``fail_job_reads`` makes the next N reads of a job answer 500 without moving it: the waiting
side loses touch with a job that goes on running.
Standard library only: it runs inside the Airflow virtual environment.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

TERMINAL = {"JOB_STATE_DONE", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_STOPPED",
            "JOB_STATE_UPDATED", "JOB_STATE_DRAINED"}
DEFAULT_SCRIPT = ("JOB_STATE_QUEUED", "JOB_STATE_RUNNING", "JOB_STATE_DONE")
_BASE = r"/v1b3/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)"
_LIST = re.compile(_BASE + r"/jobs")
_GET = re.compile(_BASE + r"/jobs/(?P<job_id>[^/]+)")
_LAUNCH = re.compile(_BASE + r"/flexTemplates:launch")


class FakeDataflow:
    """The fake service's state: jobs, the scripts of states they follow, and every request."""

    def __init__(self, on_done: Callable[[dict], None] | None = None):
        self.jobs: list[dict] = []
        self.scripts: dict[str, list[str]] = {}
        self.next_scripts: list[list[str]] = []
        self.requests: list[dict] = []
        self.drop_launch_responses = 0
        self.fail_job_reads = 0
        self.on_done = on_done
        self.lock = threading.Lock()

    def add_job(self, name: str, project: str, location: str, parameters: dict,
                script: list[str] | None = None) -> dict:
        """A job as the launch creates it; ``script`` is the states it goes through."""
        if script is None:
            script = self.next_scripts.pop(0) if self.next_scripts else list(DEFAULT_SCRIPT)
        states = list(script)
        job = {"id": f"2026-fake-{len(self.jobs) + 1:04d}", "name": name, "projectId": project,
               "location": location, "type": "JOB_TYPE_BATCH", "currentState": states.pop(0),
               "parameters": parameters}
        self.jobs.append(job)
        self.scripts[job["id"]] = states
        return job

    def active(self) -> list[dict]:
        return [job for job in self.jobs if job["currentState"] not in TERMINAL]

    def advance(self, job: dict) -> None:
        script = self.scripts[job["id"]]
        if script:
            job["currentState"] = script.pop(0)
            if job["currentState"] == "JOB_STATE_DONE" and self.on_done:
                self.on_done(job)


class _Handler(BaseHTTPRequestHandler):
    service: FakeDataflow

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        with self.service.lock:
            self.service.requests.append({"method": "GET", "path": url.path})
            if match := _GET.fullmatch(url.path):
                job = next((j for j in self.service.jobs if j["id"] == match["job_id"]), None)
                if job is None:
                    return self._error(404, "NOT_FOUND", f"job {match['job_id']} not found")
                if self.service.fail_job_reads:
                    self.service.fail_job_reads -= 1
                    return self._error(500, "INTERNAL", "the backend did not answer")
                self.service.advance(job)
                return self._send(200, job)
            if _LIST.fullmatch(url.path):
                active = parse_qs(url.query).get("filter") == ["ACTIVE"]
                return self._send(200, {"jobs": self.service.active() if active
                                        else list(self.service.jobs)})
        self._error(404, "NOT_FOUND", url.path)

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        with self.service.lock:
            self.service.requests.append({"method": "POST", "path": url.path, "body": body})
            match = _LAUNCH.fullmatch(url.path)
            if match is None:
                return self._error(404, "NOT_FOUND", url.path)
            launch = body["launchParameter"]
            if any(job["name"] == launch["jobName"] for job in self.service.active()):
                return self._error(409, "ALREADY_EXISTS",
                                   f"a job named {launch['jobName']} is already active")
            job = self.service.add_job(launch["jobName"], match["project"], match["location"],
                                       launch.get("parameters", {}))
            if self.service.drop_launch_responses:
                self.service.drop_launch_responses -= 1
                self.close_connection = True
                return
            self._send(200, {"job": job})

    def _error(self, code: int, status: str, message: str) -> None:
        self._send(code, {"error": {"code": code, "status": status, "message": message}})

    def _send(self, code: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        """Silent: the requests are recorded instead."""


@contextlib.contextmanager
def serve(service: FakeDataflow) -> Iterator[str]:
    """Serves ``service`` in a thread; yields its base URL (an ``api_endpoint``)."""
    handler = type("Handler", (_Handler,), {"service": service})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
