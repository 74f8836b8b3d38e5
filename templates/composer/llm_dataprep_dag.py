"""Cloud Composer (Airflow 3) DAG: prepares one date's training data with the Flex Template.

Four tasks per run (docs/deployment.md, "Schedule it from Cloud Composer"):

1. ``plan_run`` works out the date's inputs, output directory, job name and launch request,
   with the deduplication indexes of the earlier dates' complete runs to filter copies against;
2. ``wait_for_inputs`` waits, without holding a worker slot, until every input pattern matches
   at least one object;
3. ``prepare_training_data`` launches the template, unless a job of the same name is already
   active (an earlier try's launch that reached Dataflow): then it waits on that job instead. It
   waits deferred, in the triggerer, so no worker slot is held for the hours a job runs;
4. ``check_manifest`` reads the job's ``manifest.json`` and fails the run if its records do not
   add up.

The job name is ``llm-dataprep-<date>``, the same on every try of a date, so a retry after a lost
worker finds the running job. Outputs go to ``OUTPUT_ROOT/<date>``; a first try never replaces
existing outputs (the launcher refuses), a retry replaces its own earlier try's partial outputs,
and ``{"overwrite": true}`` in a run's conf replaces a finished date on purpose.

Every run writes its ``dedup_index/`` and deduplicates against those of the ``dedup_window_days``
dates before its own (default 7) whose runs completed, so a document republished a few days
later is filtered as ``duplicate_earlier_run`` instead of being trained on twice; a missing or
incomplete date is skipped, with a line in ``plan_run``'s log.

Deployment settings are one JSON Airflow Variable, ``llm_dataprep``; pipeline settings are DAG
params, which a manual trigger may change. Everything is read when a task runs, so parsing the
DAG needs no Variable and no database.
"""

from __future__ import annotations

import datetime
import json
import logging
import re
from collections.abc import Callable, Mapping

from airflow.providers.google.cloud.hooks.gcs import GCSHook
from airflow.providers.google.cloud.operators.dataflow import DataflowStartFlexTemplateOperator
from airflow.providers.google.cloud.triggers.dataflow import TemplateJobStartTrigger
from airflow.providers.google.common.consts import GOOGLE_DEFAULT_DEFERRABLE_METHOD_NAME
from airflow.sdk import DAG, Param, Variable, task
from airflow.sdk.exceptions import AirflowFailException
from googleapiclient.errors import HttpError

DAG_ID = "llm_dataprep"
VARIABLE = "llm_dataprep"
SETTINGS = f"var.json.{VARIABLE}"
JOB_PREFIX = "llm-dataprep"
# Pipeline options set from the DAG params (named as in templates/flex/metadata.json).
PIPELINE_PARAMS = ("tokenizer", "block_size", "seq_len", "assistant_turns", "num_shards")
# Worker sizing and networking, as FlexTemplateRuntimeEnvironment fields. The Variable's
# "environment" object overrides or adds to these (e.g. "subnetwork", "maxWorkers"). Why these
# values: docs/deployment.md, "Worker sizing and the cost of a run".
WORKER_DEFAULTS = {
    "machineType": "n2-standard-4",  # 4 vCPUs, 16 GB: 4 GB per SDK process
    "maxWorkers": 40,
    "diskSizeGb": 50,  # the image and the spill of a worker; data is staged in Cloud Storage
    "ipConfiguration": "WORKER_IP_PRIVATE",  # needs Private Google Access on the subnetwork
}
INPUT_POKE_S = 10 * 60
INPUT_WAIT = datetime.timedelta(hours=12)
JOB_POLL_S = 60
ACTIVE = "ACTIVE"
ALREADY_EXISTS = 409
GLOB_CHARS = "*?["
DEDUP_INDEX = "dedup_index"
# What --dedup_against accepts: an index folder with Parquet files of its own, beside the
# manifest.json a run writes last (the pipeline refuses any other path and fails the launch).
COMPLETE_RUN = ("manifest.json", f"{DEDUP_INDEX}/*.parquet")

log = logging.getLogger(__name__)


