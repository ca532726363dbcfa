//! Every path into `docs/results/` that a Markdown file, a source file, a plan or a script of
//! the repository quotes exists, and every relative link in README.md and docs/*.md resolves
//! (issue 32: superseded runs left the tree, so a doc that still points at one must fail here,
//! not in a reader's browser).
//!
//! Paths quoted in a `git log`/`git show`/`git ls-tree` command name history on purpose and are
//! not checked; neither are templates (`<run>`, `*`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `*.md` under `dir` (recursively), skipping build output.
fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    files_ending(dir, &[".md"], out);
}

/// Every file under `dir` (recursively) whose name ends in one of `ends` ("" = any), skipping
/// build output and hidden directories.
fn files_ending(dir: &Path, ends: &[&str], out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if p.is_dir() {
            if !name.starts_with('.') && name != "target" && !name.starts_with("target-") {
                files_ending(&p, ends, out);
            }
        } else if ends.iter().any(|e| name.ends_with(e)) {
            out.push(p);
        }
    }
}

/// The `docs/results/...` paths a text quotes, outside git history commands.
fn quoted_results_paths(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in text.lines() {
        if ["git log", "git show", "git ls-tree"]
            .iter()
            .any(|g| line.contains(g))
        {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("docs/results/") {
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| {
                    !(c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-' | '<' | '*'))
                })
                .unwrap_or(tail.len());
            let p = tail[..end].trim_end_matches(['.', ',']);
            if !p.contains(['<', '*']) {
                found.push(p.to_string());
            }
            rest = &tail[end..];
        }
    }
    found
}

/// The relative targets of Markdown links `[text](target)` in a text, without anchors.
fn relative_links(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        let tail = &rest[i + 2..];
        let end = tail
            .find(|c: char| c == ')' || c.is_whitespace())
            .unwrap_or(tail.len());
        let target = &tail[..end];
        let is_url = target
            .split_once(':')
            .is_some_and(|(scheme, _)| scheme.chars().all(|c| c.is_ascii_alphabetic()));
        if !target.is_empty() && !target.starts_with('#') && !is_url {
            found.push(target.split('#').next().unwrap().to_string());
        }
        rest = &tail[end..];
    }
    found
}

#[test]
fn every_quoted_results_path_exists() {
    let root = root();
    let mut files = vec![root.join("README.md"), root.join("DEVELOPERS.md")];
    markdown_files(&root.join("docs"), &mut files);
    // Code, plans and scripts quote results too (doc comments, default paths).
    files_ending(&root.join("crates"), &[".md", ".rs", ".toml"], &mut files);
    files_ending(&root.join("src"), &[".rs"], &mut files);
    files_ending(&root.join("scripts"), &[""], &mut files);
    files_ending(&root.join("tests"), &[".rs"], &mut files);
    // This file names a removed run on purpose.
    files.retain(|f| !f.ends_with("tests/results_links.rs"));
    let mut missing = Vec::new();
    for f in &files {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue; // not text
        };
        for p in quoted_results_paths(&text) {
            if !root.join(&p).exists() {
                missing.push(format!("{}: {p}", f.strip_prefix(&root).unwrap().display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "paths into docs/results that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_relative_link_in_readme_and_docs_resolves() {
    let root = root();
    let mut files = vec![root.join("README.md"), root.join("DEVELOPERS.md")];
    for e in std::fs::read_dir(root.join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            files.push(p);
        }
    }
    files.push(root.join("docs/results/README.md"));
    let mut missing = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for l in relative_links(&text) {
            if !f.parent().unwrap().join(&l).exists() {
                missing.push(format!("{}: {l}", f.strip_prefix(&root).unwrap().display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "relative links that resolve to nothing:\n{}",
        missing.join("\n")
    );
}

#[test]
fn rejects_a_path_to_a_removed_run_and_a_dangling_link() {
    // The checkers themselves: a removed run is found, history commands and templates are not.
    let text = "see [demo](docs/results/lab-demo-9/report.md), and `docs/results/<run>/`\n\
                `git show 94a3b28:docs/results/lab-demo-9/report.md`";
    assert_eq!(
        quoted_results_paths(text),
        ["docs/results/lab-demo-9/report.md"]
    );
    assert!(!root().join("docs/results/lab-demo-9").exists());
    assert_eq!(
        relative_links("[a](x.md#s) [b](https://e.org) [c](#top) [d](../y/)"),
        ["x.md", "../y/"]
    );
}
