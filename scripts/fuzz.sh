#!/usr/bin/env bash
# Runs every cargo-fuzz target of the workspace briefly, starting from its committed corpus
# (`make test`). Finds the targets itself: each crates/<crate>/fuzz/ project (cargo-fuzz layout)
# and each target `cargo fuzz list` names there; a target must have a committed corpus in
# crates/<crate>/fuzz/corpus/<target>/ (a few valid inputs to mutate from).
#
#   scripts/fuzz.sh              # every target, FUZZ_SECONDS (default 15) each
#   FUZZ_SECONDS=600 scripts/fuzz.sh decode
#
# libFuzzer runs on a copy of the corpus, so a run never changes the tree. A crash or a leak
# fails the run; the input that caused it is kept in crates/<crate>/fuzz/artifacts/<target>/.
# Needs the nightly toolchain and cargo-fuzz (scripts/setup.sh installs cargo-fuzz).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${FUZZ_SECONDS:-15}"
only="${1:-}"
root="$(pwd)"
# One target directory for every fuzz project: their dependencies (the workspace crates) build once.
export CARGO_TARGET_DIR="$root/target/fuzz"

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz: the nightly toolchain is missing (rustup toolchain install nightly --profile minimal)" >&2
  exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: cargo-fuzz is missing (scripts/setup.sh installs it: cargo install --locked cargo-fuzz)" >&2
  exit 1
fi

ran=0
for manifest in crates/*/fuzz/Cargo.toml; do
  fuzz_dir="$(dirname "$manifest")"
  crate_dir="$(dirname "$fuzz_dir")"
  for target in $(cd "$crate_dir" && cargo +nightly fuzz list); do
    [ -z "$only" ] || [ "$only" = "$target" ] || continue
    corpus="$root/$fuzz_dir/corpus/$target"
    if [ -z "$(ls -A "$corpus" 2>/dev/null)" ]; then
      echo "fuzz: $fuzz_dir has no corpus for $target: commit a few valid inputs under $corpus" >&2
      exit 1
    fi
    work="$(mktemp -d)"
    cp -r "$corpus/." "$work/"
    echo "fuzz: $crate_dir $target for ${seconds}s from $(ls "$corpus" | wc -l) inputs"
    log="$work.log"
    # -timeout: one input taking 10 s is a hang; -rss_limit_mb bounds memory on the shared machine.
    if (cd "$crate_dir" && cargo +nightly fuzz run "$target" "$work" -- \
          -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1) >"$log" 2>&1; then
      grep -E "^stat::number_of_executed_units" "$log" | sed "s/^/fuzz: $target /" || true
    else
      tail -n 60 "$log" >&2
      echo "fuzz: $target failed; the input is kept under $fuzz_dir/artifacts/$target/" >&2
      exit 1
    fi
    rm -rf "$work" "$log"
    ran=$((ran + 1))
  done
done
[ "$ran" -gt 0 ] || { echo "fuzz: no fuzz target found${only:+ named $only}" >&2; exit 1; }
echo "fuzz: $ran target(s) ran without a crash"
