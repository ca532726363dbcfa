//! One layer per concern (issue 32's evidence), checked on the sources: outside the crates
//! that own the iSCSI wire format, the protocol and the SCSI command set (`iscsi-wire`,
//! `iscsi-proto`, `ipsan-scsi`), no production code
//!
//! - builds an iSCSI PDU header (a struct literal or `::default()` of an `iscsi_wire::header`
//!   type the file imports, RFC 7143 §11): the PDUs come from iscsi-proto's machines;
//! - does CmdSN / StatSN / DataSN / R2TSN / TTT arithmetic (`+`, `-`, `wrapping_add`, …; RFC
//!   7143 §4.2.2): the sequence numbers are the engine's;
//! - reads a CDB byte by index (`cdb[0]`, `cdb.first()`, `cdb.get(1)`, `cdb[2..10]`): a CDB is
//!   parsed once, into `ipsan_scsi::cdb::CommandInfo`;
//! - matches on SCSI operation codes (`op::READ_16 | op::WRITE_16 =>`): one opcode table.
//!
//! "Production" is `src/` and every crate's `src/` but `#[cfg(test)]` modules (inline or in
//! their own file). NVMe's PDUs are another protocol's and not iSCSI headers; a file that
//! imports no iSCSI header type is not checked for header literals (`ipsan_scsi::ScsiResponse`
//! shares a name with one). A breach fails with each file, line and rule:
//! `cargo test --test layers`.
//!
//! The greps these rules make precise (for a reader without the test):
//! `git grep -nE 'cdb(\(\))?\s*\[[0-9.]|cdb\.(first|get)\(' -- src 'crates/*/src'`,
//! `git grep -nE '(cmd_sn|stat_sn|data_sn|ttt)\s*([-+]|\.wrapping_)' -- src 'crates/*/src'`,
//! `git grep -nE '\b(LoginRequest|TextRequest|LogoutRequest|ScsiCommand|DataOut|NopOut) \{' -- src 'crates/*/src'`,
//! each outside `crates/iscsi-wire`, `crates/iscsi-proto` and `crates/ipsan-scsi`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// The crates whose business these things are.
const OWNERS: [&str; 3] = ["iscsi-wire", "iscsi-proto", "ipsan-scsi"];

/// `iscsi_wire::header`'s PDU types (RFC 7143 §11).
const HEADERS: [&str; 18] = [
    "ScsiCommand",
    "ScsiResponse",
    "DataOut",
    "DataIn",
    "R2t",
    "LoginRequest",
    "LoginResponse",
    "TextRequest",
    "TextResponse",
    "LogoutRequest",
    "LogoutResponse",
    "TaskMgmtRequest",
    "TaskMgmtResponse",
    "NopOut",
    "NopIn",
    "SnackRequest",
    "Reject",
    "AsyncMessage",
];

/// Sequence numbers and tags the engine keeps (RFC 7143 §4.2.2, §11.7.4): identifiers that
/// end in one of these.
const SERIALS: [&str; 5] = ["cmd_sn", "stat_sn", "data_sn", "r2t_sn", "ttt"];

/// The checkout scanned: this one, or `$LAYERS_ROOT` (another revision's tree, to see the
/// rules find what it had: `mkdir /tmp/old && git archive 98d9f39 src crates | tar -x -C
/// /tmp/old`, then `LAYERS_ROOT=/tmp/old cargo test --test layers`).
fn root() -> PathBuf {
    std::env::var_os("LAYERS_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every identifier in `code` with the byte offsets of its start and end.
fn idents(code: &str) -> Vec<(usize, usize, &str)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in code
        .char_indices()
        .chain(std::iter::once((code.len(), ' ')))
    {
        match (start, is_ident(c)) {
            (None, true) => start = Some(i),
            (Some(s), false) => {
                let w = &code[s..i];
                if !w.starts_with(|c: char| c.is_ascii_digit()) {
                    out.push((s, i, w));
                }
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// The iSCSI header types a file names: those it imports from `iscsi_wire` (all of them for
/// `header::*`).
fn imported_headers(text: &str) -> HashSet<&'static str> {
    let mut names = HashSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("use iscsi_wire") {
        let tail = &rest[i..];
        let end = tail.find(';').unwrap_or(tail.len());
        let stmt = &tail[..end];
        if stmt.contains("header::*") {
            names.extend(HEADERS);
        }
        if stmt.contains("header") {
            for (_, _, w) in idents(stmt) {
                if let Some(h) = HEADERS.iter().find(|h| **h == w) {
                    names.insert(*h);
                }
            }
        }
        rest = &tail[end..];
    }
    names
}

/// The text of the braces that open at `open` (a `{` in `lines[at]`), up to 60 lines on, and
/// what follows the closing brace on its line.
fn braced<'a>(lines: &[&'a str], at: usize, open: usize) -> (String, &'a str) {
    let mut depth = 0usize;
    let mut body = String::new();
    for (k, line) in lines.iter().enumerate().skip(at).take(60) {
        let from = if k == at { open } else { 0 };
        for (i, c) in line[from..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return (body, &line[from + i + 1..]);
                    }
                }
                _ => {}
            }
            if depth > 0 && !(k == at && i == 0) {
                body.push(c);
            }
        }
        body.push('\n');
    }
    (body, "")
}

