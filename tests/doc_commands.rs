//! Every command in README.md and docs/*.md, checked against the program as written (issue 32:
//! "a doc cannot drift from the program again"). The convention is in DEVELOPERS.md, "Commands
//! in the docs":
//!
//! - every fenced ```` ```sh ````, ```` ```bash ```` and ```` ```console ```` block is read
//!   (docs/results/** is not: those are records of runs);
//! - every `ipsan …` invocation in them (also after `sudo`, `cargo run … --` and
//!   `ipsan wan exec NS --`) is parsed by the real command line parser (`ipsan --check-args`):
//!   a flag that drifted fails with the doc, the line and clap's error;
//! - a block preceded by `<!-- doc-test: parse-only: REASON -->` is only parsed; every other
//!   block is run: all of one document's run blocks in order, as one bash script with `set -e`,
//!   in a fresh directory, inside a network and mount namespace of its own (loopback only,
//!   private /tmp and /run), so the documented fixed ports and paths are used as written. A
//!   command ending in `&` is started in the background and waited for until it prints
//!   `listening on` (as `ipsan target` and `ipsan gateway` do); such processes are killed at
//!   the end. In a `console` block, `$ ` lines are commands and the lines under them the
//!   output they must print (digits and runs of spaces are compared loosely);
//! - a ```` ``` ```` block without a language that holds a `$ ` line is an error (give it
//!   `console` to have it checked, or `text`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ipsan");
const MARKER: &str = "<!-- doc-test: parse-only:";
/// One document's run blocks must finish within this.
const RUN_LIMIT: Duration = Duration::from_secs(45);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Lang {
    Sh,
    Console,
}

#[derive(Debug)]
struct Block {
    doc: String,
    lang: Lang,
    parse_only: Option<String>,
    /// The block's lines with their 1-based line numbers.
    lines: Vec<(usize, String)>,
}

