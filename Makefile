# Two entry points (both bootstrap .venv themselves and are idempotent):
#   make demo   make a hybrid fixture (period 4), run it through the real llama.cpp, sweep its cuts
#   make test   the default test suite (what .ci/run and CI call): the quick lane, then the llama.cpp tests
PY := .venv/bin/python
CACHE := $(or $(FAMILY_CERTIFY_CACHE),$(HOME)/.cache/family-certify)

.PHONY: bootstrap server demo test test-quick test-slow lint bench constraints clean
bootstrap:
	@scripts/bootstrap.sh

server: bootstrap
	@scripts/build_llama_server.sh

demo: bootstrap
	@scripts/demo.sh

# the suite runs on every core (pytest-xdist; TEST_JOBS=1 for one process), idle workers taking tests from busy ones.
# test-quick: the tests that start no llama.cpp process (judges, contract, synth, manifest, schemas, CLI parsing);
# FAMILY_CERTIFY_NO_LLAMA makes a worker refuse to start, so a test that needs llama.cpp and is not marked `llama`
# fails here instead of slowing the lane. test: the quick lane first, then the tests that drive llama.cpp (the
# prefix-cache tests need llama-server from the same pinned source: built once per machine, then cached), their
# slowest 15 listed at the end.
TEST_JOBS ?= auto
PYTEST := $(PY) -m pytest -q -n $(TEST_JOBS) --dist worksteal
QUICK := not llama and not server and not slow and not scan
test-quick: bootstrap
	FAMILY_CERTIFY_NO_LLAMA=1 $(PYTEST) -m "$(QUICK)"

test: test-quick
	@scripts/build_llama_server.sh >/dev/null
	$(PYTEST) --durations=15 -m "(llama or server) and not slow and not scan"

test-slow: bootstrap
	$(PY) -m pytest -q -m slow

lint: bootstrap
	$(PY) -m ruff check .

bench: bootstrap
	$(PY) benchmarks/synth_bench.py
	$(PY) benchmarks/sweep_bench.py
	$(PY) benchmarks/battery_bench.py

# re-resolve constraints.txt: the newest versions pyproject.toml allows, in a fresh venv (review the diff, commit it);
# a single bump is simpler by hand: one line of constraints.txt
constraints: bootstrap
	rm -rf build/freeze && python3 -m venv build/freeze
	build/freeze/bin/pip install -q --find-links "$(CACHE)/wheels" -e '.[dev]' --upgrade setuptools
	{ sed '/^[^#]/,$$d' constraints.txt; build/freeze/bin/pip freeze --all --exclude-editable \
	  | grep -v -e '^llama_cpp_python[=@ ]' -e '^gguf[=@ ]' -e '^pip=='; } > build/constraints.txt
	mv build/constraints.txt constraints.txt && rm -rf build/freeze

clean:
	rm -rf build .pytest_cache
