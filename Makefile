# Two entry points (both bootstrap .venv themselves and are idempotent):
#   make demo   make a hybrid fixture (period 4), run it through the real llama.cpp, sweep its cuts
#   make test   the default test suite (what .ci/run and CI call)
PY := .venv/bin/python

.PHONY: bootstrap demo test test-slow lint bench clean
bootstrap:
	@scripts/bootstrap.sh

demo: bootstrap
	@scripts/demo.sh

test: bootstrap
	$(PY) -m pytest -q

test-slow: bootstrap
	$(PY) -m pytest -q -m slow

lint: bootstrap
	$(PY) -m ruff check .

bench: bootstrap
	$(PY) benchmarks/synth_bench.py
	$(PY) benchmarks/sweep_bench.py

clean:
	rm -rf build .pytest_cache
