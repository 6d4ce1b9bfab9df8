#!/usr/bin/env bash
# Installs the system packages Bypass needs; safe to run again (does nothing when all are present).
set -euo pipefail

# PostgreSQL (its Debian package includes contrib) and PgBouncer for tests and benchmarks; clang,
# libbpf and bpftool build and inspect the eBPF programs; HAProxy and iproute2 for the dispatcher's
# lab; python3-venv for the engine's peers; a JDK and pgjdbc replay DBeaver's metadata queries
# against the engine (crates/engine/tests/clients.rs).
packages=(postgresql-15 pgbouncer haproxy sysstat fonts-dejavu-core
  clang llvm libbpf-dev libelf-dev zlib1g-dev pkg-config bpftool iproute2 python3-venv
  openjdk-17-jdk-headless libpostgresql-jdbc-java)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -q
  $sudo_cmd apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo is missing; install Rust with rustup (https://rustup.rs)" >&2
  exit 1
fi

# The fuzz targets (scripts/fuzz.sh, run by `make test`) build with the nightly toolchain and
# cargo-fuzz.
if ! cargo +nightly --version >/dev/null 2>&1 && command -v rustup >/dev/null 2>&1; then
  echo "setup: installing the nightly toolchain"
  rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "setup: installing cargo-fuzz"
  cargo install --locked cargo-fuzz
fi
