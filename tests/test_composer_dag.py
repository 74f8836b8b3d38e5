"""The Composer DAG, loaded and run by Airflow 3 in its own virtual environment.

Airflow's pins clash with the pipeline's, so scripts/airflow_env.sh builds .venv-airflow (once;
it is rebuilt only when templates/composer's pin files change) and
tests/support/composer_dag_check.py runs there: Airflow's DagBag must import the DAG folder
cleanly, and ``dag.test()`` runs the whole DAG once per scenario below against the Cloud Storage
emulator (tests/support/gcs.py, started here) and a fake of the Dataflow REST API
(tests/support/fake_dataflow.py), all in one subprocess shared by the tests.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from pathlib import Path

import pytest
from google.cloud.dataflow_v1beta3.types import LaunchFlexTemplateParameter
from google.protobuf import json_format

from tests.conftest import ROOT
from tests.support.gcs import child_env, cloud_env, metadata_server, storage_emulator

DAG_FOLDER = ROOT / "templates" / "composer"
DAG_ID = "llm_dataprep"
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
INSTALL_TIMEOUT_S = 1800
CHECK_TIMEOUT_S = 300


def inputs_of(ds: str) -> dict[str, str]:
    """The objects SETTINGS["input"] expects for the date ``ds`` (YYYY-MM-DD)."""
    return {f"gs://{BUCKET}/corpus/web/{ds}/part-0.jsonl": '{"text": "a document"}\n',
            f"gs://{BUCKET}/corpus/sft/{ds[:4]}/{ds[5:7]}/chats.json": "[]"}


def scenario(name: str, ds: str, **fields) -> dict:
    return {"name": name, "logical_date": f"{ds}T00:00:00+00:00", "objects": inputs_of(ds),
            **fields}


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
                   "overwrite": True},
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

