//! Checks the shape of the control plane from its sources: the top-level
//! modules of `control/` form no import cycle, and only `cli` knows clap.
//!
//! Why it exists: an import cycle grows one `use` at a time and no compiler
//! refuses it; once most modules sit in one cycle, none can be understood,
//! tested or replaced alone. Test-only code (from a file's first
//! `#[cfg(test)]` on) and comments are not read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).expect("readable source directory");
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
}

/// The module path of a file under `control/` (`["api", "types", "openai"]`;
/// `mod.rs` names its directory).
fn module_path(root: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(root).expect("under control/");
    let mut parts: Vec<String> = relative
        .iter()
        .map(|part| part.to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.last_mut() {
        *last = last.trim_end_matches(".rs").to_owned();
    }
    if parts.last().is_some_and(|last| last == "mod") {
        parts.pop();
    }
    parts
}

/// The code of a file without comments and without its test-only tail.
fn production_code(text: &str) -> String {
    let code = text.split("\n#[cfg(test)]").next().unwrap_or_default();
    code.lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The identifiers at the top level of a `{...}` use group starting at
/// `text[0] == '{'`.
fn group_heads(text: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0usize;
    let mut current = String::new();
    let mut at_head = true;
    for ch in text.chars() {
        match ch {
            '{' => {
                depth += 1;
                if depth > 1 {
                    at_head = false;
                }
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => {
                heads.push(std::mem::take(&mut current));
                at_head = true;
            }
            ':' if depth == 1 => at_head = false,
            c if depth == 1 && at_head && (c.is_alphanumeric() || c == '_') => current.push(c),
            _ => {}
        }
    }
    heads.push(current);
    heads.into_iter().filter(|head| !head.is_empty()).collect()
}

/// The top-level modules `code` (of a file at `path`) refers to.
fn referenced_top_modules(path: &[String], code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let word = |text: &str| -> String {
        text.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut add = |rest: &str| {
        if rest.starts_with('{') {
            found.extend(group_heads(rest));
        } else {
            let head = word(rest);
            if !head.is_empty() {
                found.insert(head);
            }
        }
    };
    for (at, _) in code.match_indices("crate::") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `smg_crate::`, not `crate::`
        }
        add(&code[at + "crate::".len()..]);
    }
    // `super::` that climbs to the crate root names a top-level module.
    for (at, _) in code.match_indices("super::") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue; // only the first `super::` of a chain
        }
        let mut rest = &code[at..];
        let mut climbs = 0;
        while let Some(after) = rest.strip_prefix("super::") {
            climbs += 1;
            rest = after;
        }
        // A file's own module is its path; `mod.rs` is its directory's.
        if climbs == path.len() {
            add(rest);
        }
    }
    found
}

/// Top-level module → the top-level modules its production code uses.
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("control");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let tops: BTreeSet<String> = files
        .iter()
        .filter_map(|file| module_path(&root, file).first().cloned())
        // The crate root, the binary and this test are no modules of it.
        .filter(|top| !["lib", "main", "architecture"].contains(&top.as_str()))
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let path = module_path(&root, file);
        let Some(top) = path.first().filter(|top| tops.contains(*top)) else {
            continue;
        };
        let text = std::fs::read_to_string(file).expect("readable source");
        let uses = referenced_top_modules(&path, &production_code(&text));
        let edges = graph.entry(top.clone()).or_default();
        edges.extend(
            uses.into_iter()
                .filter(|used| used != top && tops.contains(used)),
        );
    }
    graph
}

/// A cycle of `graph`, if it has one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        OnPath,
        Done,
    }
    let mut marks: BTreeMap<&str, Mark> = BTreeMap::new();
    for start in graph.keys() {
        if marks.contains_key(start.as_str()) {
            continue;
        }
        // Depth-first with an explicit stack of (node, its next edge).
        let mut path: Vec<(&str, Vec<&str>)> = Vec::new();
        let edges = |node: &str| -> Vec<&str> {
            graph
                .get(node)
                .map(|set| set.iter().map(String::as_str).collect())
                .unwrap_or_default()
        };
        marks.insert(start, Mark::OnPath);
        path.push((start, edges(start)));
        while let Some((node, pending)) = path.last_mut() {
            let node = *node;
            match pending.pop() {
                Some(next) => match marks.get(next) {
                    Some(Mark::OnPath) => {
                        let from = path.iter().position(|(n, _)| *n == next).unwrap_or(0);
                        let mut cycle: Vec<String> =
                            path[from..].iter().map(|(n, _)| (*n).to_owned()).collect();
                        cycle.push(next.to_owned());
                        return Some(cycle);
                    }
                    Some(Mark::Done) => {}
                    None => {
                        marks.insert(next, Mark::OnPath);
                        path.push((next, edges(next)));
                    }
                },
                None => {
                    marks.insert(node, Mark::Done);
                    path.pop();
                }
            }
        }
    }
    None
}

#[test]
fn the_control_plane_has_no_module_cycle() {
    let graph = module_graph();
    assert!(
        graph.len() > 10,
        "the scan found too few modules: {:?}",
        graph.keys()
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "import cycle among control/ modules: {}",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn layering_rules_hold() {
    let graph = module_graph();
    let uses = |from: &str, to: &str| graph.get(from).is_some_and(|set| set.contains(to));
    assert!(
        !uses("workers", "lanes"),
        "workers must not depend on lanes"
    );
    for lower in [
        "pipeline", "router", "workers", "lanes", "models", "policies",
    ] {
        for upper in ["api", "cli", "server", "demo"] {
            assert!(!uses(lower, upper), "{lower} must not depend on {upper}");
        }
    }
    // Only the command line knows clap.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("control");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    for file in files {
        let name = file.strip_prefix(&root).expect("under control/");
        // `cli` and its submodules (`cli/compat.rs`) are the command line.
        if name == Path::new("cli.rs")
            || name.starts_with("cli")
            || name == Path::new("architecture.rs")
        {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("readable source");
        assert!(
            !production_code(&text).contains("clap::"),
            "{} uses clap; flags belong to control/cli.rs",
            name.display()
        );
    }
}

#[test]
fn the_scanner_sees_what_it_must() {
    let path = vec!["router".to_owned()];
    let code = "use crate::{api::types, workers::{A, B}, error};\nlet x = crate::lanes::f();\nuse super::mode::Mode;";
    let found: Vec<String> = referenced_top_modules(&path, code).into_iter().collect();
    assert_eq!(found, ["api", "error", "lanes", "mode", "workers"]);
    let nested = vec!["api".to_owned(), "types".to_owned()];
    let found = referenced_top_modules(&nested, "use super::super::router::R; use super::x;");
    assert_eq!(found.into_iter().collect::<Vec<_>>(), ["router"]);
    let mut graph = BTreeMap::new();
    graph.insert("a".to_owned(), BTreeSet::from(["b".to_owned()]));
    graph.insert("b".to_owned(), BTreeSet::from(["c".to_owned()]));
    graph.insert("c".to_owned(), BTreeSet::from(["a".to_owned()]));
    assert_eq!(
        find_cycle(&graph).map(|cycle| cycle.len()),
        Some(4),
        "a -> b -> c -> a"
    );
    graph.insert("c".to_owned(), BTreeSet::new());
    assert_eq!(find_cycle(&graph), None);
}
