//! The real target, on a loopback port 0, driven by real initiators: libiscsi's command-line
//! tools (Debian `libiscsi-bin`) and `qemu-img` over `iscsi://` (Debian `qemu-block-extra`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use ipsan_target::config::{self, Config, TargetConfig};
use ipsan_target::ServerHandle;

fn tool(name: &str) -> Command {
    assert!(
        Command::new("sh").args(["-c", &format!("command -v {name}")]).output().unwrap().status.success(),
        "{name} is required for this test (apt-get install libiscsi-bin qemu-utils qemu-block-extra)"
    );
    Command::new(name)
}

/// Runs a command with a time limit so a hung peer fails the test instead of the suite.
async fn run(mut cmd: Command) -> Output {
    tokio::task::spawn_blocking(move || {
        let mut child = cmd
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if child.try_wait().unwrap().is_some() {
                return child.wait_with_output().unwrap();
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("command timed out: {cmd:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await
    .unwrap()
}

fn target(iqn: &str, luns: &[&str]) -> TargetConfig {
    let specs: Vec<String> = luns.iter().map(|s| (*s).to_owned()).collect();
    TargetConfig {
        iqn: iqn.into(),
        alias: None,
        allow: Vec::new(),
        chap: None,
        chap_hosts: Vec::new(),
        seal: Default::default(),
        luns: config::luns_from_specs(&specs).unwrap(),
    }
}

async fn start(targets: Vec<TargetConfig>) -> ServerHandle {
    let mut c = Config {
        portals: vec!["127.0.0.1:0".parse().unwrap()],
        targets,
        ..Config::default()
    };
    c.validate().unwrap();
    ServerHandle::start(&c).await.unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libiscsi_tools_discover_inquire_and_size_the_lun() {
    let t = start(vec![
        target("iqn.2026-11.org.ipsan:a", &["mem:64MiB", "null:1TiB"]),
        target("iqn.2026-11.org.ipsan:b", &["mem:8MiB"]),
    ])
    .await;
    let addr = t.addrs[0];

    let mut ls = tool("iscsi-ls");
    ls.args(["-s", &format!("iscsi://{addr}")]);
    let o = run(ls).await;
    let out = stdout(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("Target:iqn.2026-11.org.ipsan:a"), "{out}");
    assert!(out.contains("Target:iqn.2026-11.org.ipsan:b"), "{out}");
    assert!(out.contains(&format!("Portal:{addr},1")), "{out}");
    assert!(out.contains("Lun:1"), "second LUN listed: {out}");

    let mut inq = tool("iscsi-inq");
    inq.arg(format!("iscsi://{addr}/iqn.2026-11.org.ipsan:a/0"));
    let o = run(inq).await;
    let out = stdout(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("Vendor:IPSAN"), "{out}");

    let mut cap = tool("iscsi-readcapacity16");
    cap.arg(format!("iscsi://{addr}/iqn.2026-11.org.ipsan:a/1"));
    let o = run(cap).await;
    let out = stdout(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains(&format!("Total size:{}", 1u64 << 40)), "{out}");

    // A target name that does not exist: login must fail, and the target keeps serving.
    let mut bad = tool("iscsi-inq");
    bad.arg(format!("iscsi://{addr}/iqn.2026-11.org.ipsan:nope/0"));
    assert!(!run(bad).await.status.success());
    let mut again = tool("iscsi-inq");
    again.arg(format!("iscsi://{addr}/iqn.2026-11.org.ipsan:b/0"));
    assert!(run(again).await.status.success());

    t.shutdown().await.unwrap();
}

fn sha256(path: &Path) -> String {
    let o = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_img_writes_random_image_and_reads_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    let spec = format!("file:{},size=32MiB", disk.display());
    let t = start(vec![target("iqn.2026-11.org.ipsan:qemu", &[&spec])]).await;
    let addr = t.addrs[0];
    let url = format!("iscsi://{addr}/iqn.2026-11.org.ipsan:qemu/0");

    // 32 MiB of random bytes: exactly the LUN's size.
    let src = dir.path().join("src.img");
    let mut data = vec![0u8; 32 << 20];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for chunk in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    std::fs::write(&src, &data).unwrap();

    let mut w = tool("qemu-img");
    w.args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&src)
        .arg(&url);
    let o = run(w).await;
    assert!(o.status.success(), "qemu-img write: {}", stdout(&o));

    let back = dir.path().join("back.img");
    let mut r = tool("qemu-img");
    r.args(["convert", "-f", "raw", "-O", "raw"])
        .arg(&url)
        .arg(&back);
    let o = run(r).await;
    assert!(o.status.success(), "qemu-img read: {}", stdout(&o));
    assert_eq!(
        sha256(&back),
        sha256(&src),
        "read-back differs from what was written"
    );

    // Graceful shutdown flushes the backend: the file itself holds the image.
    t.shutdown().await.unwrap();
    assert_eq!(
        sha256(&disk),
        sha256(&src),
        "backing file differs after shutdown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chap_admits_the_right_secret_and_refuses_a_wrong_one() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "correct-horse-battery").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let mut tc = target("iqn.2026-11.org.ipsan:chap", &["mem:8MiB"]);
    let mut chap = config::chap_from_flags("alice", &secret, None).unwrap();
    // libiscsi 1.19 offers CHAP_A=5 only: MD5 is opted in explicitly (off by default).
    chap.algorithms.push(iscsi_proto::chap::ChapAlgorithm::MD5);
    tc.chap = Some(chap);
    let t = start(vec![tc]).await;
    let addr = t.addrs[0];

    let mut ok = tool("iscsi-inq");
    ok.arg(format!(
        "iscsi://alice%correct-horse-battery@{addr}/iqn.2026-11.org.ipsan:chap/0"
    ));
    let o = run(ok).await;
    assert!(o.status.success(), "right secret refused: {}", stdout(&o));

    let mut wrong = tool("iscsi-inq");
    wrong.arg(format!(
        "iscsi://alice%wrong-horse-battery@{addr}/iqn.2026-11.org.ipsan:chap/0"
    ));
    assert!(!run(wrong).await.status.success(), "wrong secret admitted");

    let mut none = tool("iscsi-inq");
    none.arg(format!("iscsi://{addr}/iqn.2026-11.org.ipsan:chap/0"));
    assert!(!run(none).await.status.success(), "no credentials admitted");

    t.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_refuses_initiators_not_on_the_list() {
    let mut tc = target("iqn.2026-11.org.ipsan:acl", &["mem:8MiB"]);
    tc.allow = vec!["iqn.2026-11.org.example:allowed*".into()];
    let t = start(vec![tc]).await;
    let addr = t.addrs[0];
    let url = format!("iscsi://{addr}/iqn.2026-11.org.ipsan:acl/0");

    let mut ok = tool("iscsi-inq");
    ok.args(["-i", "iqn.2026-11.org.example:allowed-1", &url]);
    let o = run(ok).await;
    assert!(
        o.status.success(),
        "allowed initiator refused: {}",
        stdout(&o)
    );

    let mut no = tool("iscsi-inq");
    no.args(["-i", "iqn.2026-11.org.example:other", &url]);
    assert!(
        !run(no).await.status.success(),
        "initiator off the allow-list admitted"
    );
    t.shutdown().await.unwrap();
}
