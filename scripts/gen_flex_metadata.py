"""Writes templates/flex/metadata.json from the pipeline's own command-line options.

The Flex Template's parameters must carry the same names, help and defaults as the command line,
so they are generated from ``beam_pipeline.options.argument_parser()`` rather than kept by hand:
every option of the pipeline's option groups becomes a parameter, and a parameter is required
exactly when the pipeline refuses to start without it. Run it after adding or changing an option
(tests/test_flex_template.py fails while the file is out of date):

    .venv/bin/python scripts/gen_flex_metadata.py           # rewrite the file
    .venv/bin/python scripts/gen_flex_metadata.py --check   # exit 1 if it is out of date

One Beam option is declared too: ``sdk_container_image``, the workers' image. Without it a launch
from the Console or a plain ``gcloud dataflow flex-template run`` starts workers on the stock Beam
image, which lacks this package. The build (templates/flex/build_and_run.sh) writes a copy with
the image it built as the default and builds the template spec from that copy:

    .venv/bin/python scripts/gen_flex_metadata.py --image=IMAGE --out=PATH
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipeline import beam_internals
from beam_pipeline.options import (
    DESCRIPTION,
    OPTION_GROUPS,
    argument_parser,
    config_from_options,
)
from transforms.core.tokenizer import BUILTIN_TEMPLATES

METADATA_PATH = Path(__file__).resolve().parents[1] / "templates" / "flex" / "metadata.json"
TEMPLATE_NAME = "LLM training-data preparation"
GCS_PATH = r"gs://[^\s,]+"
SCHEMA = rf"[\w-]+={GCS_PATH}"
MODEL = rf"([\w-]+=)?(fasttext|hf):{GCS_PATH}"
# On Dataflow only gs:// paths are readable by the launcher and every worker, so path options
# accept nothing else; the tokenizer may also be a Hugging Face hub id or the offline default.
PATH_OPTIONS: dict[str, dict] = {
    "input": {"paramType": "TEXT", "regexes": [rf"^\s*{GCS_PATH}(\s*,\s*{GCS_PATH})*\s*$"]},
    "output": {"paramType": "GCS_WRITE_FOLDER", "regexes": [rf"^{GCS_PATH}$"]},
    "tokenizer": {"paramType": "TEXT", "regexes": [rf"^({GCS_PATH}|[\w.-]+(/[\w.-]+)?)$"]},
    "chat_template": {"paramType": "TEXT",
                      "regexes": [rf"^({GCS_PATH}|{'|'.join(BUILTIN_TEMPLATES)})$"]},
    "schema": {"paramType": "TEXT", "regexes": [rf"^\s*{SCHEMA}(\s*,\s*{SCHEMA})*\s*$"]},
    "dedup_against": {"paramType": "TEXT",
                      "regexes": [rf"^\s*{GCS_PATH}(\s*,\s*{GCS_PATH})*\s*$"]},
    "quality_model": {"paramType": "TEXT",
                      "regexes": [rf"^\s*{MODEL}(\s*,\s*{MODEL})*\s*$"]},
}
# The smallest run the pipeline accepts; an option is required when leaving it out of this run
# is refused, and every option not in it is optional.
MINIMAL_RUN = {"input": "gs://my-bucket/corpus/*.jsonl.zst", "output": "gs://my-bucket/prepared"}
# The worker image: a Beam option, declared so that its default travels in the template spec.
WORKER_IMAGE = "sdk_container_image"
WORKER_GROUP = "Dataflow workers"
# host[:port]/path[:tag][@sha256:digest], as Docker and Artifact Registry name images.
IMAGE_REGEX = r"^[\w.-]+(:\d+)?(/[\w.-]+)+(:[\w.-]+)?(@sha256:[0-9a-f]{64})?$"
LABELS = {
    "input": "Input files",
    "output": "Output directory",
    "num_shards": "Files per output kind",
    "target_shard_mb": "Target file size (MB)",
    "max_record_mb": "Largest record (MB)",
    "seq_len": "Packed sequence length",
    "max_segments_per_pack": "Most examples per pack",
}


def own_options(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.Action]]:
    """(group title, action) for every option of the pipeline's own groups, in --help order."""
    titles = tuple(title for title, _ in OPTION_GROUPS)
    groups = beam_internals.group_actions(parser)
    return [(title, action) for title in titles for action in groups[title]]