def run_date(context: Mapping) -> datetime.datetime:
    """The logical date; a manual run triggered without one (Airflow 3) is named by its time."""
    run = context["dag_run"]
    return run.logical_date or run.run_after


def job_name(date: datetime.datetime) -> str:
    """The same for every try of a date, so a retry can find the job an earlier try started."""
    return f"{JOB_PREFIX}-{date:%Y%m%d}"


def output_dir(output_root: str, date: datetime.datetime) -> str:
    """``OUTPUT_ROOT/<date>``: one folder per date, so each run's outputs and index stand apart."""
    return f"{output_root.rstrip('/')}/{date:%Y-%m-%d}"


def dedup_window(output_root: str, date: datetime.datetime, days: int,
                 exists: Callable[[str], bool]) -> tuple[list[str], dict[str, str]]:
    """The ``dedup_index`` folders of the ``days`` dates before ``date``, newest first, whose run
    is complete, and the dates skipped with what they lack; ``exists(pattern)`` says whether a
    gs:// pattern matches an object. A date that never ran, failed, or ran without an index is
    skipped, not an error: the pipeline refuses an index that is not there, and one bad day must
    not stop the next week's runs."""
    folders, skipped = [], {}
    for back in range(1, days + 1):
        earlier = date - datetime.timedelta(days=back)
        folder = output_dir(output_root, earlier)
        missing = next((f"{folder}/{name}" for name in COMPLETE_RUN
                        if not exists(f"{folder}/{name}")), None)
        if missing is None:
            folders.append(f"{folder}/{DEDUP_INDEX}")
        else:
            skipped[f"{earlier:%Y-%m-%d}"] = f"no {missing}"
    return folders, skipped


def resolve_inputs(patterns: str, date: datetime.datetime) -> str:
    """Fills ``{ds}``, ``{ds_nodash}`` and ``{date:%Y/%m/%d}``-style fields of the input patterns.

    >>> resolve_inputs("gs://c/web/{date:%Y/%m/%d}/*.zst,gs://c/{ds}.json#branch=instruction",
    ...                datetime.datetime(2026, 11, 28))
    'gs://c/web/2026/11/28/*.zst,gs://c/2026-11-28.json#branch=instruction'
    """
    return patterns.format(date=date, ds=f"{date:%Y-%m-%d}", ds_nodash=f"{date:%Y%m%d}")


def input_globs(inputs: str) -> list[str]:
    """The gs:// patterns of a comma-separated ``--input`` value, without ``#key=value`` parts."""
    return [part.split("#", 1)[0].strip() for part in inputs.split(",") if part.strip()]


def split_gcs(uri: str) -> tuple[str, str]:
    if not uri.startswith("gs://"):
        raise AirflowFailException(f"not a gs:// path: {uri}")
    bucket, _, name = uri[len("gs://"):].partition("/")
    return bucket, name


def matches(hook: GCSHook, pattern: str) -> bool:
    """Whether ``pattern`` matches an object, read as the job reads it (Beam's glob syntax:
    ``*`` within one folder, ``**`` across folders); lists only below its fixed prefix."""
    from apache_beam.io.filesystem import FileSystem  # heavy: imported when a task runs

    bucket, name = split_gcs(pattern)
    cut = min((name.index(c) for c in GLOB_CHARS if c in name), default=None)
    if cut is None:
        return hook.exists(bucket, name)
    regex = re.compile(FileSystem.translate_pattern(name))
    return any(regex.match(found) for found in hook.list(bucket, prefix=name[:cut]))


def manifest_problems(manifest: Mapping) -> list[str]:
    """Why a run's manifest does not balance (empty when it does), from its own fields: every
    record read is kept (knowledge or instruction), filtered or rejected."""
    problems = []
    if manifest.get("complete") is not True:
        problems.append("the manifest is not marked complete")
    records = manifest.get("records", {})
    read = records.get("read")
    parts = {name: records.get(name, 0) for name in ("knowledge", "instruction")}
    parts.update({name: sum(records.get(name, {}).values()) for name in ("filtered", "rejected")})
    if sum(parts.values()) != read or records.get("accounted") != read:
        detail = ", ".join(f"{name} {count:,}" for name, count in parts.items())
        problems.append(f"records do not add up: read {read}, accounted "
                        f"{records.get('accounted')} ({detail})")
    if records.get("balanced") is not True:
        problems.append("the manifest says it is not balanced")
    return problems


