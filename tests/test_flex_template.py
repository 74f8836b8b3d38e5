"""The Dataflow Flex Template: metadata.json against the pipeline's options, both ways; the
Dockerfile's paths; the launcher entry point; the build script; and the package that workers
install. Nothing here reaches Google Cloud: the launcher is checked with Beam's DataflowRunner in
dry-run mode, which builds the whole Dataflow job and stops before submitting it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import runpy
import subprocess
import sys
import tarfile

import apache_beam as beam
import pytest
import yaml
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_runner_api_pb2
from google.cloud.dataflow_v1beta3.types import TemplateMetadata

from beam_pipeline import beam_internals
from beam_pipeline.options import OPTION_GROUPS, argument_parser, config_from_options
from tests.conftest import EXAMPLES, ROOT

FLEX = ROOT / "templates" / "flex"
METADATA = FLEX / "metadata.json"
DOCKERFILE = FLEX / "Dockerfile"
GCS_SAMPLE = "gs://my-bucket/data/part-1.jsonl"
# Path parameters whose value is more than a path; others get GCS_SAMPLE.
PATH_SAMPLES = {"schema": "alpaca=gs://my-bucket/schemas/alpaca.pbtxt",
                "quality_model": "dclm=fasttext:gs://my-bucket/models/dclm.bin#label=hq, "
                                 "hf:gs://my-bucket/models/fineweb-edu"}
IMAGE = "europe-west4-docker.pkg.dev/my-project-1234/dataprep/llm-dataprep:abc123"
WORKER_IMAGE = "sdk_container_image"


def load_generator():
    spec = importlib.util.spec_from_file_location("gen_flex_metadata",
                                                  ROOT / "scripts" / "gen_flex_metadata.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def metadata() -> dict:
    return json.loads(METADATA.read_text())


@pytest.fixture(scope="module")
def parameters(metadata) -> dict[str, dict]:
    """The parameters of the pipeline's own options (the worker image is Beam's)."""
    return {p["name"]: p for p in metadata["parameters"] if p["name"] != WORKER_IMAGE}


@pytest.fixture(scope="module")
def worker_image(metadata) -> dict:
    [param] = [p for p in metadata["parameters"] if p["name"] == WORKER_IMAGE]
    return param


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return argument_parser()


@pytest.fixture(scope="module")
def own_actions(parser) -> dict[str, argparse.Action]:
    """The options of the pipeline's own groups, found in the parser (others add options too)."""
    titles = tuple(title for title, _ in OPTION_GROUPS)
    return {action.option_strings[0].removeprefix("--"): action
            for title, actions in beam_internals.group_actions(parser).items() if title in titles
            for action in actions}


def sample(param: dict) -> str:
    """A value for a parameter taken from its declaration only."""
    if "defaultValue" in param:
        return param["defaultValue"]
    if param.get("enumOptions"):
        return param["enumOptions"][0]["value"]
    if param.get("regexes"):
        return PATH_SAMPLES.get(param["name"], GCS_SAMPLE)
    return "Answer briefly."


def test_metadata_json_is_generated_from_the_current_options(metadata):
    assert metadata == load_generator().build_metadata(), (
        "templates/flex/metadata.json is out of date: run scripts/gen_flex_metadata.py")


def test_metadata_parses_as_dataflow_template_metadata(metadata):
    parsed = TemplateMetadata.from_json(METADATA.read_text())  # unknown fields are an error
    assert [p.name for p in parsed.parameters] == [p["name"] for p in metadata["parameters"]]
    assert all(p.label and p.help_text for p in parsed.parameters)
    assert not parsed.streaming


def test_every_own_option_is_a_parameter_and_every_parameter_an_option(parameters, own_actions):
    assert {"input", "output", "tokenizer", "chat_template", "block_size", "seq_len"} <= set(
        own_actions)
    assert set(parameters) == set(own_actions)


def test_every_parameter_parses_with_a_sample_value(parameters, parser, own_actions):
    namespace = parser.parse_args([f"--{name}={sample(p)}" for name, p in parameters.items()])
    for name, param in parameters.items():
        assert getattr(namespace, own_actions[name].dest) is not None, name
        for regex in param.get("regexes", []):
            assert re.fullmatch(regex, sample(param)), (name, regex)


def test_required_parameters_are_exactly_those_the_pipeline_cannot_start_without(parameters):
    required = {name: sample(p) for name, p in parameters.items() if not p["isOptional"]}
    assert set(required) == {"input", "output"}
    config = config_from_options(PipelineOptions([f"--{k}={v}" for k, v in required.items()]))
    assert config.output == GCS_SAMPLE  # so every other parameter is indeed optional
    for name in required:
        argv = [f"--{k}={v}" for k, v in required.items() if k != name]
        with pytest.raises(ValueError, match=f"--{name}"):
            config_from_options(PipelineOptions(argv))


def test_help_texts_match_the_command_line(parameters, parser, own_actions):
    for name, param in parameters.items():
        expected = parser._get_formatter()._expand_help(own_actions[name])
        assert param["helpText"] == " ".join(expected.split()), name


