# Two entry points for a fresh machine (see README): `make demo` and `make test`.
# Both create or update the local virtualenv .venv and install the project into it.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-all venv bench-deps clean proto docs audit audit-offline advisories

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# Bench-only environment for the Dynamo planner baselines (docs/baselines-dynamo.md). NVIDIA's
# ai-dynamo 1.6.1 pins kubernetes<33 and its runtime pydantic<=2.13.5 while the product pins 37 and
# 2.14.4, and it requires aisimulate, which cannot be installed from PyPI: pip's resolver cannot
# combine them. So the two wheels go in with --no-deps, into a separate virtualenv (the product's
# .venv and its dependency audit stay as they are), beside the `dynamo-bench` extra (the planner's
# own runtime imports: msgspec, pmdarima, filterpy, prophet, scikit-learn, pandas), all resolved
# under the product's exact pins (a constraints file frozen from the product install).
BENCH_VENV  ?= .venv-bench
BENCH_BIN   := $(BENCH_VENV)/bin
BENCH_STAMP := $(BENCH_VENV)/.installed
DYNAMO_WHEELS := ai-dynamo==1.6.1 ai-dynamo-runtime==1.6.1

$(BENCH_STAMP): pyproject.toml
	test -x $(BENCH_BIN)/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_BIN)/python -m pip install --quiet --upgrade pip
	$(BENCH_BIN)/python -m pip install --quiet -e '.[test]'
	$(BENCH_BIN)/python -m pip freeze --exclude-editable > $(BENCH_VENV)/product-pins.txt
	$(BENCH_BIN)/python -m pip install --quiet -c $(BENCH_VENV)/product-pins.txt -e '.[test,dynamo-bench]'
	$(BENCH_BIN)/python -m pip install --quiet --no-deps $(DYNAMO_WHEELS)
	$(BENCH_BIN)/python -m pip freeze --exclude-editable | grep -Fxf $(BENCH_VENV)/product-pins.txt \
		| cmp -s - $(BENCH_VENV)/product-pins.txt || { echo 'bench-deps changed a product pin' >&2; exit 1; }
	$(BENCH_BIN)/python -c 'from controlplane.sim.dynamo import dynamo_available as a; r = a(); assert r is None, r'
	touch $(BENCH_STAMP)

bench-deps: $(BENCH_STAMP)

# The full system on this machine (docs/demo.md); `make demo TRACE=path.csv` replays an Azure trace.
demo: $(STAMP)
	$(BIN)/controlplane demo $(if $(TRACE),--trace '$(TRACE)')

# The default suite: fast enough for CI on 2 cores. CP_SLOW=1 also runs the long tests. The Dynamo
# baseline tests skip in .venv (Dynamo is not installed there) and run in the bench environment,
# where CP_REQUIRE_DYNAMO=1 turns a failed import into a failure, with the fleet benchmark's CI slice
# (so its Dynamo rows run in CI too).
test: $(STAMP) $(BENCH_STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider
	CP_REQUIRE_DYNAMO=1 $(BENCH_BIN)/python -m pytest -q -p no:cacheprovider tests/unit/test_dynamo_policy.py tests/unit/test_bench_fleet.py

test-all: $(STAMP)
	CP_SLOW=1 $(BIN)/python -m pytest -q -p no:cacheprovider

clean:
	rm -rf $(VENV) $(BENCH_VENV) build *.egg-info .pytest_cache .hypothesis

# Regenerate the gRPC modules from proto/ (generated code is committed; tests check it is current).
proto: $(STAMP)
	$(BIN)/python -m controlplane.api.protogen

# Regenerate the API reference in docs/api.md from the proto comments (a test checks it is current).
docs: $(STAMP)
	$(BIN)/python -m controlplane.api.docgen

# Live dependency audit with pip-audit (needs PyPI's JSON API or OSV; exit 1 if it cannot audit
# everything). The offline audit against tests/security/advisories-pypi.json runs in `make test`
# (docs/security.md).
audit: $(STAMP)
	$(BIN)/python -m tests.security.dependency_audit --require

audit-offline: $(STAMP)
	$(BIN)/python -m tests.security.dependency_audit --offline --require

# Refresh tests/security/advisories-pypi.json (needs GitHub; ADVISORY_REPO=path reuses a clone).
ADVISORY_REPO ?= /tmp/advisory-database
advisories: $(STAMP)
	test -d $(ADVISORY_REPO) || git clone --filter=blob:none https://github.com/pypa/advisory-database $(ADVISORY_REPO)
	git -C $(ADVISORY_REPO) pull --ff-only
	$(BIN)/python -m tests.security.advisories refresh --advisory-repo $(ADVISORY_REPO)