/// Whether the braces at `lines[at][open]` are a pattern (`Name { a, .. }`, a `let` or match
/// arm's destructuring), not a value being built.
fn is_pattern(lines: &[&str], at: usize, open: usize) -> bool {
    let (body, after) = braced(lines, at, open);
    let body = body.trim_end().trim_end_matches(',').trim_end();
    let after = after.trim_start().trim_start_matches(')').trim_start();
    body.ends_with("..")
        || after.starts_with("=>")
        || after.starts_with('|')
        || after.starts_with("if ")
        || (after.starts_with('=') && !after.starts_with("=="))
}

/// The rules one line breaks: (rule, what matched).
fn line_breaches(
    lines: &[&str],
    at: usize,
    headers: &HashSet<&str>,
) -> Vec<(&'static str, String)> {
    let code = lines[at].split("//").next().unwrap_or("");
    let mut found = Vec::new();
    let words = idents(code);
    for (k, &(s, e, w)) in words.iter().enumerate() {
        let before = code[..s].trim_end();
        let after = &code[e..];
        let next = after.trim_start();
        // A header built: `LoginRequest { … }`, `header::NopOut::default()`.
        let qualified = before.ends_with("header::");
        if (headers.contains(w) || (qualified && HEADERS.contains(&w)))
            && !before.ends_with("->")
            && !matches!(
                k.checked_sub(1).map(|p| words[p].2),
                Some("struct" | "enum" | "impl" | "for" | "type" | "use")
            )
            && (!before.ends_with("::") || qualified)
        {
            if next.starts_with('{') {
                let open = e + (after.len() - next.len());
                if !is_pattern(lines, at, open) {
                    found.push(("builds an iSCSI PDU header", format!("{w} {{")));
                }
            } else if next.starts_with("::default()") {
                found.push(("builds an iSCSI PDU header", format!("{w}::default()")));
            }
        }
        // Serial number / tag arithmetic.
        if SERIALS
            .iter()
            .any(|n| w == *n || w.ends_with(&format!("_{n}")))
        {
            let op_after = next.starts_with(".wrapping_add(")
                || next.starts_with(".wrapping_sub(")
                || ["+ ", "- ", "+=", "-="].iter().any(|o| next.starts_with(o));
            let lead = before
                .trim_end_matches(|c: char| is_ident(c) || c == '.')
                .trim_end();
            let op_before = (lead.ends_with('+') || lead.ends_with('-') || lead.ends_with("+="))
                && !lead.ends_with("->");
            if op_after || op_before {
                found.push(("CmdSN/StatSN/DataSN/TTT arithmetic", w.to_string()));
            }
        }
        // A CDB's bytes read by index.
        if w.contains("cdb") {
            let rest = next.strip_prefix("()").unwrap_or(next).trim_start();
            let index = rest.strip_prefix('[').map(str::trim_start);
            let by_index = index.is_some_and(|i| {
                i.starts_with(|c: char| c.is_ascii_digit())
                    || i.strip_prefix("..")
                        .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
            });
            let by_call = rest.starts_with(".first()")
                || rest
                    .strip_prefix(".get(")
                    .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()));
            if by_index || by_call {
                found.push(("reads a CDB byte by index", w.to_string()));
            }
        }
        // A match on SCSI operation codes.
        if w == "op" && after.starts_with("::") && !before.ends_with('.') {
            let rest = &after[2..];
            let name_len = rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len());
            let name = &rest[..name_len];
            let tail = rest[name_len..].trim_start();
            if name.starts_with(|c: char| c.is_ascii_uppercase())
                && (tail.starts_with("=>") || (tail.starts_with('|') && !tail.starts_with("||")))
            {
                found.push(("matches on SCSI operation codes", format!("op::{name}")));
            }
        }
    }
    found
}

