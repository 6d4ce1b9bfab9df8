# Thin wrappers over cargo and scripts/. See README.md.
.PHONY: run test lint fmt bench-pooler setup build

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

test: setup lint
	./scripts/test.sh

bench-pooler: build
	./target/release/bypass bench pooler

fmt:
	cargo fmt --all
