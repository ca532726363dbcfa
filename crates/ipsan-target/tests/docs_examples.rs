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

/// A listener beyond loopback authenticates: no example teaches a configuration the target
/// refuses to start (docs/target.md, "Listening beyond loopback"). Checked on the file form,
/// since most examples name secret files that do not exist here.
#[test]
fn accepts_no_example_beyond_loopback_without_host_auth() {
    let md = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/target.md"))
        .unwrap();
    let mut beyond = 0;
    for b in toml_blocks(&md) {
        let f = FileConfig::parse(&b).unwrap();
        let portals = f.server.portals.clone().unwrap_or_default();
        if !portals
            .iter()
            .any(|p| ipsan_target::exposure::beyond_loopback(&p.parse().unwrap()))
            || f.server.insecure_no_auth == Some(true)
        {
            continue;
        }
        beyond += 1;
        for t in &f.target {
            let sealed = t.seal.as_ref().is_some_and(|s| {
                s.policy.as_deref() == Some("required")
                    && (s.secret.is_some() || s.secret_file.is_some() || !s.initiator.is_empty())
            });
            let relayed = t.lun.iter().any(|l| l.chap_relay);
            assert!(
                t.chap.is_some() || !t.chap_host.is_empty() || sealed || relayed,
                "{} authenticates no host beyond loopback:\n{b}",
                t.iqn
            );
        }
    }
    assert!(beyond >= 3, "examples beyond loopback not found");
}
