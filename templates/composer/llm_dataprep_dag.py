"""Cloud Composer (Airflow 3) DAG: runs the data-preparation Flex Template on Dataflow daily.

Each run writes to its own directory, ``OUTPUT_ROOT/<logical date>``, so runs never mix files
and a retry or a manual re-run of a date replaces that date's partial outputs
(``overwrite=true``) without touching any other date. The deployment's settings live in one JSON
Airflow Variable, ``llm_dataprep`` (README: "Deploying to Dataflow and scheduling from
Composer"); pipeline settings are DAG params, which a manual trigger may change. Everything is
read when the task runs, through templates, so parsing the DAG needs no Variable and no database.

The Flex Template launcher submits the job and exits; the operator then polls the job until it
finishes, so the task's state is the job's state and a failed job is retried.
"""

from __future__ import annotations

import datetime

from airflow.providers.google.cloud.operators.dataflow import DataflowStartFlexTemplateOperator
from airflow.sdk import DAG, Param

DAG_ID = "llm_dataprep"
VARIABLE = "llm_dataprep"
SETTINGS = f"var.json.{VARIABLE}"
# A manual run triggered without a logical date (allowed in Airflow 3) is named by its run time.
RUN_DATE = "(dag_run.logical_date or dag_run.run_after)"
# Pipeline options set from the DAG params (named as in templates/flex/metadata.json).
PIPELINE_PARAMS = ("tokenizer", "block_size", "seq_len", "assistant_turns", "num_shards")

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
            description="gs:// input patterns, comma-separated; empty: the Variable's 'input'"),
        "tokenizer": Param("qwen2-offline", type="string",
                           description="gs:// tokenizer directory or the offline default"),
        "block_size": Param(2048, type="integer", minimum=1),
        "seq_len": Param(2048, type="integer", minimum=1),
        "assistant_turns": Param("all", enum=["all", "last"]),
        "num_shards": Param(0, type="integer", minimum=0),
    },
    tags=["dataflow", "llm"],
) as dag:
    DataflowStartFlexTemplateOperator(
        task_id="prepare_training_data",
        project_id=f"{{{{ {SETTINGS}.project }}}}",
        location=f"{{{{ {SETTINGS}.region }}}}",
        # The operator appends a random suffix, so every run and every try gets a unique job name.
        append_job_name=True,
        wait_until_finished=True,
        body={
            "launchParameter": {
                "jobName": f"llm-dataprep-{{{{ {RUN_DATE} | ds_nodash }}}}",
                "containerSpecGcsPath": f"{{{{ {SETTINGS}.template_path }}}}",
                "parameters": {
                    "input": f"{{{{ params.input or {SETTINGS}.input }}}}",
                    "output": f"{{{{ {SETTINGS}.output_root.rstrip('/') }}}}/"
                              f"{{{{ {RUN_DATE} | ds }}}}",
                    "overwrite": "true",
                    "sdk_container_image": f"{{{{ {SETTINGS}.image }}}}",
                    **{name: f"{{{{ params.{name} }}}}" for name in PIPELINE_PARAMS},
                },
                "environment": {
                    "tempLocation": f"{{{{ {SETTINGS}.temp_location }}}}",
                    "stagingLocation": f"{{{{ {SETTINGS}.staging_location }}}}",
                    "serviceAccountEmail": f"{{{{ {SETTINGS}.service_account }}}}",
                    "additionalUserLabels": {"airflow-dag": DAG_ID,
                                             "run-date": f"{{{{ {RUN_DATE} | ds_nodash }}}}"},
                },
            },
        },
    )
