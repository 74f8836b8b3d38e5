"""The Composer DAG, loaded and run by Airflow 3 in its own virtual environment.

Airflow's pins clash with the pipeline's, so scripts/airflow_env.sh builds .venv-airflow (once;
it is rebuilt only when templates/composer's pin files change) and
tests/support/composer_dag_check.py runs there: Airflow's DagBag must import the DAG folder
cleanly, and ``dag.test()`` runs the whole DAG once per scenario below against the Cloud Storage
emulator (tests/support/gcs.py, started here) and a fake of the Dataflow REST API
(tests/support/fake_dataflow.py), all in one subprocess shared by the tests. The DAG file's pure
helpers are also unit-tested here, compiled without its Airflow imports.
"""

from __future__ import annotations

import ast
import copy
import datetime
import fnmatch
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from google.cloud.dataflow_v1beta3.types import LaunchFlexTemplateParameter
from google.protobuf import json_format

from tests.conftest import ROOT
from tests.support.gcs import child_env, cloud_env, metadata_server, storage_emulator

DAG_FOLDER = ROOT / "templates" / "composer"
DAG_ID = "llm_dataprep"
DAG_FILE = DAG_FOLDER / f"{DAG_ID}_dag.py"
METADATA = ROOT / "templates" / "flex" / "metadata.json"
# A manifest.json the pipeline wrote (c4_sample.jsonl and alpaca_seed_tasks.json of examples/).
MANIFEST = ROOT / "tests" / "data" / "composer" / "manifest.json"
BUCKET = "llm-dataprep-test"
SETTINGS = {
    "project": "my-project-1234",
    "region": "europe-west4",
    "template_path": f"gs://{BUCKET}/templates/llm-dataprep-abc123.json",
    "image": "europe-west4-docker.pkg.dev/my-project-1234/dataprep/llm-dataprep:abc123",
    "input": f"gs://{BUCKET}/corpus/web/{{ds}}/*.jsonl,"
             f"gs://{BUCKET}/corpus/sft/{{date:%Y/%m}}/chats.json#branch=instruction",
    "output_root": f"gs://{BUCKET}/prepared/",
    "temp_location": f"gs://{BUCKET}/temp",
    "staging_location": f"gs://{BUCKET}/staging",
    "service_account": "dataprep-worker@my-project-1234.iam.gserviceaccount.com",
    "environment": {"subnetwork": "regions/europe-west4/subnetworks/dataprep", "maxWorkers": 8},
}
PREPARED = f"gs://{BUCKET}/prepared"
# What a finished run leaves that the DAG looks for (composer_dag_check writes the same on done).
MANIFEST_FILE, INDEX_FILE = "manifest.json", "dedup_index/part-00000-of-00001.parquet"
INSTALL_TIMEOUT_S = 1800
CHECK_TIMEOUT_S = 300


def inputs_of(ds: str) -> dict[str, str]:
    """The objects SETTINGS["input"] expects for the date ``ds`` (YYYY-MM-DD)."""
    return {f"gs://{BUCKET}/corpus/web/{ds}/part-0.jsonl": '{"text": "a document"}\n',
            f"gs://{BUCKET}/corpus/sft/{ds[:4]}/{ds[5:7]}/chats.json": "[]"}


def earlier_run(ds: str, *names: str) -> dict[str, str]:
    """Objects a run of the date ``ds`` left in its folder: by default a complete run's."""
    return {f"{PREPARED}/{ds}/{name}": "{}" for name in names or (MANIFEST_FILE, INDEX_FILE)}


def complete_runs(*days: str) -> dict[str, str]:
    return {uri: text for ds in days for uri, text in earlier_run(ds).items()}


def index_of(ds: str) -> str:
    return f"{PREPARED}/{ds}/dedup_index"


def scenario(name: str, ds: str, earlier: dict[str, str] | None = None, **fields) -> dict:
    return {"name": name, "logical_date": f"{ds}T00:00:00+00:00",
            "objects": {**inputs_of(ds), **(earlier or {})}, **fields}


def unbalanced(manifest: dict) -> dict:
    """The manifest of a run that lost a record: read once more than it accounted for."""
    broken = copy.deepcopy(manifest)
    broken["records"]["read"] += 1
    broken["records"]["balanced"] = False
    return broken