/// Every breach in one production file's text: (line number, rule, what matched, the line).
fn breaches(text: &str) -> Vec<(usize, &'static str, String, String)> {
    let headers = imported_headers(text);
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        // An inline `#[cfg(test)] mod x { … }` is skipped to its closing brace (rustfmt puts
        // it at the module's indentation).
        if lines[i].trim() == "#[cfg(test)]" {
            if let Some(next) = lines.get(i + 1) {
                let t = next.trim_start();
                let t = t.strip_prefix("pub(crate) ").unwrap_or(t);
                if t.starts_with("mod ") && t.trim_end().ends_with('{') {
                    let close = format!("{}}}", &next[..next.len() - next.trim_start().len()]);
                    i += 2;
                    while i < lines.len() && lines[i] != close {
                        i += 1;
                    }
                    i += 1;
                    continue;
                }
            }
        }
        for (rule, what) in line_breaches(&lines, i, &headers) {
            out.push((i + 1, rule, what, lines[i].trim().to_string()));
        }
        i += 1;
    }
    out
}

/// The files of `#[cfg(test)] mod x;` declarations in `file`'s text.
fn test_module_files(file: &Path, text: &str) -> Vec<PathBuf> {
    let lines: Vec<&str> = text.lines().collect();
    let dir = match file.file_name().and_then(|n| n.to_str()) {
        Some("lib.rs" | "main.rs" | "mod.rs") => file.parent().unwrap().to_path_buf(),
        _ => file.with_extension(""),
    };
    let mut out = Vec::new();
    for w in lines.windows(2) {
        if w[0].trim() != "#[cfg(test)]" {
            continue;
        }
        let t = w[1].trim();
        let t = t.strip_prefix("pub(crate) ").unwrap_or(t);
        if let Some(name) = t.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
            out.push(dir.join(format!("{}.rs", name.trim())));
            out.push(dir.join(name.trim()).join("mod.rs"));
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The production sources outside the owning crates.
fn production_files() -> Vec<PathBuf> {
    let root = root();
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    for e in std::fs::read_dir(root.join("crates")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if !OWNERS.contains(&name.as_str()) {
            rust_files(&p.join("src"), &mut files);
        }
    }
    let mut tests = HashSet::new();
    for f in &files {
        tests.extend(test_module_files(f, &std::fs::read_to_string(f).unwrap()));
    }
    files.retain(|f| !tests.contains(f));
    files.sort();
    files
}

#[test]
fn keeps_pdus_sequence_numbers_cdb_bytes_and_opcode_tables_in_their_own_crates() {
    let root = root();
    let files = production_files();
    assert!(
        files.len() > 50,
        "only {} production files found: the walk is broken",
        files.len()
    );
    let mut report = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (line, rule, what, src) in breaches(&text) {
            report.push(format!(
                "{}:{line}: {rule} ({what}): {src}",
                f.strip_prefix(&root).unwrap().display()
            ));
        }
    }
    assert!(
        report.is_empty(),
        "outside {OWNERS:?} (issue 32, one layer per concern; move it into its crate or use \
         what it offers):\n{}",
        report.join("\n")
    );
}

/// What the drivers did at 98d9f39, before the sans-IO move (issue 32's examples): each is
/// found, under its rule.
#[test]
fn rejects_each_kind_of_breach_as_the_drivers_had_them() {
    let cases: [(&str, &str); 9] = [
        (
            "use iscsi_wire::header::{LoginRequest, LoginResponse};\n\
             fn f() {\n    let req = LoginRequest {\n        transit: true,\n    };\n}\n",
            "builds an iSCSI PDU header",
        ),
        (
            "use iscsi_wire::header::*;\nfn f() { let n = NopOut::default(); }\n",
            "builds an iSCSI PDU header",
        ),
        (
            "fn f() { let t = iscsi_wire::header::TextRequest { itt: 1 }; }\n",
            "builds an iSCSI PDU header",
        ),
        (
            "fn f() { exp_stat_sn = r.stat_sn.wrapping_add(1); }\n",
            "CmdSN/StatSN/DataSN/TTT arithmetic",
        ),
        (
            "fn f() { let next = self.cmd_sn + 1; }\n",
            "CmdSN/StatSN/DataSN/TTT arithmetic",
        ),
        (
            "fn f() { let field = match cdb.first()? { _ => 0 }; }\n",
            "reads a CDB byte by index",
        ),
        (
            "fn f() { let opcode = x.cdb[0]; }\n",
            "reads a CDB byte by index",
        ),
        (
            "fn f() { let lba = &req.cdb()[2..10]; }\n",
            "reads a CDB byte by index",
        ),
        (
            "fn f(o: u8) { match o { op::READ_10 | op::READ_16 => {} _ => {} } }\n",
            "matches on SCSI operation codes",
        ),
    ];
    for (text, rule) in cases {
        let found = breaches(text);
        assert!(
            found.iter().any(|(_, r, _, _)| *r == rule),
            "not found as {rule:?}: {text}\n(found {found:?})"
        );
    }
}

/// What only looks like a breach: patterns, return types, other crates' types of the same
/// name, full slices, comments, test modules.
#[test]
fn accepts_patterns_comments_test_modules_and_lookalikes() {
    let text = "use iscsi_wire::header::{LoginResponse, NopIn, ScsiCommand};\n\
        use ipsan_scsi::ScsiResponse;\n\
        // cdb[0] and self.cmd_sn + 1 in a comment\n\
        fn refused() -> ScsiResponse {\n    ScsiResponse { status: 2 }\n}\n\
        fn f(h: &Header) {\n\
        \x20   if let Header::LoginResponse(LoginResponse { status_class, .. }) = h {}\n\
        \x20   let NopIn { itt, ttt } = n;\n\
        \x20   match h {\n\
        \x20       Header::ScsiCommand(ScsiCommand {\n\
        \x20           itt,\n\
        \x20           ..\n\
        \x20       }) => {}\n\
        \x20   }\n\
        \x20   let all = &cdb[..];\n\
        \x20   let len = cdb.len();\n\
        \x20   let same = x.cmd_sn == y.cmd_sn;\n\
        \x20   let pdu = Pdu::new(reply.header, data);\n\
        }\n\
        #[cfg(test)]\n\
        mod tests {\n\
        \x20   fn cmd() -> ScsiCommand {\n\
        \x20       ScsiCommand { itt: cdb[0] as u32 + x.cmd_sn + 1 }\n\
        \x20   }\n\
        }\n\
        fn after_tests(s: &Session) -> u32 {\n    s.window()\n}\n";
    let found = breaches(text);
    assert!(found.is_empty(), "false breaches: {found:?}");
    // The walk leaves `#[cfg(test)] mod tests;` files out.
    let files = test_module_files(
        Path::new("/r/crates/x/src/queue.rs"),
        "#[cfg(test)]\nmod tests;\n",
    );
    assert!(files.contains(&PathBuf::from("/r/crates/x/src/queue/tests.rs")));
}

// ---- No import circle between a crate's top-level modules ----
//
// Each crate's top-level modules (`src/x.rs` or `src/x/`) import one another one way: a
// module that names another through `crate::x::…` or `super::x::…` (a `use` or a path in the
// code, also in an attribute's string such as serde's `skip_serializing_if`) depends on it, and
// no module may come back to itself through such imports. A circle means two modules are one
// concern split in two, or a small item sits in the wrong one (issue 32). Comments and test
// modules do not count; the crate root (lib.rs, main.rs) is above every module.

/// The module path of `file` under `src` (`src/a/b.rs` → `[a, b]`; lib.rs, main.rs → `[]`).
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        parts.clear();
    }
    parts
}