def read_json(hook: GCSHook, uri: str) -> dict:
    bucket, name = split_gcs(uri)
    return json.loads(hook.download(bucket, name).decode("utf-8"))


class LaunchOrAttachFlexTemplateOperator(DataflowStartFlexTemplateOperator):
    """Starts the Flex Template job, or waits on the active job of the same name if there is one.

    Dataflow keeps job names unique among active jobs, so an earlier try whose launch reached
    Dataflow (and whose worker was then lost) left a job this try must wait on, not a second job
    writing into the same directory. ``overwrite`` is sent only from the second try on, when no
    job of this name is active any more: the outputs there are then an earlier try's leftovers.
    """

    def execute(self, context):
        launch = self.body["launchParameter"]
        active = self.find_active_job(launch["jobName"])
        if active is None:
            if context["ti"].try_number > 1:
                launch["parameters"]["overwrite"] = "true"
            try:
                return super().execute(context)
            except HttpError as error:  # a retried launch request whose first attempt got through
                if error.resp.status != ALREADY_EXISTS:
                    raise
                active = self.find_active_job(launch["jobName"])
                if active is None:
                    raise
        self.log.info("job %s (%s) is already %s: waiting on it instead of launching another",
                      active["name"], active["id"], active.get("currentState"))
        self.job = active
        self.defer(
            trigger=TemplateJobStartTrigger(
                project_id=self.project_id, job_id=active["id"], location=self.location,
                gcp_conn_id=self.gcp_conn_id, poll_sleep=self.poll_sleep,
                impersonation_chain=self.impersonation_chain,
                cancel_timeout=self.cancel_timeout, drain_pipeline=self.drain_pipeline,
                cancel_on_kill=self.cancel_on_kill),
            method_name=GOOGLE_DEFAULT_DEFERRABLE_METHOD_NAME,
        )

    def defer(self, *, trigger, method_name, kwargs=None, timeout=None):
        """Bounds every wait by ``execution_timeout``: the provider's trigger returns only for a
        job that is done, failed or stopped, so a job cancelled by hand would be waited on for
        ever (a timeout fails the try, and the retry launches again)."""
        super().defer(trigger=trigger, method_name=method_name, kwargs=kwargs,
                      timeout=timeout or self.execution_timeout)

    def find_active_job(self, name: str) -> dict | None:
        """The project's active job named ``name`` in this region (Dataflow's jobs.list)."""
        jobs = self.hook.get_conn().projects().locations().jobs()
        request = jobs.list(projectId=self.project_id, location=self.location, filter=ACTIVE)
        while request is not None:
            response = request.execute(num_retries=self.hook.num_retries)
            for job in response.get("jobs", []):
                if job["name"] == name:
                    return job
            request = jobs.list_next(previous_request=request, previous_response=response)
        return None