BALANCED = json.loads(MANIFEST.read_text())
FAILED = ["JOB_STATE_QUEUED", "JOB_STATE_RUNNING", "JOB_STATE_FAILED"]
SCENARIOS = [
    scenario("scheduled", "2026-11-20", manifest=BALANCED,
             globs=[f"gs://{BUCKET}/corpus/web/2026-11-20/*.jsonl",
                    f"gs://{BUCKET}/corpus/web/*.jsonl",
                    f"gs://{BUCKET}/corpus/**/chats.json",
                    f"gs://{BUCKET}/corpus/web/2026-11-2[0]/part-0.jsonl",
                    f"gs://{BUCKET}/corpus/web/2026-11-20/part-?.jsonl",
                    f"gs://{BUCKET}/corpus/web/2026-11-20/part-0.jsonl",
                    f"gs://{BUCKET}/corpus/web/2026-12-01/*.jsonl"]),
    scenario("overridden", "2026-11-21", manifest=BALANCED,
             conf={"input": f"gs://{BUCKET}/extra/{{ds_nodash}}/*.jsonl", "seq_len": 4096,
                   "overwrite": True, "dedup_window_days": 0},
             objects={f"gs://{BUCKET}/extra/20261121/a.jsonl": '{"text": "x"}\n'}),
    scenario("active_job", "2026-11-22", manifest=BALANCED,
             active_jobs=[{"name": "llm-dataprep-20261122",
                           "output": f"gs://{BUCKET}/prepared/2026-11-22",
                           "script": ["JOB_STATE_RUNNING", "JOB_STATE_RUNNING",
                                      "JOB_STATE_DONE"]}]),
    scenario("lost_launch_response", "2026-11-23", manifest=BALANCED, drop_launch_responses=1),
    scenario("failed_job", "2026-11-24", manifest=BALANCED, job_scripts=[FAILED]),
    scenario("lost_wait", "2026-11-26", manifest=BALANCED, fail_job_reads=1),
    scenario("unbalanced", "2026-11-25", manifest=unbalanced(BALANCED)),
    # Deduplication across runs. Eight complete earlier dates: the default window takes seven.
    scenario("dedup_window", "2026-12-10", manifest=BALANCED,
             earlier=complete_runs(*(f"2026-12-{day:02d}" for day in range(2, 10)))),
    # Gaps in a window of six: no run, runs without an index or a manifest, a stray file.
    scenario("dedup_gaps", "2026-12-20", manifest=BALANCED, conf={"dedup_window_days": 6},
             earlier={**complete_runs("2026-12-19", "2026-12-15", "2026-12-13"),
                      **earlier_run("2026-12-17", MANIFEST_FILE),
                      **earlier_run("2026-12-16", INDEX_FILE),
                      **earlier_run("2026-12-14", MANIFEST_FILE, "dedup_index/_SUCCESS")}),
]