def test_defaults_parse_back_to_the_options_defaults(parameters, parser, own_actions):
    defaults = parser.parse_args([])
    for name, param in parameters.items():
        action = own_actions[name]
        if action.default is None:
            assert "defaultValue" not in param, name
            continue
        namespace = parser.parse_args([f"--{name}={param['defaultValue']}"])
        assert getattr(namespace, action.dest) == getattr(defaults, action.dest), name
        if action.choices:
            assert [o["value"] for o in param["enumOptions"]] == list(action.choices)


def test_worker_image_is_declared_and_the_build_makes_its_own_image_the_default(
        worker_image, parser, tmp_path):
    assert worker_image["isOptional"] and "defaultValue" not in worker_image  # no build, no image
    namespace = parser.parse_args([f"--{WORKER_IMAGE}={IMAGE}"])
    assert namespace.sdk_container_image == IMAGE  # the launcher hands it to Beam as is
    for image in (IMAGE, "apache/beam_python3.11_sdk:2.77.0", f"{IMAGE}@sha256:{'0' * 64}"):
        assert re.fullmatch(worker_image["regexes"][0], image), image
    assert not re.fullmatch(worker_image["regexes"][0], "not an image")
    built = load_generator().build_metadata(IMAGE)
    TemplateMetadata.from_json(json.dumps(built))
    [param] = [p for p in built["parameters"] if p["name"] == WORKER_IMAGE]
    assert param == {**worker_image, "defaultValue": IMAGE}
    assert [p for p in built["parameters"] if p["name"] != WORKER_IMAGE] == [
        p for p in json.loads(METADATA.read_text())["parameters"] if p["name"] != WORKER_IMAGE]


def test_path_parameters_accept_gcs_and_reject_local_paths(parameters):
    paths = {name for name, param in parameters.items() if "gs://" in param["helpText"]}
    assert {"input", "output", "tokenizer", "chat_template"} <= paths
    for name in paths:
        regexes = parameters[name]["regexes"]
        assert regexes, name
        assert all(re.fullmatch(r, sample(parameters[name])) for r in regexes), name
        assert not all(re.fullmatch(r, "/home/me/data.jsonl") for r in regexes), name
    input_regexes = parameters["input"]["regexes"]
    several = "gs://b/a/*.jsonl, gs://b/g.jsonl#branch=instruction;prompt=question"
    assert all(re.fullmatch(r, several) for r in input_regexes)
    assert not all(re.fullmatch(r, "gs://b/a.jsonl,/local/b.jsonl") for r in input_regexes)


# --------------------------------------------------------------------------- the image


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [tuple(line.split(None, 1)) for line in lines if line and not line.startswith("#")]


def test_every_path_the_dockerfile_copies_exists():
    copies = [args.split() for op, args in dockerfile_instructions() if op == "COPY"]
    local = [args for args in copies if not args[0].startswith("--from")]
    assert local, "the Dockerfile copies nothing from the build context"
    for args in local:
        for source in args[:-1]:
            assert (ROOT / source).exists(), f"COPY {source}: not in the repository"


def test_dockerfile_sets_the_launcher_and_the_worker_entry_points():
    instructions = dockerfile_instructions()
    env = dict(args.split("=", 1) for op, args in instructions if op == "ENV")
    copies = [args.split() for op, args in instructions if op == "COPY"]
    assert ["templates/flex/main.py", env["FLEX_TEMPLATE_PYTHON_PY_FILE"]] in copies
    assert "FLEX_TEMPLATE_PYTHON_REQUIREMENTS_FILE" not in env  # installed at build time
    assert "FLEX_TEMPLATE_PYTHON_SETUP_FILE" not in env
    assert any(args[0] == "--from=launcher" and args[1].endswith("python_template_launcher")
               for args in copies)
    assert ("ENTRYPOINT", '["/opt/apache/beam/boot"]') in instructions
    froms = [args for op, args in instructions if op == "FROM"]
    assert froms[0].startswith("gcr.io/dataflow-templates-base/python311-template-launcher-base:")
    assert froms[1] == "apache/beam_python3.11_sdk:${BEAM_VERSION}"


def test_image_beam_version_equals_the_pinned_one():
    args = dict(a.split("=", 1) for op, a in dockerfile_instructions() if op == "ARG" and "=" in a)
    pinned = re.search(r"^apache-beam\[gcp\]==(\S+)$", (ROOT / "requirements.txt").read_text(),
                       re.MULTILINE)
    assert pinned and args["BEAM_VERSION"] == pinned.group(1)
    assert re.fullmatch(r"20\d{6}_RC\d\d", args["LAUNCHER_TAG"])  # dated, not "latest"
    assert f"py{sys.version_info.major}{sys.version_info.minor}" == "py311"  # the image's Python


def test_cloud_build_builds_this_dockerfile():
    config = yaml.safe_load((FLEX / "cloudbuild.yaml").read_text())
    args = config["steps"][0]["args"]
    assert (ROOT / args[args.index("--file") + 1]) == DOCKERFILE
    assert args[-1] == "."  # the repository root is the build context
    assert config["images"] == ["${_IMAGE}"]


