//! The pooler's modules import one another in layers: no chain of `crate::` paths leads from a
//! module back to itself.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

#[test]
fn no_module_imports_itself_through_others() {
    // Goal: the import circles inside the pooler stay cut (issue 22). Method: read every source
    // file, take the `crate::<module>` paths outside comments and tests (including `use
    // crate::{a, b}` groups) as edges between top-level modules (a folder module is one node),
    // and look for a cycle with a depth-first search.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = top_level_modules(&std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs"));
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in rust_files(&src) {
        let relative = file.strip_prefix(&src).expect("under src");
        let module = relative.iter().next().and_then(|part| part.to_str()).expect("a name");
        let module = module.trim_end_matches(".rs").to_owned();
        if module == "lib" {
            continue;
        }
        let code = without_comments_and_tests(&std::fs::read_to_string(&file).expect("readable"));
        let edges = graph.entry(module.clone()).or_default();
        edges.extend(referenced_modules(&code).into_iter().filter(|name| modules.contains(name) && *name != module));
    }
    assert!(graph.len() >= 20, "found only {} modules: the scan is broken", graph.len());
    assert!(graph["session"].contains("pool"), "the scan missed a known import");
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import cycle inside the pooler: {}", cycle.join(" → "));
    }
}

fn top_level_modules(lib: &str) -> BTreeSet<String> {
    lib.lines()
        .filter_map(|line| line.trim().strip_prefix("pub mod ").or_else(|| line.trim().strip_prefix("mod ")))
        .map(|rest| rest.trim_end_matches(';').to_owned())
        .collect()
}

fn rust_files(folder: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(folder).expect("readable folder") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            files.push(path);
        }
    }
    files
}

/// The code without `//` comments (doc links are not imports) and without the trailing
/// `#[cfg(test)]` module (tests may reach anywhere).
fn without_comments_and_tests(text: &str) -> String {
    let code = match text.find("#[cfg(test)]\nmod tests") {
        Some(start) => &text[..start],
        None => text,
    };
    code.lines().map(|line| line.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// The first path segment after every `crate::`, and each item of `crate::{…}` groups.
fn referenced_modules(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (index, _) in code.match_indices("crate::") {
        let rest = &code[index + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            names.extend(group.split(',').map(|item| leading_identifier(item.trim())));
        } else {
            names.insert(leading_identifier(rest));
        }
    }
    names
}

fn leading_identifier(text: &str) -> String {
    text.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect()
}

/// A cycle as a list of modules whose first and last are the same, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        marks.insert(node.to_owned(), Mark::Open);
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            match marks.get(next) {
                Some(Mark::Open) => {
                    let start = path.iter().position(|step| step == next).expect("open nodes are on the path");
                    let mut cycle = path[start..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Some(Mark::Done) => {}
                None => {
                    if let Some(cycle) = visit(next, graph, marks, path) {
                        return Some(cycle);
                    }
                }
            }
        }
        path.pop();
        marks.insert(node.to_owned(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if !marks.contains_key(node) {
            if let Some(cycle) = visit(node, graph, &mut marks, &mut Vec::new()) {
                return Some(cycle);
            }
        }
    }
    None
}
