//! The pod's files form layers: no chain of references (`use crate::…`, `crate::…::f()`,
//! `super::…`) leads from a file back to itself. Method: read every source file, collect the
//! files each one names outside comments and test modules, and search the graph for a cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `src/a/b.rs` → `a::b`, `src/a/mod.rs` → `a`, `src/lib.rs` → `` (the crate root).
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).expect("under src").with_extension("");
    let mut parts: Vec<String> = relative.iter().map(|part| part.to_string_lossy().into_owned()).collect();
    if parts.last().is_some_and(|last| last == "mod" || last == "lib") {
        parts.pop();
    }
    parts.join("::")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// The file's code without comments and without its `#[cfg(test)]` module.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Paths like `crate::a::b::{c, d}` or `super::x::y` in `code`, as module paths relative to the
/// crate root; braces expand one level.
fn referenced_paths(code: &str, module: &str, is_mod_file: bool) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let bytes = code.as_bytes();
    for (at, _) in code.match_indices("crate::").chain(code.match_indices("super::")) {
        if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_' || bytes[at - 1] == b':') {
            continue;
        }
        let rest: String = code[at..].chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
        let mut parts: Vec<String> = rest.split("::").filter(|part| !part.is_empty()).map(str::to_string).collect();
        let mut base: Vec<String> =
            if module.is_empty() { Vec::new() } else { module.split("::").map(str::to_string).collect() };
        if parts[0] == "super" {
            // In `a/b.rs` (module a::b) super is `a`; in `a/mod.rs` (module a) super is the root.
            base.pop();
            if is_mod_file && base.is_empty() && module.is_empty() {
                continue;
            }
            parts.remove(0);
            base.extend(parts);
            paths.push(base);
        } else {
            parts.remove(0);
            paths.push(parts);
        }
    }
    paths
}

/// In a `mod.rs` or `lib.rs`, references to its own submodules by their short name (`ycsb::X`,
/// `pub use config::…`), as module paths relative to the crate root.
fn child_paths(code: &str, module: &str) -> Vec<Vec<String>> {
    let children: Vec<String> = code
        .lines()
        .filter_map(|line| {
            let line = line.trim().trim_start_matches("pub ").trim_start_matches("pub(crate) ");
            line.strip_prefix("mod ")?.strip_suffix(';').map(str::to_string)
        })
        .collect();
    let base: Vec<String> =
        if module.is_empty() { Vec::new() } else { module.split("::").map(str::to_string).collect() };
    let bytes = code.as_bytes();
    let mut paths = Vec::new();
    for child in &children {
        let pattern = format!("{child}::");
        for (at, _) in code.match_indices(&pattern) {
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_' || bytes[at - 1] == b':') {
                continue;
            }
            let mut path = base.clone();
            path.push(child.clone());
            paths.push(path);
        }
    }
    paths
}

/// The deepest file module a path names (a path may end in an item of the module).
fn resolve(path: &[String], modules: &BTreeSet<String>) -> Option<String> {
    (1..=path.len()).rev().map(|len| path[..len].join("::")).find(|candidate| modules.contains(candidate))
}

#[test]
fn no_file_of_the_pod_reaches_itself_through_its_references() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|file| module_of(&src, file)).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let module = module_of(&src, file);
        let is_mod_file = file.file_name().is_some_and(|name| name == "mod.rs");
        let code = code_of(&std::fs::read_to_string(file).expect("read"));
        let targets = edges.entry(module.clone()).or_default();
        let is_root = file.file_name().is_some_and(|name| name == "lib.rs");
        let mut paths = referenced_paths(&code, &module, is_mod_file);
        if is_mod_file || is_root {
            paths.extend(child_paths(&code, &module));
        }
        for path in paths {
            if let Some(target) = resolve(&path, &modules) {
                if target != module && !target.is_empty() {
                    targets.insert(target);
                }
            }
        }
    }
    assert!(edges["host"].contains("workload"), "the scan must see references (host uses the workload)");
    assert!(edges["tigon::scan"].contains("tigon::cats"), "the scan must resolve super:: paths");
    assert!(edges["tigon"].contains("tigon::cats"), "the scan must see a parent naming its children");
    if let Some(cycle) = find_cycle(&edges) {
        panic!("these files reference each other in a circle: {}", cycle.join(" → "));
    }
}

/// A cycle in the graph, as the list of modules along it, if there is one.
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let from = stack.iter().position(|seen| seen == node).expect("open nodes are on the stack");
                let mut cycle = stack[from..].to_vec();
                cycle.push(node.to_string());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node.to_string(), Mark::Open);
        stack.push(node.to_string());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, marks, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        marks.insert(node.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    edges.keys().find_map(|node| visit(node, edges, &mut marks, &mut Vec::new()))
}

#[test]
fn the_cycle_search_finds_a_circle() {
    // Goal: the check above can fail. Method: a three-file circle and a chain.
    let edge = |from: &str, to: &[&str]| (from.to_string(), to.iter().map(|to| to.to_string()).collect());
    let circle: BTreeMap<String, BTreeSet<String>> = [edge("a", &["b"]), edge("b", &["c"]), edge("c", &["a"])].into();
    assert_eq!(find_cycle(&circle).expect("a cycle").len(), 4);
    let chain: BTreeMap<String, BTreeSet<String>> = [edge("a", &["b"]), edge("b", &["c"]), edge("c", &[])].into();
    assert!(find_cycle(&chain).is_none());
}
