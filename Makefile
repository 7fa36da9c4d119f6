# Two entry points for a fresh machine (see README): `make demo` and `make test`.
# Both create or update the local virtualenv .venv and install the project into it.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-all venv clean proto docs audit audit-offline advisories

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# The full system on this machine (docs/demo.md); `make demo TRACE=path.csv` replays an Azure trace.
demo: $(STAMP)
	$(BIN)/controlplane demo $(if $(TRACE),--trace '$(TRACE)')

# The default suite: fast enough for CI on 2 cores. CP_SLOW=1 also runs the long tests.
test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider

test-all: $(STAMP)
	CP_SLOW=1 $(BIN)/python -m pytest -q -p no:cacheprovider

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis

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
