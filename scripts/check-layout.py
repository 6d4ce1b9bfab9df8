#!/usr/bin/env python3
"""Crate-direction check (run by `make lint`): every crate imports only crates on a lower floor.

Reads `cargo metadata` and fails, listing every problem, when
  - a workspace crate has no floor below (a new crate must be placed here and in ARCHITECTURE.md);
  - a normal or build dependency on a workspace crate does not point to a lower floor;
  - testkit is a normal dependency of anything but the harness (lab, bench, cli);
  - a dev-dependency points up, except to the test harness (testkit, lab);
  - a product crate (floors 1-2) depends on plotters or clap (plots and argument parsing).
The map must stay true as well: every file path and every Rust path (`crate::module::item`)
cited in ARCHITECTURE.md and docs/internals/*.md must exist.
`--self-test` checks that the rules catch what they should, on made-up metadata.
"""

import json
import pathlib
import re
import subprocess
import sys

# Floors, bottom up (ARCHITECTURE.md "Crates"). Half floors order two crates of one floor of
# shared/design/layout.md: frontdoor is built on wire, the pooler on its kernel fast path, the
# benchmarks on the lab.
FLOORS = {
    "bypass-testkit": 0,  # throwaway PostgreSQL/PgBouncer: the test harness under everything
    "bypass-wire": 1,
    "bypass-fastpath": 1,
    "bypass-frontdoor": 1.5,
    "bypass-pooler": 2,
    "bypass-dispatch": 2,
    "bypass-engine": 2,
    "bypass-pod": 2,
    "bypass-lab": 3,
    "bypass-bench": 3.5,
    "bypass-cli": 4,
}
TESTKIT = "bypass-testkit"
HARNESS = {"bypass-lab", "bypass-bench", "bypass-cli"}  # may use testkit outside tests
TEST_HARNESS = {"bypass-testkit", "bypass-lab"}  # any crate's tests may use these
PRODUCT_FLOOR_MAX = 2
NOT_IN_PRODUCT = {"plotters": "plots belong in bypass-bench", "clap": "argument parsing belongs in bypass-cli"}


def problems(metadata):
    members = set(metadata["workspace_members"])
    packages = [p for p in metadata["packages"] if p["id"] in members]
    names = {p["name"] for p in packages}
    found = []
    for package in packages:
        name = package["name"]
        if name not in FLOORS:
            found.append(f"{name}: no floor; add it to scripts/check-layout.py and ARCHITECTURE.md")
            continue
        floor = FLOORS[name]
        for dependency in package["dependencies"]:
            target, kind = dependency["name"], dependency["kind"] or "normal"
            if floor <= PRODUCT_FLOOR_MAX and target in NOT_IN_PRODUCT and kind != "dev":
                found.append(f"{name} (floor {floor}) depends on {target}: {NOT_IN_PRODUCT[target]}")
            if target not in names:
                continue
            if target not in FLOORS:
                continue  # reported once, as its own crate
            upward = FLOORS[target] >= floor
            if kind == "dev":
                if upward and target not in TEST_HARNESS:
                    found.append(f"{name} (floor {floor}) dev-depends on {target} (floor {FLOORS[target]})")
            elif target == TESTKIT and name not in HARNESS:
                found.append(f"{name}: testkit as a {kind} dependency (only lab, bench and cli; else dev-dependency)")
            elif upward:
                found.append(f"{name} (floor {floor}) depends on {target} (floor {FLOORS[target]}): dependencies point down")
    return found


MAP_FILES = ["ARCHITECTURE.md", "docs/internals/*.md"]
# The crate a page's unprefixed Rust paths (`relay::TransactionTracker`) belong to.
PAGE_CRATE = {"pooler.md": "pooler", "dispatch.md": "dispatch", "engine.md": "engine", "pod.md": "pod"}
FILE_SPAN = re.compile(r"^[\w./-]+\.(rs|c|h|md|sh|py|toml)$")
RUST_SPAN = re.compile(r"^[a-z_][a-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)+$")


def defined(crate_dir, name):
    """Whether `name` is a module, item or method defined in the crate's sources."""
    sources = list((crate_dir / "src").rglob("*.rs")) + list((crate_dir / "src").rglob("*.c"))
    if any(path.stem == name or path.name == name for path in (crate_dir / "src").rglob("*")):
        return True
    pattern = re.compile(rf"\b(fn|struct|enum|trait|const|static|type|mod|macro_rules!)\s+{re.escape(name)}\b"
                         rf"|^\s*{re.escape(name)}\b[^\n]*[,{{(]\s*$", re.MULTILINE)
    return any(pattern.search(path.read_text(errors="replace")) for path in sources)


