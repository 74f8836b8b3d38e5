"""The Composer DAG, loaded and run by Airflow 3 in its own virtual environment.

Airflow's pins clash with the pipeline's, so scripts/airflow_env.sh builds .venv-airflow (once;
it is rebuilt only when templates/composer's pin files change) and
tests/support/composer_dag_check.py runs there: Airflow's DagBag must import the DAG folder
cleanly, and ``dag.test()`` runs the DAG for given logical dates with the Dataflow hook recorded
instead of called, so what is checked here is the launch request Airflow itself rendered.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

DAG_FOLDER = ROOT / "templates" / "composer"
DAG_ID = "llm_dataprep"
TASK_ID = "prepare_training_data"
METADATA = ROOT / "templates" / "flex" / "metadata.json"
SETTINGS = {
    "project": "my-project-1234",
    "region": "europe-west4",
    "template_path": "gs://my-bucket/templates/llm-dataprep-abc123.json",
    "image": "europe-west4-docker.pkg.dev/my-project-1234/dataprep/llm-dataprep:abc123",
    "input": "gs://my-corpus/web/*.jsonl.zst,gs://my-corpus/sft/*.json",
    "output_root": "gs://my-prepared/llm/",
    "temp_location": "gs://my-bucket/temp",
    "staging_location": "gs://my-bucket/staging",
    "service_account": "dataprep-worker@my-project-1234.iam.gserviceaccount.com",
}
SCHEDULED = {"logical_date": "2026-11-28T00:00:00+00:00", "conf": {}}
OVERRIDDEN = {"logical_date": "2026-11-29T00:00:00+00:00",
              "conf": {"input": "gs://my-corpus/extra/*.jsonl", "seq_len": 4096}}
INSTALL_TIMEOUT_S = 1800


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
    env = {key: value for key, value in os.environ.items() if not key.startswith("AIRFLOW")}
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
    out = home / "report.json"
    check = subprocess.run(
        [str(python), str(ROOT / "tests" / "support" / "composer_dag_check.py"), str(DAG_FOLDER),
         DAG_ID, TASK_ID, json.dumps([SCHEDULED, OVERRIDDEN]), str(out)],
        check=False, env=env, cwd=home, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout[-5000:] + check.stderr[-5000:]
    return json.loads(out.read_text())


def launch(report: dict, run: dict) -> dict:
    [result] = [r for r in report["runs"] if r["logical_date"] == run["logical_date"]]
    assert result["state"] == "success"
    [request] = result["launches"]
    return request


def test_dag_folder_imports_cleanly(report):
    assert report["import_errors"] == {}
    assert report["dag_ids"] == [DAG_ID]


def test_dag_runs_daily_with_retries_and_one_run_at_a_time(report):
    assert report["dag"]["schedule"] == "@daily"
    assert report["dag"]["cron"] == "0 0 * * *"
    assert report["dag"]["catchup"] is False
    assert report["dag"]["max_active_runs"] == 1
    task = report["task"]
    assert task["operator"] == "DataflowStartFlexTemplateOperator"
    assert task["retries"] >= 1
    assert task["retry_delay_s"] >= 60
    assert task["append_job_name"] is True
    assert task["wait_until_finished"] is True


def test_scheduled_run_launches_the_template_into_its_dated_directory(report):
    request = launch(report, SCHEDULED)
    assert request["project_id"] == SETTINGS["project"]
    assert request["location"] == SETTINGS["region"]
    body = request["body"]["launchParameter"]
    assert body["containerSpecGcsPath"] == SETTINGS["template_path"]
    assert re.fullmatch(r"llm-dataprep-20261128-[0-9a-f]{8}", body["jobName"])
    assert body["parameters"] == {
        "input": SETTINGS["input"],
        "output": "gs://my-prepared/llm/2026-11-28",
        "overwrite": "true",
        "sdk_container_image": SETTINGS["image"],
        "tokenizer": "qwen2-offline",
        "block_size": "2048",
        "seq_len": "2048",
        "assistant_turns": "all",
        "num_shards": "0",
    }
    assert body["environment"] == {
        "tempLocation": SETTINGS["temp_location"],
        "stagingLocation": SETTINGS["staging_location"],
        "serviceAccountEmail": SETTINGS["service_account"],
        "additionalUserLabels": {"airflow-dag": DAG_ID, "run-date": "20261128"},
    }


def test_run_conf_overrides_params_and_every_run_gets_its_own_job(report):
    scheduled = launch(report, SCHEDULED)["body"]["launchParameter"]
    overridden = launch(report, OVERRIDDEN)["body"]["launchParameter"]
    assert overridden["parameters"]["input"] == OVERRIDDEN["conf"]["input"]
    assert overridden["parameters"]["seq_len"] == "4096"
    assert overridden["parameters"]["output"] == "gs://my-prepared/llm/2026-11-29"
    assert overridden["jobName"].startswith("llm-dataprep-20261129-")
    assert overridden["jobName"] != scheduled["jobName"]


def test_launch_parameters_are_template_parameters_with_valid_values(report):
    """The DAG sends only parameters the template declares, all required ones, each valid."""
    declared = {p["name"]: p for p in json.loads(METADATA.read_text())["parameters"]}
    for run in (SCHEDULED, OVERRIDDEN):
        parameters = dict(launch(report, run)["body"]["launchParameter"]["parameters"])
        assert parameters.pop("sdk_container_image")  # a Dataflow option, not the template's
        assert set(parameters) <= set(declared)
        assert {n for n, p in declared.items() if not p["isOptional"]} <= set(parameters)
        for name, value in parameters.items():
            for regex in declared[name].get("regexes", []):
                assert re.fullmatch(regex, value), (name, value)
            if "enumOptions" in declared[name]:
                assert value in [o["value"] for o in declared[name]["enumOptions"]]