def airflow_python() -> Path:
    """The Airflow venv's interpreter, creating the venv on first use (minutes, then cached)."""
    result = subprocess.run(["bash", str(ROOT / "scripts" / "airflow_env.sh")], check=False,
                            capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-5000:]
    return Path(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    python = airflow_python()
    home = tmp_path_factory.mktemp("airflow-home")
    with metadata_server() as metadata_host, storage_emulator(BUCKET) as emulator_url:
        env = {k: v for k, v in child_env(cloud_env(emulator_url, metadata_host)).items()
               if not k.startswith("AIRFLOW")}
        env.update({
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAG_FOLDER),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW_VAR_LLM_DATAPREP": json.dumps(SETTINGS),
            "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": "google-cloud-platform://",
        })
        migrate = subprocess.run([str(python.parent / "airflow"), "db", "migrate"], check=False,
                                 env=env, cwd=home, capture_output=True, text=True, timeout=300)
        assert migrate.returncode == 0, migrate.stdout[-3000:] + migrate.stderr[-3000:]
        scenarios, out = home / "scenarios.json", home / "report.json"
        scenarios.write_text(json.dumps(SCENARIOS))
        check = subprocess.run(
            [str(python), str(ROOT / "tests" / "support" / "composer_dag_check.py"),
             str(DAG_FOLDER), DAG_ID, str(scenarios), str(out)],
            check=False, env=env, cwd=home, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
    assert check.returncode == 0, check.stdout[-5000:] + check.stderr[-5000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def helpers() -> dict:
    """The DAG file's standard-library part (its imports of the standard library, constants and
    functions; not the operator class nor the DAG), run without Airflow."""
    tree = ast.parse(DAG_FILE.read_text())

    def standard(node: ast.stmt) -> bool:
        if isinstance(node, ast.Import):
            return all(a.name.split(".")[0] in sys.stdlib_module_names for a in node.names)
        if isinstance(node, ast.ImportFrom):
            return node.module.split(".")[0] in {"__future__", *sys.stdlib_module_names}
        return isinstance(node, (ast.Assign, ast.AnnAssign, ast.FunctionDef))

    namespace: dict = {"__name__": "llm_dataprep_dag_helpers"}
    module = ast.Module(body=[n for n in tree.body if standard(n)], type_ignores=[])
    exec(compile(module, str(DAG_FILE), "exec"), namespace)
    return namespace


def run_of(report: dict, name: str) -> dict:
    [run] = [r for r in report["runs"] if r["name"] == name]
    return run


def launch_of(report: dict, name: str) -> dict:
    [launch] = run_of(report, name)["launches"]
    return launch["launchParameter"]


def states(run: dict) -> dict[str, str]:
    return {task: info["state"] for task, info in run["tasks"].items()}


ALL_SUCCESS = {"plan_run": "success", "wait_for_inputs": "success",
               "prepare_training_data": "success", "check_manifest": "success"}


def test_dag_folder_imports_cleanly(report):
    assert report["import_errors"] == {}
    assert report["dag_ids"] == [DAG_ID]


def test_dag_runs_daily_one_run_at_a_time_waiting_deferred(report):
    dag = report["dag"]
    assert (dag["schedule"], dag["cron"], dag["catchup"], dag["max_active_runs"]) == (
        "@daily", "0 0 * * *", False, 1)
    assert dag["tasks"] == {"plan_run": ["check_manifest", "prepare_training_data",
                                         "wait_for_inputs"],
                            "wait_for_inputs": ["prepare_training_data"],
                            "prepare_training_data": ["check_manifest"],
                            "check_manifest": []}
    launch = dag["launch"]
    assert launch["operator"] == "LaunchOrAttachFlexTemplateOperator"
    assert launch["retries"] >= 1 and launch["retry_delay_s"] >= 60
    assert launch["deferrable"] is True and not launch["wait_until_finished"]
    assert launch["append_job_name"] is False
    assert dag["sensor_mode"] == "reschedule"


def test_scheduled_run_launches_once_into_its_dated_directory(report):
    run = run_of(report, "scheduled")
    assert run["state"] == "success" and states(run) == ALL_SUCCESS
    body = launch_of(report, "scheduled")
    assert body["jobName"] == "llm-dataprep-20261120"
    assert body["containerSpecGcsPath"] == SETTINGS["template_path"]
    assert body["parameters"] == {
        "input": f"gs://{BUCKET}/corpus/web/2026-11-20/*.jsonl,"
                 f"gs://{BUCKET}/corpus/sft/2026/11/chats.json#branch=instruction",
        "output": f"gs://{BUCKET}/prepared/2026-11-20",
        "overwrite": "false",
        "sdk_container_image": SETTINGS["image"],
        "tokenizer": "qwen2-offline", "block_size": "2048", "seq_len": "2048",
        "assistant_turns": "all", "num_shards": "0",
        "write_dedup_index": "true",  # the first date: no earlier index, no dedup_against
    }
    assert body["environment"] == {
        "machineType": "n2-standard-4", "maxWorkers": 8, "diskSizeGb": 50,
        "ipConfiguration": "WORKER_IP_PRIVATE",
        "subnetwork": "regions/europe-west4/subnetworks/dataprep",
        "tempLocation": SETTINGS["temp_location"],
        "stagingLocation": SETTINGS["staging_location"],
        "serviceAccountEmail": SETTINGS["service_account"],
        "additionalUserLabels": {"airflow-dag": DAG_ID, "run-date": "20261120"},
    }
    named = [j for j in run["jobs"] if j["name"] == body["jobName"]]
    assert [j["currentState"] for j in named] == ["JOB_STATE_DONE"]


def test_run_conf_overrides_the_inputs_params_and_overwrite(report):
    run = run_of(report, "overridden")
    assert run["state"] == "success"
    parameters = launch_of(report, "overridden")["parameters"]
    assert parameters["input"] == f"gs://{BUCKET}/extra/20261121/*.jsonl"
    assert parameters["seq_len"] == "4096"
    assert parameters["overwrite"] == "true"
    assert parameters["output"] == f"gs://{BUCKET}/prepared/2026-11-21"


def test_every_wait_on_a_job_is_bounded_by_the_execution_timeout(report):
    """The provider's trigger never returns for a cancelled job; the deferral's timeout ends it."""
    timeout = report["dag"]["launch"]["execution_timeout_s"]
    waits = [t for run in report["runs"] for t in run["defer_timeouts_s"]]
    assert len(waits) >= len(report["runs"]) and set(waits) == {timeout}


def test_an_active_job_of_the_same_name_is_waited_on_not_launched_again(report):
    run = run_of(report, "active_job")
    assert run["state"] == "success" and states(run) == ALL_SUCCESS
    assert run["launches"] == []
    [job] = [j for j in run["jobs"] if j["name"] == "llm-dataprep-20261122"]
    assert run["polled"] == [job["id"]]
    assert job["currentState"] == "JOB_STATE_DONE"


def test_a_launch_whose_answer_was_lost_attaches_to_the_job_it_started(report):
    """The HTTP client sends the launch again; Dataflow answers 409 (the name is active) and
    the task waits on the job the first request created."""
    run = run_of(report, "lost_launch_response")
    assert run["state"] == "success" and states(run) == ALL_SUCCESS
    assert run["tasks"]["prepare_training_data"]["try_number"] == 1
    first, again = run["launches"]
    assert first == again
    named = [j for j in run["jobs"] if j["name"] == "llm-dataprep-20261123"]
    assert [j["currentState"] for j in named] == ["JOB_STATE_DONE"]
    assert run["polled"] == [named[0]["id"]]


def test_a_retry_after_losing_a_running_job_waits_on_it_instead_of_launching(report):
    """Try 1 launches, then loses touch while the job runs (the task fails as if its worker
    died); try 2 finds the job still active under the date's name and waits on it."""
    run = run_of(report, "lost_wait")
    assert run["state"] == "success" and states(run) == ALL_SUCCESS
    assert run["tasks"]["prepare_training_data"]["try_number"] == 2
    [launch] = run["launches"]
    assert launch["launchParameter"]["jobName"] == "llm-dataprep-20261126"
    named = [j for j in run["jobs"] if j["name"] == "llm-dataprep-20261126"]
    assert [j["currentState"] for j in named] == ["JOB_STATE_DONE"]
    assert run["polled"] == [named[0]["id"]]


def test_a_retry_after_a_failed_job_relaunches_and_replaces_its_partial_outputs(report):
    run = run_of(report, "failed_job")
    assert run["state"] == "success"
    assert run["tasks"]["prepare_training_data"]["try_number"] == 2
    first, second = run["launches"]
    assert first["launchParameter"]["jobName"] == second["launchParameter"]["jobName"]
    assert first["launchParameter"]["parameters"]["overwrite"] == "false"
    assert second["launchParameter"]["parameters"]["overwrite"] == "true"
    named = [j for j in run["jobs"] if j["name"] == "llm-dataprep-20261124"]
    assert [j["currentState"] for j in named] == ["JOB_STATE_FAILED", "JOB_STATE_DONE"]


def test_an_unbalanced_manifest_fails_the_run_after_the_job_succeeded(report):
    run = run_of(report, "unbalanced")
    assert run["state"] == "failed"
    assert states(run) == {**ALL_SUCCESS, "check_manifest": "failed"}
    assert run["tasks"]["check_manifest"]["try_number"] == 1  # not retried: the file is final


def test_the_manifest_fixture_balances_as_the_pipeline_wrote_it():
    records = BALANCED["records"]
    assert BALANCED["complete"] is True and records["balanced"] is True
    assert records["read"] == records["knowledge"] + records["instruction"] + sum(
        records["filtered"].values()) + sum(records["rejected"].values())
    assert records["knowledge"] > 0 and records["instruction"] > 0


def test_input_globs_follow_cloud_storage_semantics(report):
    assert report["globs"] == {
        f"gs://{BUCKET}/corpus/web/2026-11-20/*.jsonl": True,
        f"gs://{BUCKET}/corpus/web/*.jsonl": False,  # '*' stays within one folder
        f"gs://{BUCKET}/corpus/**/chats.json": True,
        f"gs://{BUCKET}/corpus/web/2026-11-2[0]/part-0.jsonl": True,
        f"gs://{BUCKET}/corpus/web/2026-11-20/part-?.jsonl": True,
        f"gs://{BUCKET}/corpus/web/2026-11-20/part-0.jsonl": True,
        f"gs://{BUCKET}/corpus/web/2026-12-01/*.jsonl": False,
    }


def test_launch_requests_parse_as_dataflow_launch_parameters(report):
    """Every field is one the API knows, every enum value valid (ParseDict rejects others)."""
    for run in report["runs"]:
        for request in run["launches"]:
            json_format.ParseDict(request["launchParameter"],
                                  LaunchFlexTemplateParameter.pb(LaunchFlexTemplateParameter()))


def test_launch_parameters_are_template_parameters_with_valid_values(report):
    """The DAG sends only parameters the template declares, all required ones, each valid."""
    declared = {p["name"]: p for p in json.loads(METADATA.read_text())["parameters"]}
    for run in report["runs"]:
        for request in run["launches"]:
            parameters = request["launchParameter"]["parameters"]
            assert set(parameters) <= set(declared)
            assert {n for n, p in declared.items() if not p["isOptional"]} <= set(parameters)
            for name, value in parameters.items():
                for regex in declared[name].get("regexes", []):
                    assert re.fullmatch(regex, value), (name, value)
                if "enumOptions" in declared[name]:
                    assert value in [o["value"] for o in declared[name]["enumOptions"]]


# ------------------------------------------------------------------ deduplication across runs


def skip_lines(run: dict) -> list[str]:
    return [line for line in run["logged"] if line.startswith("not deduplicating against")]


def test_every_run_writes_its_dedup_index_and_the_window_defaults_to_a_week(report):
    assert report["dag"]["params"]["dedup_window_days"] == 7
    launches = [r for run in report["runs"] for r in run["launches"]]
    assert launches and all(r["launchParameter"]["parameters"]["write_dedup_index"] == "true"
                            for r in launches)


def test_the_first_date_passes_no_earlier_index_and_logs_the_dates_it_looked_for(report):
    run = run_of(report, "scheduled")
    assert "dedup_against" not in launch_of(report, "scheduled")["parameters"]
    days = [f"2026-11-{day}" for day in range(19, 12, -1)]
    assert skip_lines(run) == [f"not deduplicating against {ds}: no {PREPARED}/{ds}/manifest.json"
                               " (a missing or incomplete run)" for ds in days]


def test_a_run_deduplicates_against_the_indexes_the_runs_before_it_wrote(report):
    """The scenarios run in order in one bucket: the 2026-11-23 run finds what the jobs of
    2026-11-21 and 2026-11-20 left (a manifest and an index each), but not 2026-11-22's index:
    that job was started outside the DAG, without ``write_dedup_index``."""
    run = run_of(report, "lost_launch_response")
    parameters = run["launches"][0]["launchParameter"]["parameters"]
    assert parameters["dedup_against"] == f"{index_of('2026-11-21')},{index_of('2026-11-20')}"
    assert skip_lines(run)[0] == (f"not deduplicating against 2026-11-22: no {PREPARED}/"
                                  "2026-11-22/dedup_index/*.parquet (a missing or incomplete run)")


def test_the_window_passes_every_complete_earlier_date_newest_first(report):
    run = run_of(report, "dedup_window")
    assert run["state"] == "success" and states(run) == ALL_SUCCESS
    parameters = launch_of(report, "dedup_window")["parameters"]
    week = [index_of(f"2026-12-{day:02d}") for day in range(9, 2, -1)]  # not 2026-12-02
    assert parameters["dedup_against"] == ",".join(week)
    assert parameters["write_dedup_index"] == "true"
    assert skip_lines(run) == []
    assert f"deduplicating against 7 earlier runs: {', '.join(week)}" in run["logged"]


def test_missing_and_incomplete_dates_are_skipped_and_logged_the_others_passed(report):
    run = run_of(report, "dedup_gaps")
    assert run["state"] == "success" and states(run) == ALL_SUCCESS
    parameters = launch_of(report, "dedup_gaps")["parameters"]
    assert parameters["dedup_against"] == f"{index_of('2026-12-19')},{index_of('2026-12-15')}"
    assert skip_lines(run) == [
        f"not deduplicating against {ds}: no {PREPARED}/{ds}/{lacks} (a missing or incomplete run)"
        for ds, lacks in [("2026-12-18", "manifest.json"),  # no run
                          ("2026-12-17", "dedup_index/*.parquet"),  # run without an index
                          ("2026-12-16", "manifest.json"),  # a run that did not finish
                          ("2026-12-14", "dedup_index/*.parquet")]]  # not an index file


def test_a_window_of_zero_days_deduplicates_against_nothing(report):
    """The 2026-11-21 run, triggered with a window of 0, though 2026-11-20's run is complete."""
    run = run_of(report, "overridden")
    parameters = launch_of(report, "overridden")["parameters"]
    assert "dedup_against" not in parameters and parameters["write_dedup_index"] == "true"
    assert [line for line in run["logged"] if "deduplicating" in line] == []


class Bucket:
    """``exists`` over a set of object names, ``*`` within one folder as the DAG's ``matches``
    reads it; every pattern asked about is kept."""

    def __init__(self, *names: str):
        self.names, self.asked = set(names), []

    def __call__(self, pattern: str) -> bool:
        self.asked.append(pattern)
        return any(fnmatch.fnmatchcase(name, pattern) and name.count("/") == pattern.count("/")
                   for name in self.names)


def objects(*runs: dict[str, str]) -> list[str]:
    return [uri for run in runs for uri in run]


DAY = datetime.datetime(2026, 12, 10, tzinfo=datetime.UTC)


def test_dedup_window_all_earlier_dates_complete_newest_first(helpers):
    bucket = Bucket(*objects(complete_runs("2026-12-09", "2026-12-08", "2026-12-07")))
    folders, skipped = helpers["dedup_window"](f"{PREPARED}/", DAY, 3, bucket)
    assert folders == [index_of("2026-12-09"), index_of("2026-12-08"), index_of("2026-12-07")]
    assert skipped == {}
    assert bucket.asked[:2] == [f"{PREPARED}/2026-12-09/manifest.json",
                                f"{PREPARED}/2026-12-09/dedup_index/*.parquet"]


def test_dedup_window_skips_missing_and_incomplete_dates_saying_what_they_lack(helpers):
    bucket = Bucket(*objects(complete_runs("2026-12-09", "2026-12-06"),
                             earlier_run("2026-12-08", MANIFEST_FILE),
                             earlier_run("2026-12-07", INDEX_FILE)))
    folders, skipped = helpers["dedup_window"](PREPARED, DAY, 5, bucket)
    assert folders == [index_of("2026-12-09"), index_of("2026-12-06")]
    assert skipped == {"2026-12-08": f"no {PREPARED}/2026-12-08/dedup_index/*.parquet",
                       "2026-12-07": f"no {PREPARED}/2026-12-07/manifest.json",
                       "2026-12-05": f"no {PREPARED}/2026-12-05/manifest.json"}
    assert f"{PREPARED}/2026-12-05/dedup_index/*.parquet" not in bucket.asked  # no manifest: done


def test_dedup_window_on_the_first_date_and_across_a_year_end(helpers):
    """A manual run is named by its time; its earlier dates are still whole days before."""
    manual = datetime.datetime(2027, 1, 2, 15, 30, tzinfo=datetime.UTC)
    folders, skipped = helpers["dedup_window"](PREPARED, manual, 3, Bucket())
    assert folders == []
    assert list(skipped) == ["2027-01-01", "2026-12-31", "2026-12-30"]


def test_dedup_window_of_zero_days_asks_nothing(helpers):
    bucket = Bucket(*objects(complete_runs("2026-12-09")))
    assert helpers["dedup_window"](PREPARED, DAY, 0, bucket) == ([], {})
    assert bucket.asked == []


def test_output_dir_is_the_folder_the_window_looks_in(helpers):
    assert helpers["output_dir"](f"{PREPARED}/", DAY) == f"{PREPARED}/2026-12-10"
