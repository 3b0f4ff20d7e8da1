PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml constraints.txt labextension/package.json labextension/yarn.lock $(wildcard labextension/src/*.ts labextension/style/*) model_debugger/schema/snapshot.schema.json
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e ".[torch,tensorflow,notebook,lab,test]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m model_debugger.examples.demo

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -ra tests; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 1; fi; exit $$rc

bench: $(STAMP)
	$(PY) benchmarks/capture_overhead.py

clean:
	rm -rf $(VENV) .model_debugger .pytest_cache
