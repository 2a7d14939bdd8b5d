# Two entry points (both bootstrap .venv themselves and are idempotent):
#   make demo   make a hybrid fixture (period 4), run it through the real llama.cpp, sweep its cuts
#   make test   the default test suite (what .ci/run and CI call)
PY := .venv/bin/python

.PHONY: bootstrap server demo test test-slow lint bench clean
bootstrap:
	@scripts/bootstrap.sh

server: bootstrap
	@scripts/build_llama_server.sh

demo: bootstrap
	@scripts/demo.sh

# the prefix-cache tests need llama-server from the same pinned source: built once per machine, then cached
test: bootstrap
	@scripts/build_llama_server.sh >/dev/null
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
