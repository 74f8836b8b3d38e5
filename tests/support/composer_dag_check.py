"""Runs inside the Airflow virtual environment (scripts/airflow_env.sh), not the pipeline's.

Loads the Composer DAG folder with Airflow's DagBag, then runs the DAG with ``dag.test()`` for
each requested logical date: Airflow renders the operator's templates from the real run context
(logical date, params merged with the run's conf, the ``llm_dataprep`` Variable from
``AIRFLOW_VAR_LLM_DATAPREP``), and the operator calls the Dataflow hook, which is replaced here by
a recorder of the launch request. Writes one JSON report to OUT (Airflow logs to stdout) for
tests/test_composer_dag.py to check. Expects AIRFLOW_HOME with a migrated database and
AIRFLOW__CORE__DAGS_FOLDER set to DAG_FOLDER.

    python composer_dag_check.py DAG_FOLDER DAG_ID TASK_ID RUNS_JSON OUT
    RUNS_JSON: [{"logical_date": "2026-11-28T00:00:00+00:00", "conf": {...}}, ...]
"""

from __future__ import annotations

import datetime
import json
import sys
from unittest import mock

from airflow.models import DagBag
from airflow.providers.google.cloud.hooks.dataflow import DataflowHook


def describe_task(task) -> dict:
    return {
        "operator": type(task).__name__,
        "retries": task.retries,
        "retry_delay_s": task.retry_delay.total_seconds(),
        "append_job_name": task.append_job_name,
        "wait_until_finished": task.wait_until_finished,
        "template_fields": list(task.template_fields),
    }


def run_once(dag, logical_date: str, conf: dict) -> dict:
    """One dag.test() run; returns what the operator sent to the Dataflow hook."""
    launches: list[dict] = []

    def record_launch(hook, body, location, project_id, on_new_job_callback=None):
        launches.append({"body": body, "location": location, "project_id": project_id})
        job = {"id": f"job-{len(launches)}", "name": body["launchParameter"]["jobName"]}
        if on_new_job_callback:
            on_new_job_callback(job)
        return job

    with mock.patch.object(DataflowHook, "start_flex_template", record_launch):
        run = dag.test(logical_date=datetime.datetime.fromisoformat(logical_date), run_conf=conf)
    return {"logical_date": logical_date, "conf": conf, "state": str(run.state),
            "launches": launches}


def main(dag_folder: str, dag_id: str, task_id: str, runs: str, out: str) -> None:
    bag = DagBag(dag_folder=dag_folder)
    report: dict = {"import_errors": {str(k): v for k, v in bag.import_errors.items()},
                    "dag_ids": sorted(bag.dags)}
    dag = bag.dags.get(dag_id)
    if dag is not None:
        report["dag"] = {
            "schedule": str(dag.schedule),
            "cron": dag.timetable.expression,
            "catchup": dag.catchup,
            "max_active_runs": dag.max_active_runs,
            "params": {name: dag.params[name] for name in dag.params},
        }
        report["task"] = describe_task(dag.get_task(task_id))
        report["runs"] = [run_once(dag, r["logical_date"], r.get("conf", {}))
                          for r in json.loads(runs)]
    with open(out, "w") as handle:
        json.dump(report, handle, default=str)


if __name__ == "__main__":
    main(*sys.argv[1:])
