# The two commands a new user needs: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RUN_STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev
CONSTRAINTS := -c constraints.txt

.PHONY: setup demo test lint clean bench airflow-env flex-metadata

setup: $(DEV_STAMP)

# What the pipeline itself needs (the data report included): enough for `make demo`.
$(RUN_STAMP): requirements.txt constraints.txt setup.py transforms/knowledge/_words.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.txt $(CONSTRAINTS)
	$(PY) -m pip install --quiet --no-deps -e .
	touch $@

# Plus test, lint and training-side tools (torch, trl, datasets) for `make test` and `make bench`,
# and the trainers' readers the output-format tests use (litdata without its declared deps).
# fastText's trainer goes in its own folder: it and fasttext-predict are both `import fasttext`.
$(DEV_STAMP): $(RUN_STAMP) requirements-dev.txt requirements-train.txt requirements-nodeps.txt
	$(PY) -m pip install --quiet -r requirements-dev.txt -r requirements-train.txt $(CONSTRAINTS)
	$(PY) -m pip install --quiet --no-deps -r requirements-nodeps.txt $(CONSTRAINTS)
	$(PY) -m pip install --quiet --no-deps --target $(VENV)/fasttext-trainer fasttext-numpy2-wheel==0.9.2
	touch $@

demo: $(RUN_STAMP)
	$(PY) -m beam_pipeline \
	  --input 'examples/data/c4_sample.jsonl#license=odc-by' \
	  --input 'examples/data/tinyshakespeare_excerpt.txt#text_unit=paragraph;license=mit' \
	  --input 'examples/data/alpaca_seed_tasks.json#license=apache-2.0' \
	  --input 'examples/data/messages_sample.json#license=apache-2.0' \
	  --input 'examples/data/sharegpt_sample.json#license=apache-2.0' \
	  --input 'examples/data/toolcall_sample.json#license=apache-2.0' \
	  --input 'examples/data/gsm8k_sample.jsonl#branch=instruction;prompt=question;response=answer;license=mit' \
	  --input 'examples/data/ko_chatbot_sample.csv#branch=instruction;prompt=Q;response=A;license=mit' \
	  --input 'examples/data/broken_lines.jsonl#license=apache-2.0' \
	  --output out/demo --overwrite=true

lint: $(DEV_STAMP)
	$(PY) -m ruff check .

# Test files are spread over the cores; a file's tests share one process and its fixtures.
test: lint
	$(PY) -m pytest -n auto --dist loadfile

# The benchmark harness (BENCHMARKS.md); `make bench BENCH_ARGS=--quick` for a few-minute check.
bench: $(DEV_STAMP)
	$(PY) -m bench.run $(BENCH_ARGS)

# The Composer DAG's own Airflow venv (.venv-airflow); tests/test_composer_dag.py makes it too.
airflow-env:
	scripts/airflow_env.sh

# Regenerate templates/flex/metadata.json after adding or changing a pipeline option.
flex-metadata: $(RUN_STAMP)
	$(PY) scripts/gen_flex_metadata.py

clean:
	rm -rf $(VENV) .venv-airflow .venv-streaming out