def build_script(*args: str, **env: str) -> subprocess.CompletedProcess:
    settings = {"PROJECT": "my-project-1234", "REGION": "europe-west4", "BUCKET": "my-bucket",
                "REPO": "dataprep", "TAG": "abc123", "DRY_RUN": "1",
                "PYTHON": sys.executable, **env}
    return subprocess.run(["bash", str(FLEX / "build_and_run.sh"), *args], check=False, cwd=ROOT,
                          env={**os.environ, **settings}, capture_output=True, text=True,
                          timeout=120)


def test_build_script_builds_the_image_then_the_template_spec(tmp_path):
    metadata = tmp_path / "metadata.json"
    result = build_script("build", METADATA_OUT=str(metadata))
    assert result.returncode == 0, result.stderr
    submit, spec = result.stdout.strip().splitlines()
    assert submit.startswith("gcloud builds submit . ")
    assert "--config=templates/flex/cloudbuild.yaml" in submit
    assert f"_IMAGE={IMAGE}" in submit
    assert spec.startswith(
        "gcloud dataflow flex-template build gs://my-bucket/templates/llm-dataprep-abc123.json")
    assert f"--image={IMAGE}" in spec
    assert f"--metadata-file={metadata}" in spec
    # the spec's metadata: the checked-in one, with the built image as the workers' default
    assert json.loads(metadata.read_text()) == load_generator().build_metadata(IMAGE)


def test_build_script_runs_with_the_image_as_worker_container():
    result = build_script(
        "run", INPUT="gs://my-bucket/in/a.jsonl,gs://my-bucket/in/b.json",
        OUTPUT="gs://my-bucket/out/1", EXTRA_PARAMETERS="block_size=4096~overwrite=true")
    assert result.returncode == 0, result.stderr
    command = result.stdout.replace("\\", "")
    assert command.startswith("gcloud dataflow flex-template run llm-dataprep-")
    parameters = re.search(r"--parameters=\^~\^(\S+)", command).group(1).split("~")
    assert parameters == ["input=gs://my-bucket/in/a.jsonl,gs://my-bucket/in/b.json",
                          "output=gs://my-bucket/out/1", f"sdk_container_image={IMAGE}",
                          "block_size=4096", "overwrite=true"]
    missing = build_script("run", INPUT="", OUTPUT="")
    assert missing.returncode == 2
    assert "set INPUT" in missing.stderr


def test_launcher_builds_the_dataflow_job_and_returns_without_waiting(monkeypatch, tmp_path):
    """main.py under DataflowRunner (dry run: everything but the submission) must not wait."""
    results = []
    run = beam.Pipeline.run

    def recorded_run(pipeline, *args, **kwargs):
        result = run(pipeline, *args, **kwargs)
        result.wait_until_finish = lambda duration=None: pytest.fail("the launcher waited")
        results.append(result)
        return result

    monkeypatch.setattr(beam.Pipeline, "run", recorded_run)
    monkeypatch.setattr(sys, "argv", [
        "main.py", f"--input={EXAMPLES}/c4_sample.jsonl", f"--output={tmp_path}/out",
        "--runner=DataflowRunner", "--dry_run=true", "--project=my-project-1234",
        "--region=europe-west4", "--temp_location=gs://my-bucket/temp",
        f"--sdk_container_image={IMAGE}"])
    runpy.run_path(str(FLEX / "main.py"), run_name="__main__")
    result = results[-1]  # Beam's run() may re-run a round-tripped copy of the pipeline
    environments = result.job.proto_pipeline.components.environments.values()
    images = {beam_runner_api_pb2.DockerPayload.FromString(e.payload).container_image
              for e in environments}
    assert images == {IMAGE}  # the workers run the template's own image
    assert not (tmp_path / "out").exists()  # nothing ran locally


# --------------------------------------------------------------------------- the package


def test_sdist_carries_the_package_and_builds_from_itself(tmp_path):
    """What --setup_file does: build an sdist, then build the package from the unpacked sdist."""
    subprocess.run([sys.executable, "setup.py", "-q", "egg_info", f"--egg-base={tmp_path}",
                    "sdist", f"--dist-dir={tmp_path}"], cwd=ROOT, check=True,
                   capture_output=True, timeout=120)
    [sdist] = tmp_path.glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    [tree] = (tmp_path / "unpacked").iterdir()
    for package in ("beam_pipeline", "transforms"):
        expected = {p.name for p in (ROOT / package).glob("*.py")}
        assert expected <= {p.name for p in (tree / package).glob("*.py")}, package
    subprocess.run([sys.executable, "setup.py", "-q", "egg_info"], cwd=tree, check=True,
                   capture_output=True, timeout=120)
    requires = (tree / "beam_llm_dataprep.egg-info" / "requires.txt").read_text()
    pinned = [line for line in (ROOT / "requirements.txt").read_text().splitlines()
              if line and not line.startswith("#")]
    assert set(requires.split()) == set(pinned)  # no extras: the report needs nothing more
    check = subprocess.run(
        [sys.executable, "-c", "import beam_pipeline.cli as p; print(p.__file__)"],
        check=False, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip().startswith(str(tree))
