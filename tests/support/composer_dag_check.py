"""Runs inside the Airflow virtual environment (scripts/airflow_env.sh), not the pipeline's.

Loads the Composer DAG folder with Airflow's DagBag, then runs the DAG with ``dag.test()`` once per
scenario. Airflow renders and runs every task for real (the Variable from
``AIRFLOW_VAR_LLM_DATAPREP``, params merged with the run's conf, the deferred wait run inline as
the triggerer would). Two services are local fakes:

- Cloud Storage is the ``gcp-storage-emulator`` the test started (``STORAGE_EMULATOR_HOST``), read
  and written through the provider's own ``GCSHook``;
- the Dataflow REST API is ``fake_dataflow.FakeDataflow``: the provider's ``DataflowHook`` builds
  its real API client against it (only the endpoint and credentials differ), and the trigger's
  gRPC status call is answered from the same fake, so a job "runs" by being polled. A job that
  reaches ``JOB_STATE_DONE`` writes the scenario's manifest to its output directory, and an
  index file into its ``dedup_index/`` when launched with ``write_dedup_index=true``.

Writes one JSON report to OUT (Airflow logs to stdout) for tests/test_composer_dag.py. Expects
AIRFLOW_HOME with a migrated database and AIRFLOW__CORE__DAGS_FOLDER set to DAG_FOLDER.

    python composer_dag_check.py DAG_FOLDER DAG_ID SCENARIOS OUT

SCENARIOS is a JSON file holding a list of scenarios. A scenario: ``{"name", "logical_date",
"conf", "objects": {gs_uri: text} to upload first,
"manifest": what a finished job writes, "active_jobs": [{"name", "output"}] already running,
"job_scripts": [[state, ...], ...] for the jobs launched, "drop_launch_responses": N,
"fail_job_reads": N, "globs": [patterns to match against the bucket]}``. Each run's report
has the lines the DAG file logged (``logged``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime
import importlib.util
import json
import logging
import os
import sys
import urllib.request
from pathlib import Path
from unittest import mock

import httplib2
from airflow.models import DagBag
from airflow.providers.google.cloud.hooks.dataflow import AsyncDataflowHook, DataflowHook
from airflow.providers.google.cloud.hooks.gcs import GCSHook
from airflow.sdk import BaseOperator
from fake_dataflow import FakeDataflow, serve
from google.cloud.dataflow_v1beta3 import JobState
from googleapiclient.discovery import build

LAUNCH_TASK = "prepare_training_data"
INDEX_FILE = "dedup_index/part-00000-of-00001.parquet"


class Recorder(logging.Handler):
    """Keeps the messages logged from one source file (the DAG's), whatever its logger."""

    def __init__(self, path: Path):
        super().__init__(logging.DEBUG)
        self.path, self.messages = path.resolve(), []

    def emit(self, record: logging.LogRecord) -> None:
        if Path(record.pathname).resolve() == self.path:
            self.messages.append(record.getMessage())


def load_dag_module(dag_folder: str, dag_id: str):
    """The DAG file as a module, for its helper functions."""
    spec = importlib.util.spec_from_file_location(dag_id, Path(dag_folder) / f"{dag_id}_dag.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def upload(uri: str, data: str) -> None:
    bucket, _, name = uri.removeprefix("gs://").partition("/")
    GCSHook().upload(bucket, name, data=data)


def describe(dag) -> dict:
    task = dag.get_task(LAUNCH_TASK)
    return {
        "schedule": str(dag.schedule),
        "cron": dag.timetable.expression,
        "catchup": dag.catchup,
        "max_active_runs": dag.max_active_runs,
        "params": {name: dag.params[name] for name in dag.params},
        "tasks": {t.task_id: sorted(t.downstream_task_ids) for t in dag.tasks},
        "launch": {"operator": type(task).__name__, "retries": task.retries,
                   "execution_timeout_s": task.execution_timeout.total_seconds(),
                   "retry_delay_s": task.retry_delay.total_seconds(),
                   "deferrable": task.deferrable, "append_job_name": task.append_job_name,
                   "wait_until_finished": task.wait_until_finished},
        "sensor_mode": dag.get_task("wait_for_inputs").mode,
    }


def finish_job(job: dict, manifest: dict) -> None:
    """What a finished job leaves: its manifest and, when asked for, its deduplication index."""
    output = job["parameters"]["output"]
    if job["parameters"].get("write_dedup_index") == "true":
        upload(f"{output}/{INDEX_FILE}", "PAR1")
    upload(f"{output}/manifest.json", json.dumps(manifest))


def run_scenario(dag, fake: FakeDataflow, scenario: dict, dag_file: Path) -> dict:
    for uri, text in scenario.get("objects", {}).items():
        upload(uri, text)
    fake.requests.clear()
    for job in scenario.get("active_jobs", []):
        settings = json.loads(os.environ["AIRFLOW_VAR_LLM_DATAPREP"])
        fake.add_job(job["name"], settings["project"], settings["region"],
                     {"output": job["output"]}, script=job.get("script"))
    fake.next_scripts = [list(s) for s in scenario.get("job_scripts", [])]
    fake.drop_launch_responses = scenario.get("drop_launch_responses", 0)
    fake.fail_job_reads = scenario.get("fail_job_reads", 0)
    fake.on_done = lambda job: finish_job(job, scenario["manifest"])
    # Tasks run in this process, and running one merges the run's conf into its params object:
    # give every run fresh copies, as a new task process would have.
    params = {t.task_id: copy.deepcopy(t.params) for t in dag.tasks}
    deferrals: list = []
    defer = BaseOperator.defer

    def recorded_defer(task, **kwargs):
        deferrals.append(kwargs["timeout"])
        defer(task, **kwargs)

    recorder, root = Recorder(dag_file), logging.getLogger()
    root.addHandler(recorder)
    try:
        with mock.patch.object(BaseOperator, "defer", recorded_defer):
            run = dag.test(logical_date=datetime.datetime.fromisoformat(scenario["logical_date"]),
                           run_conf=scenario.get("conf", {}))
    finally:
        root.removeHandler(recorder)
    for t in dag.tasks:
        t.params = params[t.task_id]
    tasks = {ti.task_id: {"state": str(ti.state), "try_number": ti.try_number}
             for ti in run.get_task_instances()}
    return {
        "name": scenario["name"], "state": str(run.state), "tasks": tasks,
        "launches": [r["body"] for r in fake.requests if r["method"] == "POST"],
        "polled": sorted({r["path"].rsplit("/", 1)[1] for r in fake.requests
                          if r["method"] == "GET" and "/jobs/" in r["path"]}),
        "jobs": [dict(job) for job in fake.jobs],
        "defer_timeouts_s": [t.total_seconds() if t else None for t in deferrals],
        "logged": recorder.messages,
    }


def main(dag_folder: str, dag_id: str, scenarios: str, out: str) -> None:
    bag = DagBag(dag_folder=dag_folder)
    report: dict = {"import_errors": {str(k): v for k, v in bag.import_errors.items()},
                    "dag_ids": sorted(bag.dags)}
    dag = bag.dags.get(dag_id)
    if dag is not None:
        report["dag"] = describe(dag)
        # No waiting in tests: retry at once, poll the fake job without sleeping.
        launch = dag.get_task(LAUNCH_TASK)
        launch.retry_delay, launch.retry_exponential_backoff = datetime.timedelta(0), False
        launch.poll_sleep = 0
        module = load_dag_module(dag_folder, dag_id)
        fake = FakeDataflow()
        with serve(fake) as endpoint, patched_dataflow(endpoint):
            scenarios_list = json.loads(Path(scenarios).read_text())
            dag_file = Path(dag_folder) / f"{dag_id}_dag.py"
            report["runs"] = [run_scenario(dag, fake, s, dag_file) for s in scenarios_list]
            report["globs"] = {pattern: module.matches(GCSHook(), pattern)
                               for s in scenarios_list for pattern in s.get("globs", [])}
    with open(out, "w") as handle:
        json.dump(report, handle, default=str)


def patched_dataflow(endpoint: str):
    """The provider's Dataflow hooks, pointed at the fake service."""

    def get_conn(hook):
        return build("dataflow", "v1b3", http=httplib2.Http(), cache_discovery=False,
                     static_discovery=True, client_options={"api_endpoint": endpoint})

    async def get_job_status(hook, job_id, project_id=None, location=None, **_):
        url = f"{endpoint}v1b3/projects/{project_id}/locations/{location}/jobs/{job_id}"

        def read() -> dict:
            with urllib.request.urlopen(url, timeout=10) as response:
                return json.loads(response.read())

        return JobState[(await asyncio.to_thread(read))["currentState"]]

    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.object(DataflowHook, "get_conn", get_conn))
    stack.enter_context(mock.patch.object(AsyncDataflowHook, "get_job_status", get_job_status))
    return stack


if __name__ == "__main__":
    main(*sys.argv[1:])