with DAG(
    dag_id=DAG_ID,
    description="Prepare LLM training data with the Dataflow Flex Template",
    schedule="@daily",
    start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    catchup=False,
    max_active_runs=1,
    default_args={
        "retries": 2,
        "retry_delay": datetime.timedelta(minutes=10),
        "retry_exponential_backoff": True,
        "execution_timeout": datetime.timedelta(hours=12),
    },
    params={
        "input": Param(
            "", type="string",
            description="gs:// input patterns, comma-separated, with {ds}-style date fields; "
                        "empty: the Variable's 'input'"),
        "overwrite": Param(False, type="boolean",
                           description="replace the date's existing outputs on the first try"),
        "tokenizer": Param("qwen2-offline", type="string",
                           description="gs:// tokenizer directory or the offline default"),
        "block_size": Param(2048, type="integer", minimum=1),
        "seq_len": Param(2048, type="integer", minimum=1),
        "assistant_turns": Param("all", enum=["all", "last"]),
        "num_shards": Param(0, type="integer", minimum=0),
        "dedup_window_days": Param(
            7, type="integer", minimum=0,
            description="deduplicate against the indexes of this many earlier dates' complete "
                        "runs (0: none)"),
    },
    tags=["dataflow", "llm"],
) as dag:

    @task(multiple_outputs=True)
    def plan_run(**context) -> dict:
        """The date's inputs, output directory and launch request, from the Variable and params;
        the earlier dates' indexes are looked up now, when no other run of the DAG is writing
        one (max_active_runs=1)."""
        settings = Variable.get(VARIABLE, deserialize_json=True)
        params = context["params"]
        date = run_date(context)
        inputs = resolve_inputs(params["input"] or settings["input"], date)
        output = output_dir(settings["output_root"], date)
        environment = {
            **WORKER_DEFAULTS,
            "tempLocation": settings["temp_location"],
            "stagingLocation": settings["staging_location"],
            "serviceAccountEmail": settings["service_account"],
            **settings.get("environment", {}),
            "additionalUserLabels": {"airflow-dag": DAG_ID, "run-date": f"{date:%Y%m%d}"},
        }
        parameters = {
            "input": inputs,
            "output": output,
            "overwrite": str(bool(params["overwrite"])).lower(),
            "sdk_container_image": settings["image"],
            **{name: str(params[name]) for name in PIPELINE_PARAMS},
            "write_dedup_index": "true",  # the index later dates deduplicate against
        }
        hook = GCSHook()
        indexes, skipped = dedup_window(settings["output_root"], date,
                                        params["dedup_window_days"],
                                        lambda pattern: matches(hook, pattern))
        for day, why in skipped.items():
            log.info("not deduplicating against %s: %s (a missing or incomplete run)", day, why)
        if indexes:  # never an empty value: the first day has no earlier index
            parameters["dedup_against"] = ",".join(indexes)
            log.info("deduplicating against %d earlier runs: %s", len(indexes),
                     ", ".join(indexes))
        return {
            "inputs": inputs,
            "output": output,
            "body": {"launchParameter": {
                "jobName": job_name(date),
                "containerSpecGcsPath": settings["template_path"],
                "parameters": parameters,
                "environment": environment,
            }},
        }

    @task.sensor(poke_interval=INPUT_POKE_S, timeout=INPUT_WAIT.total_seconds(),
                 mode="reschedule")
    def wait_for_inputs(inputs: str) -> bool:
        """True once every input pattern matches an object; rescheduled (no slot held) until."""
        hook = GCSHook()
        missing = [pattern for pattern in input_globs(inputs) if not matches(hook, pattern)]
        if missing:
            print(f"waiting for inputs: {', '.join(missing)}")
        return not missing

    @task
    def check_manifest(output: str) -> dict:
        """Fails the run (no retry: the files will not change) unless every manifest balances."""
        hook = GCSHook()
        bucket, name = split_gcs(f"{output}/phases.json")
        if hook.exists(bucket, name):  # curriculum phases: one manifest per phase
            manifests = [phase["manifest"] for phase in read_json(hook, f"{output}/phases.json")
                         ["phases"]]
        else:
            manifests = [f"{output}/manifest.json"]
        records = {}
        for uri in manifests:
            if not hook.exists(*split_gcs(uri)):
                raise AirflowFailException(f"{uri} is missing: the job did not complete")
            manifest = read_json(hook, uri)
            problems = manifest_problems(manifest)
            if problems:
                raise AirflowFailException(f"{uri} does not balance: {'; '.join(problems)}")
            records[uri] = manifest["records"]
        return records

    plan = plan_run()
    launch = LaunchOrAttachFlexTemplateOperator(
        task_id="prepare_training_data",
        project_id=f"{{{{ {SETTINGS}.project }}}}",
        location=f"{{{{ {SETTINGS}.region }}}}",
        body=plan["body"],
        append_job_name=False,  # the name is the date's, so a retry finds the running job
        deferrable=True,  # waits in the triggerer: Composer needs one (docs/deployment.md)
        poll_sleep=JOB_POLL_S,
    )
    wait_for_inputs(plan["inputs"]) >> launch >> check_manifest(plan["output"])
