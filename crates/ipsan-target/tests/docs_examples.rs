//! The configuration examples in docs/target.md parse with the real parser (every key is one
//! the target knows: unknown keys are errors), and those without secret files validate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use ipsan_target::config::FileConfig;
use ipsan_target::Config;

fn toml_blocks(md: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur: Option<String> = None;
    for line in md.lines() {
        match (&mut cur, line.trim_start()) {
            (None, l) if l.starts_with("```toml") => cur = Some(String::new()),
            (Some(_), l) if l.starts_with("```") => out.extend(cur.take()),
            (Some(b), _) => {
                b.push_str(line);
                b.push('\n');
            }
            _ => {}
        }
    }
    out
}

#[test]
fn accepts_every_example_in_docs_target_md() {
    let md = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/target.md"))
        .unwrap();
    let blocks = toml_blocks(&md);
    assert!(blocks.len() >= 4, "examples not found");
    for b in &blocks {
        let f = FileConfig::parse(b).unwrap_or_else(|e| panic!("{e}\n{b}"));
        if !b.contains("secret_file") && !b.contains("file:") {
            Config::from_file_config(&f).unwrap_or_else(|e| panic!("{e}\n{b}"));
        }
    }
}
