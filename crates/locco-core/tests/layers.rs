//! The crate's layers import downwards only (see the crate docs): `rt` stands on nothing,
//! `contract` on `rt`, and `engine` and `backend` on both but never on each other. Read from
//! the sources: every `crate::…` path, in code or in a doc link, must name an allowed layer,
//! and none may go through the crate root's re-exports, which would hide the layer it names.

use std::path::{Path, PathBuf};

const LAYERS: [(&str, &[&str]); 4] = [
    ("rt", &["rt"]),
    ("contract", &["rt", "contract"]),
    ("engine", &["rt", "contract", "engine"]),
    ("backend", &["rt", "contract", "backend"]),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The first path segment after each `crate::` in `text`.
fn crate_paths(text: &str) -> Vec<&str> {
    text.match_indices("crate::")
        .filter(|(at, _)| {
            // `locco_core::` or `my_crate::` are not this crate's own paths.
            let before = text[..*at].chars().next_back();
            !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
        .map(|(at, m)| {
            let rest = &text[at + m.len()..];
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect()
}

fn violations() -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    for (layer, allowed) in LAYERS {
        let mut files = Vec::new();
        rust_files(&src.join(layer), &mut files);
        assert!(!files.is_empty(), "no sources under src/{layer}");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for (n, line) in text.lines().enumerate() {
                for first in crate_paths(line) {
                    if !allowed.contains(&first) {
                        let at = file.strip_prefix(&src).unwrap().display().to_string();
                        found.push(format!(
                            "src/{at}:{}: crate::{first} ({layer} may use {allowed:?})",
                            n + 1
                        ));
                    }
                }
            }
        }
    }
    found
}

#[test]
fn each_layer_imports_only_the_layers_below_it() {
    let found = violations();
    assert!(
        found.is_empty(),
        "imports against the layers:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_sees_a_path_across_layers() {
    assert_eq!(
        crate_paths("use crate::engine::lock::Lock; // crate::rt"),
        ["engine", "rt"]
    );
    assert_eq!(
        crate_paths("[`crate::Backend`] and locco_core::Op"),
        ["Backend"]
    );
}

/// The two-segment paths after each `crate::<top>::` in `text`, e.g. `lock` for
/// `crate::engine::lock::Lock` with `top` = `engine`.
fn paths_under<'a>(text: &'a str, top: &str) -> Vec<&'a str> {
    let needle = format!("crate::{top}::");
    text.match_indices(&needle)
        .map(|(at, m)| {
            let rest = &text[at + m.len()..];
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect()
}

/// Inside the layers, the folders keep one direction too: a lock knows nothing of the Locker
/// that made it (`engine/lock` never names `engine::locker`), and a backend uses only itself
/// and `backend/shared`, never another backend.
#[test]
fn a_lock_never_imports_the_locker_and_a_backend_never_another() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    let mut check = |dir: &str, top: &str, allowed: &dyn Fn(&str) -> bool| {
        let mut files = Vec::new();
        let path = src.join(dir);
        if path.is_dir() {
            rust_files(&path, &mut files);
        } else {
            files.push(path.with_extension("rs"));
        }
        assert!(!files.is_empty(), "no sources under src/{dir}");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for (n, line) in text.lines().enumerate() {
                for second in paths_under(line, top) {
                    if !allowed(second) {
                        let at = file.strip_prefix(&src).unwrap().display().to_string();
                        found.push(format!("src/{at}:{}: crate::{top}::{second}", n + 1));
                    }
                }
            }
        }
    };
    check("engine/lock", "engine", &|m| m != "locker");
    for backend in ["etcd", "mongo", "postgres", "redis", "memory"] {
        check(&format!("backend/{backend}"), "backend", &|m| {
            m == backend || m == "shared"
        });
    }
    assert!(
        found.is_empty(),
        "imports across folders:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_folder_check_reads_the_second_segment() {
    assert_eq!(
        paths_under("use crate::engine::locker::Locker; crate::rt::x", "engine"),
        ["locker"]
    );
}