/// A file's code without comments and inline `#[cfg(test)]` modules (lines kept, blanked).
fn code_only(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() == "#[cfg(test)]" {
            if let Some(next) = lines.get(i + 1) {
                let t = next.trim_start();
                let t = t.strip_prefix("pub(crate) ").unwrap_or(t);
                if t.starts_with("mod ") && t.trim_end().ends_with('{') {
                    let close = format!("{}}}", &next[..next.len() - next.trim_start().len()]);
                    while i < lines.len() && lines[i] != close {
                        out.push('\n');
                        i += 1;
                    }
                    out.push('\n');
                    i += 1;
                    continue;
                }
            }
        }
        out.push_str(lines[i].split("//").next().unwrap_or(""));
        out.push('\n');
        i += 1;
    }
    out
}

/// The first name of each item of a path's tail: `x::Y` → `x`, `{a::B, c}` → `a`, `c`.
fn first_names(tail: &str) -> Vec<String> {
    let name = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| is_ident(*c))
            .collect()
    };
    let Some(group) = tail.strip_prefix('{') else {
        return vec![name(tail)];
    };
    let mut depth = 0usize;
    let mut items = vec![String::new()];
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(String::new());
                continue;
            }
            _ => {}
        }
        items.last_mut().unwrap().push(c);
    }
    let mut names = Vec::new();
    for item in &items {
        let n = name(item);
        if !n.is_empty() {
            names.push(n);
        }
    }
    names
}