def map_problems(root):
    crates = {path.name for path in (root / "crates").iterdir() if (path / "Cargo.toml").exists()}
    found = []
    pages = [path for pattern in MAP_FILES for path in sorted(root.glob(pattern))]
    for page in pages:
        text = page.read_text()
        for span in sorted(set(re.findall(r"`([^`\n]+)`", text))):
            if FILE_SPAN.match(span):
                first = span.split("/")[0]
                candidates = [root / span, page.parent / span, root / "crates" / span]
                if first in crates:
                    candidates.append(root / "crates" / first / "src" / span.split("/", 1)[1])
                # A file named in a crate's row or page: relative to some crate, or its src/.
                candidates += list(root.glob(f"crates/*/{span}")) + list(root.glob(f"crates/*/src/{span}"))
                if not any(path.exists() for path in candidates):
                    found.append(f"{page.relative_to(root)}: `{span}` does not exist")
            elif RUST_SPAN.match(span):
                segments = span.split("::")
                # `bypass_wire::login` names crates/wire by its library name.
                if segments[0].startswith("bypass_") and segments[0][len("bypass_"):] in crates:
                    segments[0] = segments[0][len("bypass_"):]
                crate = segments[0] if segments[0] in crates else PAGE_CRATE.get(page.name)
                if segments[0] in crates:
                    segments = segments[1:]
                if crate is None:
                    continue
                missing = [name for name in segments if not defined(root / "crates" / crate, name)]
                if missing:
                    found.append(f"{page.relative_to(root)}: `{span}`: no {', '.join(missing)} in crates/{crate}")
    return found


def metadata_members(output):
    return json.loads(output)["workspace_members"]


def self_test():
    def package(name, *dependencies):
        deps = [{"name": target, "kind": kind} for target, kind in dependencies]
        return {"id": name, "name": name, "dependencies": deps}

    def run(*packages):
        return problems({"workspace_members": [p["id"] for p in packages], "packages": list(packages)})

    assert run(package("bypass-wire"), package("bypass-pooler", ("bypass-wire", None))) == []
    assert len(run(package("bypass-wire", ("bypass-pooler", None)), package("bypass-pooler"))) == 1, "upward"
    assert len(run(package("bypass-engine", ("bypass-pod", None)), package("bypass-pod"))) == 1, "sideways"
    assert len(run(package("bypass-pod", ("bypass-testkit", None)), package("bypass-testkit"))) == 1, "testkit"
    assert run(package("bypass-pod", ("bypass-testkit", "dev")), package("bypass-testkit")) == []
    assert run(package("bypass-dispatch", ("bypass-lab", "dev")), package("bypass-lab")) == []
    assert len(run(package("bypass-pod", ("bypass-bench", "dev")), package("bypass-bench"))) == 1, "dev upward"
    assert len(run(package("bypass-pod", ("plotters", None)))) == 1, "plots in a product crate"
    assert len(run(package("bypass-engine", ("clap", None)))) == 1, "argument parsing in a product crate"
    assert len(run(package("bypass-new"))) == 1, "a crate without a floor"
    import tempfile
    with tempfile.TemporaryDirectory() as directory:
        root = pathlib.Path(directory)
        (root / "crates/pooler/src/relay").mkdir(parents=True)
        (root / "crates/pooler/Cargo.toml").write_text("")
        (root / "crates/pooler/src/relay/mod.rs").write_text("pub struct Linked;\nimpl Linked {\n    pub fn is_idle(&self) {}\n}\n")
        (root / "docs/internals").mkdir(parents=True)
        (root / "ARCHITECTURE.md").write_text("`crates/pooler/src/relay/mod.rs` `pooler::relay::Linked::is_idle`\n")
        (root / "docs/internals/pooler.md").write_text("`relay/mod.rs` `relay::Linked` `session::link_is_idle` `gone.rs`\n")
        found = map_problems(root)
        assert len(found) == 2 and "gone.rs" in found[0] and "link_is_idle" in found[1], found
    print("check-layout: self-test passed")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return 0
    output = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps", "--locked"],
        check=True, capture_output=True, text=True,
    ).stdout
    found = problems(json.loads(output)) + map_problems(pathlib.Path(__file__).resolve().parent.parent)
    for problem in found:
        print(f"check-layout: {problem}", file=sys.stderr)
    if found:
        return 1
    print(f"check-layout: {len(metadata_members(output))} crates, every dependency points down; the map's paths exist")
    return 0


if __name__ == "__main__":
    sys.exit(main())
