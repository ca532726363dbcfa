//! Issue 32, "docs that work when followed literally": `ipsan ctl` and the help texts as
//! docs/operate.md and docs/gateway.md use them, against the real `ipsan target` on loopback
//! (ports picked by the kernel, control sockets in temp dirs, every process killed on drop).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{spawn_ipsan, Proc, BIN};

/// A target with one RAM LUN and a control socket at `<dir>/run/control.sock`.
fn target(dir: &Path, extra: &[&str]) -> (Proc, PathBuf) {
    let sock = dir.join("run").join("control.sock");
    let mut args = vec![
        "target",
        "--portal",
        "127.0.0.1:0",
        "--lun",
        "mem:16MiB",
        "--control",
        sock.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let (p, _) = spawn_ipsan(&args, &dir.join("target.log"));
    (p, sock)
}

fn ipsan(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("IPSAN_CONTROL")
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> String {
    let o = ipsan(args);
    assert!(
        o.status.success(),
        "ipsan {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn accepts_control_and_json_after_the_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let (_t, sock) = target(dir.path(), &[]);
    let s = sock.to_str().unwrap();
    // Both positions, as docs/operate.md writes them.
    ok(&["ctl", "status", "--control", s]);
    ok(&["ctl", "--control", s, "status"]);
    let after: serde_json::Value =
        serde_json::from_str(&ok(&["ctl", "targets", "--json", "--control", s])).unwrap();
    let before: serde_json::Value =
        serde_json::from_str(&ok(&["ctl", "--json", "--control", s, "targets"])).unwrap();
    assert_eq!(after, before);
    assert_eq!(after.as_array().unwrap().len(), 1, "{after}");
    // $IPSAN_CONTROL as well.
    let o = Command::new(BIN)
        .args(["ctl", "portals"])
        .env("IPSAN_CONTROL", s)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn prints_status_portals_and_save_as_text_unless_json_is_asked() {
    let dir = tempfile::tempdir().unwrap();
    let (_t, sock) = target(dir.path(), &[]);
    let s = sock.to_str().unwrap();
    let status = ok(&["ctl", "status", "--control", s]);
    assert!(!status.trim_start().starts_with('{'), "{status}");
    assert!(status.contains("portals: 127.0.0.1:"), "{status}");
    assert!(status.contains("targets=1 luns=1 sessions=0"), "{status}");
    let portals = ok(&["ctl", "portals", "--control", s]);
    assert!(portals.starts_with("127.0.0.1:"), "{portals}");
    assert_eq!(portals.lines().count(), 1, "{portals}");
    let json: serde_json::Value =
        serde_json::from_str(&ok(&["ctl", "portals", "--json", "--control", s])).unwrap();
    assert_eq!(json.as_array().unwrap()[0].as_str(), portals.lines().next());

    // `save` reports the bytes it wrote: the file's length, header line included.
    let saved = dir.path().join("saved.toml");
    let out = ok(&["ctl", "save", saved.to_str().unwrap(), "--control", s]);
    let len = std::fs::metadata(&saved).unwrap().len();
    assert_eq!(
        out.trim(),
        format!("saved {len} bytes to {}", saved.display()),
        "{out}"
    );
    let json: serde_json::Value = serde_json::from_str(&ok(&[
        "ctl",
        "save",
        saved.to_str().unwrap(),
        "--json",
        "--control",
        s,
    ]))
    .unwrap();
    assert_eq!(json["bytes"].as_u64(), Some(len));
}

#[test]
fn names_the_socket_and_how_to_choose_it_when_none_is_there() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nothing.sock");
    let o = ipsan(&["ctl", "targets", "--control", missing.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(missing.to_str().unwrap()), "{err}");
    assert!(err.contains("--control"), "{err}");
    assert!(err.contains("$IPSAN_CONTROL"), "{err}");
}

#[test]
fn rejects_a_control_socket_directory_open_to_others_and_creates_a_missing_one_0700() {
    let dir = tempfile::tempdir().unwrap();
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    let sock = open.join("control.sock");
    let log = dir.path().join("refused.log");
    let mut child = Proc(
        Command::new(BIN)
            .args(["target", "--portal", "127.0.0.1:0", "--lun", "mem:1MiB"])
            .arg("--control")
            .arg(&sock)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    // Refused at start: it must exit, and not successfully (bounded: a target that accepted
    // the directory would serve until killed).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(st) = child.0.try_wait().unwrap() {
            break st;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a 0755 socket directory was accepted: the target is serving"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(!status.success());
    let err = std::fs::read_to_string(&log).unwrap();
    assert!(
        err.contains("mode 0755") && err.contains("chmod 700"),
        "{err}"
    );
    assert!(!sock.exists());
    // Left as it was: not ours to chmod.
    let mode = std::fs::metadata(&open).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o755);

    let (_t, sock) = target(dir.path(), &[]);
    let mode = std::fs::metadata(sock.parent().unwrap())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o700);
}

fn scrape(addr: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn counts_config_changes_by_result() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics = format!("127.0.0.1:{port}");
    let (_t, sock) = target(dir.path(), &["--metrics", &metrics]);
    let s = sock.to_str().unwrap();
    let iqn = "iqn.2026-11.org.ipsan:disk0";
    ok(&[
        "ctl",
        "lun",
        "add",
        "--target",
        iqn,
        "mem:1MiB",
        "--control",
        s,
    ]);
    // Invalid: LUN 0 exists. Refused: shrinking is not done online.
    assert!(!ipsan(&[
        "ctl",
        "lun",
        "add",
        "--target",
        iqn,
        "mem:1MiB",
        "--id",
        "0",
        "--control",
        s
    ])
    .status
    .success());
    assert!(!ipsan(&[
        "ctl",
        "lun",
        "resize",
        "--target",
        iqn,
        "1",
        "512KiB",
        "--control",
        s
    ])
    .status
    .success());
    let text = scrape(&metrics);
    for (result, n) in [("applied", 1), ("invalid", 1), ("refused", 1)] {
        let line = format!("ipsan_config_changes_total{{result=\"{result}\"}} {n}");
        assert!(text.contains(&line), "no `{line}` in:\n{text}");
    }
}

#[test]
fn gateway_help_names_the_seal_policies_docs_gateway_uses() {
    for flag in ["-h", "--help"] {
        let help = ok(&["gateway", flag]);
        let seal = help
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("--seal <"))
            .take(3)
            .collect::<Vec<_>>()
            .join(" ");
        for word in ["aes-256-gcm", "off", "allowed", "required"] {
            assert!(
                seal.contains(word),
                "{flag}: --seal help lacks {word}: {seal}"
            );
        }
    }
}

#[test]
fn lab_run_help_names_every_builtin_plan() {
    let help = ok(&["lab", "run", "--help"]);
    for plan in ipsan_lab::plan::BUILTIN {
        assert!(
            help.contains(plan),
            "lab run --help lacks plan {plan}:\n{help}"
        );
    }
}