/// One command of a block: its first line, its text (continuations joined, heredoc body
/// kept) and, in a console block, the output shown under it.
#[derive(Debug)]
struct Cmd {
    line: usize,
    text: String,
    /// The text without a heredoc's body: what is parsed for invocations.
    head: String,
    shown: Option<Vec<String>>,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and docs/*.md (not docs/results/**).
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![root().join("README.md")];
    let mut more: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    more.sort();
    docs.extend(more);
    docs
}

/// The blocks of one document, and the convention's errors found on the way.
fn blocks(doc: &str, text: &str, errors: &mut Vec<String>) -> Vec<Block> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        let Some(info) = l.strip_prefix("```") else {
            if l.trim_start().starts_with(MARKER)
                && !lines.get(i + 1).is_some_and(|n| n.starts_with("```"))
            {
                errors.push(format!(
                    "{doc}:{}: a doc-test marker must be on the line right before a fenced block",
                    i + 1
                ));
            }
            i += 1;
            continue;
        };
        let info = info.trim().to_owned();
        let start = i;
        let mut body = Vec::new();
        i += 1;
        while i < lines.len() && !lines[i].starts_with("```") {
            body.push((i + 1, lines[i].to_owned()));
            i += 1;
        }
        i += 1; // the closing fence
        let lang = match info.split_whitespace().next().unwrap_or("") {
            "sh" | "bash" => Lang::Sh,
            "console" => Lang::Console,
            "" => {
                if let Some((n, _)) = body.iter().find(|(_, l)| l.starts_with("$ ")) {
                    errors.push(format!(
                        "{doc}:{n}: a block without a language holds a `$ ` command: make it ```console (checked) or ```text"
                    ));
                }
                continue;
            }
            _ => continue,
        };
        let parse_only = start
            .checked_sub(1)
            .map(|p| lines[p].trim())
            .and_then(|p| p.strip_prefix(MARKER))
            .map(|r| r.trim_end_matches("-->").trim().to_owned());
        if parse_only.as_deref() == Some("") {
            errors.push(format!(
                "{doc}:{start}: `doc-test: parse-only` needs a reason"
            ));
        }
        out.push(Block {
            doc: doc.to_owned(),
            lang,
            parse_only,
            lines: body,
        });
    }
    out
}

/// The heredoc delimiter a line opens (`<<EOF`, `<<'EOF'`, `<<-"EOF"`), if any.
fn heredoc(line: &str) -> Option<String> {
    let at = line.find("<<")?;
    let rest = line[at + 2..].trim_start_matches('-').trim_start();
    let word: String = rest
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != ';' && *c != '|' && *c != '&')
        .filter(|c| *c != '\'' && *c != '"')
        .collect();
    (!word.is_empty()).then_some(word)
}

/// A block's commands.
fn commands(b: &Block) -> Vec<Cmd> {
    let mut out: Vec<Cmd> = Vec::new();
    let mut it = b.lines.iter().peekable();
    while let Some((n, l)) = it.next() {
        let l = match b.lang {
            Lang::Sh => l.as_str(),
            Lang::Console => match l.strip_prefix("$ ") {
                Some(c) => c,
                None => {
                    match out.last_mut().and_then(|c| c.shown.as_mut()) {
                        Some(shown) => shown.push(l.clone()),
                        None if l.trim().is_empty() => {}
                        None => panic!("{}:{n}: output before any `$ ` command", b.doc),
                    }
                    continue;
                }
            },
        };
        if l.trim().is_empty() || l.trim_start().starts_with('#') {
            continue;
        }
        let mut text = l.to_owned();
        while text.ends_with('\\') {
            let Some((_, next)) = it.next() else { break };
            text.pop();
            text.push(' ');
            text.push_str(next.trim_start());
        }
        let head = text.clone();
        if let Some(delim) = heredoc(&text) {
            for (_, next) in it.by_ref() {
                text.push('\n');
                text.push_str(next);
                if next.trim() == delim {
                    break;
                }
            }
        }
        out.push(Cmd {
            line: *n,
            text,
            head,
            shown: (b.lang == Lang::Console).then(Vec::new),
        });
    }
    // A console transcript's blank line before the next command is not output.
    for c in &mut out {
        if let Some(s) = &mut c.shown {
            while s.last().is_some_and(|l| l.trim().is_empty()) {
                s.pop();
            }
        }
    }
    out
}

/// Shell words and operators, enough for the docs' commands: quotes, backslashes, `$(…)`,
/// comments, redirections (dropped with their target) and `;`/`|`/`&`/`&&`/`||` (`None`).
fn words(s: &str) -> Vec<Option<String>> {
    let cs: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut drop_next = false;
    let mut i = 0;
    let flush = |cur: &mut String, in_word: &mut bool, drop_next: &mut bool, out: &mut Vec<_>| {
        if *in_word {
            if *drop_next {
                *drop_next = false;
            } else {
                out.push(Some(std::mem::take(cur)));
            }
            cur.clear();
            *in_word = false;
        }
    };
    while i < cs.len() {
        let c = cs[i];
        match c {
            ' ' | '\t' | '\n' => flush(&mut cur, &mut in_word, &mut drop_next, &mut out),
            '#' if !in_word => {
                while i < cs.len() && cs[i] != '\n' {
                    i += 1;
                }
            }
            '\'' => {
                in_word = true;
                i += 1;
                while i < cs.len() && cs[i] != '\'' {
                    cur.push(cs[i]);
                    i += 1;
                }
            }
            '"' => {
                in_word = true;
                i += 1;
                while i < cs.len() && cs[i] != '"' {
                    if cs[i] == '\\' && i + 1 < cs.len() {
                        i += 1;
                    }
                    cur.push(cs[i]);
                    i += 1;
                }
            }
            '\\' if i + 1 < cs.len() => {
                in_word = true;
                i += 1;
                cur.push(cs[i]);
            }
            '$' if cs.get(i + 1) == Some(&'(') => {
                in_word = true;
                let mut depth = 0;
                while i < cs.len() {
                    cur.push(cs[i]);
                    match cs[i] {
                        '(' => depth += 1,
                        ')' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
            }
            '>' | '<' => {
                // `2>`, `&>`: the fd belongs to the operator.
                if cur.chars().all(|c| c.is_ascii_digit() || c == '&') {
                    cur.clear();
                    in_word = false;
                }
                flush(&mut cur, &mut in_word, &mut drop_next, &mut out);
                while cs.get(i + 1).is_some_and(|c| *c == '>' || *c == '<') {
                    i += 1;
                }
                if cs.get(i + 1) == Some(&'&') {
                    // `2>&1`
                    i += 2;
                } else {
                    drop_next = true;
                }
            }
            ';' | '|' | '&' => {
                flush(&mut cur, &mut in_word, &mut drop_next, &mut out);
                if cs.get(i + 1) == Some(&c) {
                    i += 1;
                }
                out.push(None);
            }
            _ => {
                in_word = true;
                cur.push(c);
            }
        }
        i += 1;
    }
    flush(&mut cur, &mut in_word, &mut drop_next, &mut out);
    out
}

/// The argument lists of the `ipsan` invocations in one command line.
fn invocations(line: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for simple in words(line).split(|w| w.is_none()) {
        let ws: Vec<String> = simple.iter().flatten().cloned().collect();
        find_ipsan(&ws, &mut out);
    }
    out
}

fn find_ipsan(ws: &[String], out: &mut Vec<Vec<String>>) {
    let mut k = 0;
    // Environment assignments and wrappers before the command word.
    while k < ws.len() {
        let w = &ws[k];
        if (w.contains('=') && !w.starts_with('-') && !w.starts_with('='))
            || matches!(w.as_str(), "sudo" | "exec" | "time" | "env" | "nohup")
        {
            k += 1;
        } else if w == "timeout" {
            k += 2;
        } else {
            break;
        }
    }
    let Some(cmd) = ws.get(k) else { return };
    let args: &[String] = if cmd == "ipsan" || cmd.ends_with("/ipsan") {
        &ws[k + 1..]
    } else if cmd == "cargo" && ws.get(k + 1).is_some_and(|w| w == "run") {
        match ws.iter().position(|w| w == "--") {
            Some(p) => &ws[p + 1..],
            None => return,
        }
    } else {
        return;
    };
    out.push(args.to_vec());
    // `ipsan wan exec NS -- ipsan target …`: the inner one too.
    if let Some(p) = args.iter().position(|w| w == "--") {
        find_ipsan(&args[p + 1..], out);
    }
}

#[test]
fn reads_shell_words_like_the_shell_does() {
    assert_eq!(
        invocations("sudo ipsan tcp load   # registers ipsan_sf"),
        vec![vec!["tcp", "load"]]
    );
    assert_eq!(
        invocations("cargo run --release -- target --lun 'mem:1GiB' > log 2>&1 &"),
        vec![vec!["target", "--lun", "mem:1GiB"]]
    );
    assert_eq!(
        invocations("ipsan wan cut; sleep 3; ipsan wan restore"),
        vec![vec!["wan", "cut"], vec!["wan", "restore"]]
    );
    assert_eq!(
        invocations("ipsan wan exec tgt -- ipsan target --portal 10.231.0.2:3260"),
        vec![
            vec![
                "wan",
                "exec",
                "tgt",
                "--",
                "ipsan",
                "target",
                "--portal",
                "10.231.0.2:3260"
            ],
            vec!["target", "--portal", "10.231.0.2:3260"]
        ]
    );
    assert_eq!(
        invocations("install -m 0755 target/release/ipsan /usr/local/bin/ipsan"),
        Vec::<Vec<String>>::new()
    );
    assert_eq!(
        invocations("ipsan ctl status --control \"$IPSAN_CONTROL\" | head -3"),
        vec![vec!["ctl", "status", "--control", "$IPSAN_CONTROL"]]
    );
}

#[test]
fn rejects_an_unmarked_untagged_or_reasonless_block() {
    let mut errors = Vec::new();
    let doc = "x\n<!-- doc-test: parse-only: -->\n```sh\nipsan demo\n```\n```\n$ ipsan ctl status\n```\n<!-- doc-test: parse-only: why -->\n\n```sh\n```\n";
    let b = blocks("d.md", doc, &mut errors);
    assert_eq!(b.len(), 2);
    assert_eq!(errors.len(), 3, "{errors:#?}");
}

/// Asks the real parser about one invocation: `None` if clap accepts it, else its error.
fn clap_refuses(args: &[String]) -> Option<String> {
    let o = Command::new(BIN)
        .arg("--check-args")
        .args(args)
        .env_remove("IPSAN_CONTROL")
        .output()
        .unwrap();
    (!o.status.success()).then(|| {
        String::from_utf8_lossy(&o.stderr)
            .lines()
            .take(3)
            .collect::<Vec<_>>()
            .join(" / ")
    })
}

fn all_blocks() -> (Vec<Block>, Vec<String>) {
    let mut errors = Vec::new();
    let mut all = Vec::new();
    for path in documents() {
        let text = std::fs::read_to_string(&path).unwrap();
        let doc = path.strip_prefix(root()).unwrap().display().to_string();
        all.extend(blocks(&doc, &text, &mut errors));
    }
    (all, errors)
}

#[test]
fn every_ipsan_command_in_the_docs_parses() {
    let (all, mut errors) = all_blocks();
    let mut checked = 0;
    for b in &all {
        for c in commands(b) {
            for args in invocations(&c.head) {
                checked += 1;
                if let Some(e) = clap_refuses(&args) {
                    errors.push(format!(
                        "{}:{}: `ipsan {}`: {e}",
                        b.doc,
                        c.line,
                        args.join(" ")
                    ));
                }
            }
        }
    }
    println!("{checked} ipsan invocations parsed in {} blocks", all.len());
    assert!(
        checked > 20,
        "found only {checked} ipsan commands: is the extractor broken?"
    );
    assert!(
        errors.is_empty(),
        "{} problems:\n{}",
        errors.len(),
        errors.join("\n")
    );
}

/// Loose comparison of shown and printed output: digits and runs of blanks may differ.
fn shape(line: &str) -> String {
    let mut out = String::new();
    let mut last = ' ';
    for c in line.trim().chars() {
        let c = if c.is_ascii_digit() { '0' } else { c };
        if (c == '0' && last == '0') || (c.is_whitespace() && last.is_whitespace()) {
            continue;
        }
        out.push(if c.is_whitespace() { ' ' } else { c });
        last = c;
    }
    out
}

/// Whether a printed line is what the doc shows: compared by [`shape`], `…` in the shown line
/// standing for any text (a path, a date).
fn fits(shown: &str, printed: &str) -> bool {
    let have = shape(printed);
    let want = shape(shown);
    let parts: Vec<&str> = want.split('…').collect();
    if parts.len() == 1 {
        return want == have;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !have.starts_with(first) || !have[first.len()..].ends_with(last) {
        return false;
    }
    let mut rest = &have[first.len()..have.len() - last.len()];
    for p in &parts[1..parts.len() - 1] {
        match rest.find(p) {
            Some(at) => rest = &rest[at + p.len()..],
            None => return false,
        }
    }
    true
}

#[test]
fn compares_output_loosely_where_the_doc_says_so() {
    assert!(fits(
        "lun 1 null 107374182400 bytes",
        "lun 1   null      5 bytes"
    ));
    assert!(fits(
        "saved 270 bytes to …/ipsan.toml",
        "saved 301 bytes to /a/b/ipsan.toml"
    ));
    assert!(!fits(
        "saved 270 bytes to …/ipsan.toml",
        "saved 301 bytes to /a/b/other.toml"
    ));
    assert!(!fits("targets=1 luns=2", "targets=1 luns=2 sessions=0"));
    assert!(!fits("seal=allowed", "seal=required"));
}

/// The bash script running one document's run blocks (see the module docs).
fn script(cmds: &[(&Block, Cmd)]) -> String {
    let mut s = String::from(
        r#"set -e
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=0755 tmpfs /run
ip link set lo up
DOC_BG=
DOC_LINE=0
doc_end() {
    st=$?
    for p in $DOC_BG $(jobs -p); do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    [ "$st" -eq 0 ] || echo "doc-test: line $DOC_LINE failed (exit $st)" >&2
    exit "$st"
}
trap doc_end EXIT
doc_wait() {  # LOG PID: until the background command says it is listening
    for _ in $(seq 300); do
        grep -q "listening on" "$1" 2>/dev/null && return 0
        kill -0 "$2" 2>/dev/null || { echo "background command ended:" >&2; cat "$1" "$1.err" >&2; return 1; }
        sleep 0.1
    done
    echo "background command never said 'listening on'" >&2; return 1
}
"#,
    );
    for (b, c) in cmds {
        s.push_str(&format!("DOC_LINE='{}:{}'\n", b.doc, c.line));
        let t = c.text.trim_end();
        if c.shown.is_some() {
            s.push_str(&format!("{t} > .doc-out.{}\n", c.line));
        } else if let Some(bg) = without_comment(t)
            .trim_end()
            .strip_suffix('&')
            .filter(|x| !x.ends_with('&'))
        {
            s.push_str(&format!(
                "{bg} > .doc-bg.{n} 2> .doc-bg.{n}.err &\nDOC_BG=\"$DOC_BG $!\"\ndoc_wait .doc-bg.{n} $!\n",
                n = c.line
            ));
        } else {
            s.push_str(t);
            s.push('\n');
        }
    }
    s
}

/// A one-line command without its trailing `# comment` (quotes respected).
fn without_comment(line: &str) -> &str {
    let mut quote = None;
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), _) if c == q => quote = None,
            (None, '#') if prev.is_whitespace() => return &line[..i],
            _ => {}
        }
        prev = c;
    }
    line
}

#[test]
fn starts_a_command_ending_in_an_ampersand_in_the_background() {
    assert_eq!(
        without_comment("ipsan target &   # a 'LUN'"),
        "ipsan target &   "
    );
    assert_eq!(without_comment("echo 'a # b' # c"), "echo 'a # b' ");
    assert_eq!(without_comment("a#b"), "a#b");
}

#[test]
fn every_doc_block_not_marked_parse_only_runs_as_written() {
    let (all, errors) = all_blocks();
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    let bindir = Path::new(BIN).parent().unwrap().to_owned();
    let path = format!(
        "{}:{}",
        bindir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut docs: Vec<&str> = all.iter().map(|b| b.doc.as_str()).collect();
    docs.dedup();
    let mut failures = Vec::new();
    for doc in docs {
        let cmds: Vec<(&Block, Cmd)> = all
            .iter()
            .filter(|b| b.doc == doc && b.parse_only.is_none())
            .flat_map(|b| commands(b).into_iter().map(move |c| (b, c)))
            .collect();
        if cmds.is_empty() {
            continue;
        }
        // Outside /tmp: the script mounts its own /tmp.
        let work = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        std::fs::set_permissions(
            work.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        let sh = work.path().join(".doc-test.sh");
        std::fs::write(&sh, script(&cmds)).unwrap();
        let mut unshare = Command::new("unshare");
        // A pid namespace too: whatever the script leaves running dies with it.
        unshare.args([
            "--net",
            "--mount",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
        ]);
        if not_root() {
            unshare.arg("--map-root-user");
        }
        let started = Instant::now();
        let mut child = unshare
            .args(["bash"])
            .arg(&sh)
            .current_dir(work.path())
            .env("PATH", &path)
            .env_remove("IPSAN_CONTROL")
            .stdout(std::fs::File::create(work.path().join(".doc-test.out")).unwrap())
            .stderr(std::fs::File::create(work.path().join(".doc-test.err")).unwrap())
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break Some(st);
            }
            if started.elapsed() > RUN_LIMIT {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let out = std::fs::read_to_string(work.path().join(".doc-test.out")).unwrap_or_default();
        let err = std::fs::read_to_string(work.path().join(".doc-test.err")).unwrap_or_default();
        let err = format!("stdout:\n{out}\nstderr:\n{err}");
        println!(
            "{doc}: {} commands run in {:.1} s",
            cmds.len(),
            started.elapsed().as_secs_f64()
        );
        match status {
            None => failures.push(format!("{doc}: not done within {RUN_LIMIT:?}:\n{err}")),
            Some(st) if !st.success() => {
                failures.push(format!("{doc}: {st}:\n{err}"));
                continue;
            }
            Some(_) => {}
        }
        for (b, c) in &cmds {
            let Some(shown) = &c.shown else { continue };
            let got = std::fs::read_to_string(work.path().join(format!(".doc-out.{}", c.line)))
                .unwrap_or_default();
            let fits = shown.len() == got.lines().count()
                && shown.iter().zip(got.lines()).all(|(w, h)| fits(w, h));
            if !fits {
                failures.push(format!(
                    "{}:{}: `{}` printed\n{got}\nwhere the doc shows\n{}",
                    b.doc,
                    c.line,
                    c.text,
                    shown.join("\n")
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

fn not_root() -> bool {
    // `id -u` rather than libc: the root package's tests use no unsafe.
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() != "0")
}