/// Which top-level modules of its crate the file at module path `module` names, each with the
/// line: `crate::x`, and `super::x` where the `super`s reach the crate root.
fn module_imports(module: &[String], text: &str) -> Vec<(String, usize)> {
    let code = code_only(text);
    let mut out = Vec::new();
    for (at, _) in code
        .match_indices("crate::")
        .chain(code.match_indices("super::"))
    {
        if code[..at].ends_with(|c: char| is_ident(c) || c == '$' || c == ':') {
            continue;
        }
        let mut rest = &code[at..];
        let tail = if let Some(t) = rest.strip_prefix("crate::") {
            t
        } else {
            let mut ups = 0;
            while let Some(r) = rest.strip_prefix("super::") {
                ups += 1;
                rest = r.trim_start();
            }
            if ups < module.len() {
                // Still inside its own top-level module.
                continue;
            }
            rest
        };
        let line = code[..at].matches('\n').count() + 1;
        for name in first_names(tail.trim_start()) {
            out.push((name, line));
        }
    }
    out
}

/// A crate's import graph between its top-level modules: for each edge, one place that makes
/// it (file and line).
type Graph = std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>;

/// The graph of the files `(path, text)` under `src`.
fn module_graph(src: &Path, files: &[(PathBuf, String)]) -> Graph {
    let tops: HashSet<String> = files
        .iter()
        .filter_map(|(f, _)| module_path(src, f).first().cloned())
        .collect();
    let mut graph = Graph::new();
    for (f, text) in files {
        let module = module_path(src, f);
        let Some(top) = module.first() else {
            continue;
        };
        for (to, line) in module_imports(&module, text) {
            if to != *top && tops.contains(&to) {
                graph
                    .entry(top.clone())
                    .or_default()
                    .entry(to)
                    .or_insert_with(|| format!("{}:{line}", f.display()));
            }
        }
    }
    graph
}

