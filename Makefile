# Thin wrappers over cargo and scripts/. See README.md.
.PHONY: run test lint fmt fuzz bench-pooler setup build

setup:
	./scripts/setup.sh
	./scripts/engine-venv.sh >/dev/null

build: setup
	cargo build --release --locked -p bypass-cli

run: build
	./target/release/bypass up

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --locked -- -D warnings
	./scripts/check-layout.py --self-test
	./scripts/check-layout.py

# Every fuzz target for FUZZ_SECONDS (default 15) each; `make test` runs it too.
fuzz: setup
	./scripts/fuzz.sh

test: setup lint
	./scripts/test.sh

bench-pooler: build
	./target/release/bypass bench pooler

fmt:
	cargo fmt --all
