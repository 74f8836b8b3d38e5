# The two commands a new user needs: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint clean

setup: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt constraints.txt setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.txt -r requirements-dev.txt -c constraints.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m beam_pipeline \
	  --input examples/data/c4_sample.jsonl \
	  --input 'examples/data/tinyshakespeare_excerpt.txt#text_unit=paragraph' \
	  --input examples/data/alpaca_seed_tasks.json \
	  --input examples/data/messages_sample.json \
	  --input examples/data/sharegpt_sample.json \
	  --input examples/data/toolcall_sample.json \
	  --input 'examples/data/gsm8k_sample.jsonl#branch=instruction;prompt=question;response=answer' \
	  --input 'examples/data/ko_chatbot_sample.csv#branch=instruction;prompt=Q;response=A' \
	  --input examples/data/broken_lines.jsonl \
	  --output out/demo --overwrite=true

lint: $(STAMP)
	$(PY) -m ruff check .

test: lint
	$(PY) -m pytest

clean:
	rm -rf $(VENV) out