/// The circles of a graph: each set of two or more modules that reach one another, sorted.
fn circles(graph: &Graph) -> Vec<Vec<String>> {
    let reach = |from: &str| -> HashSet<String> {
        let mut seen = HashSet::new();
        let mut stack = vec![from.to_string()];
        while let Some(n) = stack.pop() {
            for next in graph.get(&n).into_iter().flat_map(|m| m.keys()) {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let mut out: Vec<Vec<String>> = Vec::new();
    for n in graph.keys() {
        if out.iter().any(|c| c.contains(n)) {
            continue;
        }
        let from_n = reach(n);
        let mut circle: Vec<String> = from_n
            .iter()
            .filter(|m| *m != n && reach(m).contains(n))
            .cloned()
            .collect();
        if !circle.is_empty() {
            circle.push(n.clone());
            circle.sort();
            out.push(circle);
        }
    }
    out.sort();
    out
}

/// One circle as the failure prints it: each edge inside it and where it is made.
fn describe(graph: &Graph, circle: &[String]) -> String {
    let mut s = String::new();
    for from in circle {
        for (to, at) in graph.get(from).into_iter().flatten() {
            if circle.contains(to) {
                s.push_str(&format!("\n    {from} -> {to} ({at})"));
            }
        }
    }
    s
}

/// Every workspace crate's name and `src` directory.
fn crate_sources() -> Vec<(String, PathBuf)> {
    let root = root();
    let mut out = vec![("ipsan".to_string(), root.join("src"))];
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    dirs.sort();
    for d in dirs {
        if d.join("src").is_dir() {
            let name = d.file_name().unwrap().to_string_lossy().into_owned();
            out.push((name, d.join("src")));
        }
    }
    out
}

#[test]
fn keeps_each_crates_top_level_modules_free_of_import_circles() {
    let crates = crate_sources();
    assert!(crates.len() > 10, "only {} crates found", crates.len());
    let mut report = Vec::new();
    for (name, src) in &crates {
        let mut paths = Vec::new();
        rust_files(src, &mut paths);
        let mut tests = HashSet::new();
        let files: Vec<(PathBuf, String)> = paths
            .iter()
            .map(|p| (p.clone(), std::fs::read_to_string(p).unwrap()))
            .collect();
        for (p, text) in &files {
            tests.extend(test_module_files(p, text));
        }
        let files: Vec<_> = files
            .into_iter()
            .filter(|(p, _)| !tests.contains(p))
            .collect();
        let graph = module_graph(src, &files);
        for circle in circles(&graph) {
            report.push(format!(
                "{name}: {} import one another:{}",
                circle.join(", "),
                describe(&graph, &circle)
            ));
        }
    }
    assert!(
        report.is_empty(),
        "import circles between a crate's top-level modules (issue 32: one way, lower modules \
         first; move the shared item down or name what the lower module needs by a trait it \
         owns):\n{}",
        report.join("\n")
    );
}

/// Circles ipsan-target had at 7448b14 (registry ↔ conn: the registry kept `Weak<conn::Core>`
/// for MC/S joining; config ↔ nvme; nvme ↔ server), written as its files had them: each is
/// found, also through `super::` from a top-level module, `super::super::` from below one, a
/// multi-line `use crate::{…}` and a path in a serde attribute's string.
#[test]
fn rejects_circles_between_top_level_modules_as_the_target_had_them() {
    let src = Path::new("/r/src");
    let files: Vec<(PathBuf, String)> = [
        (
            "lib.rs",
            "mod config;\nmod conn;\nmod nvme;\nmod registry;\nmod server;\n",
        ),
        (
            "registry.rs",
            "struct E {\n    core: Option<std::sync::Weak<crate::conn::Core>>,\n}\n",
        ),
        ("conn.rs", "use crate::registry::Registry;\n"),
        ("conn/login.rs", "use super::Shared;\n"),
        (
            "config/file.rs",
            "#[serde(default, skip_serializing_if = \"crate::nvme::FileNvme::is_empty\")]\n",
        ),
        ("nvme/mod.rs", "use super::config::Config;\n"),
        ("nvme/conn.rs", "use super::super::registry::Target;\n"),
        (
            "server.rs",
            "use crate::{\n    config::Config,\n    nvme::NvmeServer,\n};\n",
        ),
        (
            "nvme/listen.rs",
            "fn f() { crate::server::listen(a, t); }\n",
        ),
    ]
    .iter()
    .map(|(p, t)| (src.join(p), t.to_string()))
    .collect();
    let graph = module_graph(src, &files);
    assert_eq!(
        circles(&graph),
        vec![
            vec!["config".to_string(), "nvme".into(), "server".into()],
            vec!["conn".to_string(), "registry".into()],
        ],
        "{graph:?}"
    );
    assert!(
        graph["nvme"].contains_key("registry"),
        "super::super:: reaches the root"
    );
}

/// What is no circle: one-way imports, a module's own submodules through `super::`, comments,
/// doc links and test modules.
#[test]
fn accepts_one_way_imports_submodules_comments_and_test_modules() {
    let src = Path::new("/r/src");
    let files: Vec<(PathBuf, String)> = [
        ("a.rs", "use crate::b::X;\nmod inner;\n"),
        (
            "a/inner.rs",
            "use super::super::a::Y;\nuse super::Z;\nuse crate::a::W;\n",
        ),
        (
            "b.rs",
            "// crate::a::Y in a comment\n/// [`crate::a`] in a doc link\nfn f() {}\n\
             #[cfg(test)]\nmod tests {\n    use crate::a::Z;\n    use super::super::a::V;\n}\n",
        ),
        ("b/c.rs", "use super::super::b::W;\nuse crate::c::Q;\n"),
        ("c.rs", "fn g() -> u8 { 0 }\n"),
    ]
    .iter()
    .map(|(p, t)| (src.join(p), t.to_string()))
    .collect();
    let graph = module_graph(src, &files);
    assert!(circles(&graph).is_empty(), "false circles: {graph:?}");
    assert_eq!(graph["a"].keys().collect::<Vec<_>>(), ["b"]);
    assert_eq!(graph["b"].keys().collect::<Vec<_>>(), ["c"]);
}
