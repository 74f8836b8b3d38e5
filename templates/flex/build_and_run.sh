#!/usr/bin/env bash
# Builds the Flex Template (image + spec file) and runs it on Dataflow.
#
#   templates/flex/build_and_run.sh build   # image via Cloud Build, then the template spec file
#   templates/flex/build_and_run.sh run     # start a job from the spec file
#   templates/flex/build_and_run.sh spec    # print the template spec file path and image
#
# Settings come from the environment (docs/deployment.md):
#   PROJECT, REGION, BUCKET, REPO      required: project, region, bucket for the template spec,
#                                      staging and temp files, Artifact Registry repository
#   TAG                                image tag (default: the git commit, else a timestamp)
#   IMAGE_NAME                         default llm-dataprep
#   TEMPLATE_PATH                      default gs://$BUCKET/templates/llm-dataprep-$TAG.json
#   METADATA_OUT                       where build writes the metadata with the image as the
#                                      workers' default (default: a temporary file)
#   SERVICE_ACCOUNT                    worker service account email (default: Compute Engine's)
#   for run: INPUT and OUTPUT (gs:// only; INPUT may be a comma-separated list), optional
#            JOB_NAME, MAX_WORKERS, MACHINE_TYPE, and EXTRA_PARAMETERS as NAME=VALUE pairs
#            separated by '~' (e.g. 'block_size=4096~seq_len=4096~overwrite=true')
#   DRY_RUN=1                          print the commands instead of running them
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

die() { echo "error: $*" >&2; exit 2; }
need() { for name in "$@"; do [[ -n "${!name:-}" ]] || die "set $name (see the header of $0)"; done; }
do_run() {
  if [[ "${DRY_RUN:-0}" == 1 ]]; then printf '%q ' "$@"; echo; else "$@"; fi
}

need PROJECT REGION BUCKET REPO
TAG="${TAG:-$(git rev-parse --short=12 HEAD 2>/dev/null || date +%Y%m%d-%H%M%S)}"
IMAGE_NAME="${IMAGE_NAME:-llm-dataprep}"
IMAGE="${REGION}-docker.pkg.dev/${PROJECT}/${REPO}/${IMAGE_NAME}:${TAG}"
TEMPLATE_PATH="${TEMPLATE_PATH:-gs://${BUCKET}/templates/${IMAGE_NAME}-${TAG}.json}"

build() {
  # The metadata must describe the options this checkout has; the spec gets a copy whose worker
  # image defaults to the image built here, so every way of launching runs the workers on it.
  local python="${PYTHON:-.venv/bin/python}" metadata="${METADATA_OUT:-$(mktemp -t flex-metadata.XXXXXX)}"
  "$python" scripts/gen_flex_metadata.py --check
  "$python" scripts/gen_flex_metadata.py --image="$IMAGE" --out="$metadata" >&2
  do_run gcloud builds submit . --project="$PROJECT" --region="$REGION" \
    --config=templates/flex/cloudbuild.yaml --substitutions="_IMAGE=${IMAGE}"
  do_run gcloud dataflow flex-template build "$TEMPLATE_PATH" --project="$PROJECT" \
    --image="$IMAGE" --sdk-language=PYTHON --metadata-file="$metadata"
}

run() {
  need INPUT OUTPUT
  local job="${JOB_NAME:-${IMAGE_NAME}-$(date -u +%Y%m%d-%H%M%S)}"
  # '^~^' makes '~' the separator between parameters, since INPUT may hold commas.
  local parameters="^~^input=${INPUT}~output=${OUTPUT}~sdk_container_image=${IMAGE}"
  if [[ -n "${EXTRA_PARAMETERS:-}" ]]; then parameters+="~${EXTRA_PARAMETERS}"; fi
  local args=(--project="$PROJECT" --region="$REGION" --template-file-gcs-location="$TEMPLATE_PATH"
              --staging-location="gs://${BUCKET}/staging" --temp-location="gs://${BUCKET}/temp"
              --parameters="$parameters")
  if [[ -n "${SERVICE_ACCOUNT:-}" ]]; then args+=(--service-account-email="$SERVICE_ACCOUNT"); fi
  if [[ -n "${MAX_WORKERS:-}" ]]; then args+=(--max-workers="$MAX_WORKERS"); fi
  if [[ -n "${MACHINE_TYPE:-}" ]]; then args+=(--worker-machine-type="$MACHINE_TYPE"); fi
  do_run gcloud dataflow flex-template run "$job" "${args[@]}"
}

case "${1:-}" in
  build) build ;;
  run) run ;;
  spec) echo "TEMPLATE_PATH=${TEMPLATE_PATH}"; echo "IMAGE=${IMAGE}" ;;
  *) die "usage: $0 build|run|spec" ;;
esac
