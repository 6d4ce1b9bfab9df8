#!/usr/bin/env bash
# Commits the pod crate's paths plus only the bypass-pod entry of Cargo.lock (the shared working
# tree's Cargo.lock also carries other engineers' uncommitted changes, which must not ride along).
# Usage: scripts/pod-commit.sh "message" [extra paths...]
set -euo pipefail
cd "$(dirname "$0")/.."
message="$1"; shift
paths=(crates/pod scripts/pod-commit.sh "$@")
[ -d bench/results ] && for f in bench/results/pod.*; do [ -e "$f" ] && paths+=("$f"); done

lock_blob=$(python3 - <<'PY'
import re, subprocess
head = subprocess.run(["git", "show", "HEAD:Cargo.lock"], capture_output=True, text=True, check=True).stdout
work = open("Cargo.lock").read()
def block(text):
    m = re.search(r'\[\[package\]\]\nname = "bypass-pod"\n.*?(?=\n\[\[package\]\]|\Z)', text, re.S)
    return m
new = block(work).group(0)
old = block(head)
merged = head[:old.start()] + new + head[old.end():]
# Every package the pod entry names must already be in HEAD's lock, or the merge is incomplete.
deps = re.findall(r'^ "([^" ]+)', new, re.M)
for dep in deps:
    if f'name = "{dep}"' not in merged:
        raise SystemExit(f"dependency {dep} is not in HEAD's Cargo.lock; commit the lock by hand")
blob = subprocess.run(["git", "hash-object", "-w", "--stdin"], input=merged, capture_output=True, text=True, check=True).stdout.strip()
print(blob)
PY
)
tmp_index=$(mktemp)
trap 'rm -f "$tmp_index"' EXIT
export GIT_INDEX_FILE="$tmp_index"
git read-tree HEAD
git update-index --cacheinfo "100644,$lock_blob,Cargo.lock"
git add -A -- "${paths[@]}"
git commit -q -m "$message"
unset GIT_INDEX_FILE
# Bring the real index in line with the new commit for the paths we committed (working tree untouched).
git reset -q -- Cargo.lock "${paths[@]}"
git log --oneline -1