def parameter_name(action: argparse.Action) -> str:
    return action.option_strings[0].removeprefix("--")


def help_text(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help as --help prints it (``%(default)s`` expanded), on one line."""
    return " ".join(parser._get_formatter()._expand_help(action).split())


def format_value(value: object) -> str:
    """A default as a template parameter string that the option's type parses back."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple | list):  # a comma-separated option's parsed value
        return ",".join(map(str, value))
    return str(value)


def required_names() -> set[str]:
    """The options of MINIMAL_RUN that the pipeline refuses to start without."""
    failure = _refusal(MINIMAL_RUN)
    if failure:
        raise RuntimeError(f"the pipeline refuses {MINIMAL_RUN}: {failure}; add the option it "
                           "asks for to MINIMAL_RUN")
    return {name for name in MINIMAL_RUN
            if _refusal({k: v for k, v in MINIMAL_RUN.items() if k != name})}


def _refusal(values: dict[str, str]) -> str | None:
    try:
        config_from_options(PipelineOptions([f"--{k}={v}" for k, v in values.items()]))
    except ValueError as error:
        return str(error)
    return None


def parameter(parser: argparse.ArgumentParser, group: str, action: argparse.Action,
              required: set[str], parsed_default: object) -> dict:
    """One Flex Template parameter; its type follows the parsed default (argparse parses string
    defaults with the option's type)."""
    name = parameter_name(action)
    entry: dict = {
        "name": name,
        "label": LABELS.get(name, name.replace("_", " ").capitalize()),
        "helpText": help_text(parser, action),
        "groupName": group,
        "isOptional": name not in required,
    }
    if name in PATH_OPTIONS:
        entry.update(PATH_OPTIONS[name])
    elif action.choices:
        entry["paramType"] = "ENUM"
        entry["enumOptions"] = [{"value": str(c), "label": str(c)} for c in action.choices]
    elif isinstance(parsed_default, bool):
        entry["paramType"] = "BOOLEAN"
    elif isinstance(parsed_default, int | float):
        entry["paramType"] = "NUMBER"
    else:
        entry["paramType"] = "TEXT"
    if action.default is not None:
        entry["defaultValue"] = format_value(action.default)
    return entry


def worker_image_parameter(image: str | None) -> dict:
    """The ``sdk_container_image`` parameter, with ``image`` as its default when given."""
    entry = {
        "name": WORKER_IMAGE,
        "label": "Worker image",
        "helpText": "The image the workers run (Beam's --sdk_container_image). The build sets "
                    "the template's own image as the default; the stock Beam image lacks this "
                    "package, so workers started on it fail with ModuleNotFoundError.",
        "groupName": WORKER_GROUP,
        "isOptional": True,
        "paramType": "TEXT",
        "regexes": [IMAGE_REGEX],
    }
    if image:
        entry["defaultValue"] = image
    return entry


def build_metadata(image: str | None = None) -> dict:
    """The template's metadata; ``image`` becomes the worker image's default (the build's)."""
    parser = argument_parser()
    options = own_options(parser)
    required = required_names()
    defaults = vars(parser.parse_args([]))
    return {
        "name": TEMPLATE_NAME,
        "description": " ".join(DESCRIPTION.split()),
        "streaming": False,
        "parameters": [*(parameter(parser, group, action, required, defaults[action.dest])
                         for group, action in options),
                       worker_image_parameter(image)],
    }


def render(metadata: dict) -> str:
    return json.dumps(metadata, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args.add_argument("--check", action="store_true",
                      help="exit 1, writing nothing, if metadata.json is out of date")
    args.add_argument("--image", help="the worker image's default (the image being built)")
    args.add_argument("--out", type=Path, default=METADATA_PATH,
                      help="where to write (default: %(default)s)")
    parsed = args.parse_args(argv)
    if parsed.check and (parsed.image or parsed.out != METADATA_PATH):
        args.error("--check compares metadata.json only; it takes no --image or --out")
    metadata = build_metadata(parsed.image)
    text = render(metadata)
    if parsed.check:
        current = METADATA_PATH.read_text() if METADATA_PATH.exists() else None
        if current != text:
            print(f"{METADATA_PATH} is out of date: run scripts/gen_flex_metadata.py",
                  file=sys.stderr)
            return 1
        return 0
    parsed.out.write_text(text)
    print(f"wrote {parsed.out} ({len(metadata['parameters'])} parameters)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
