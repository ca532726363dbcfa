//! Test helpers: a tgtd instance on a private loopback port with a RAM-backed LUN, and a
//! scripted fake target for failure cases. Everything started here is killed on drop.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

pub mod wan;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::sync::Arc;

use bytes::Bytes;
use ipsan_bench::{self as bench, Limit, RwMode, Workload};
use ipsan_initiator::{IscsiUrl, LoginOptions, Negotiated, Session, SessionConfig};

pub const TGT_IQN: &str = "iqn.2026-11.org.ipsan:test-tgtd";

/// A free loopback TCP port (bound then released; tgtd binds it right after).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Options for the tgtd fixture.
#[derive(Default, Clone)]
pub struct TgtdOpts {
    pub size_mib: u64,
    /// (user, password) the initiator must use.
    pub chap: Option<(&'static str, &'static str)>,
    /// (user, password) the target answers mutual CHAP with.
    pub mutual: Option<(&'static str, &'static str)>,
    /// iSCSI target parameters set with `tgtadm --op update` (key, value).
    pub params: Vec<(&'static str, &'static str)>,
}

/// A running tgtd with one target and LUN 1 backed by a file in /dev/shm.
pub struct Tgtd {
    child: Child,
    pub port: u16,
    ctl: u16,
    image: std::path::PathBuf,
}

fn tgtadm(ctl: u16, args: &[&str]) -> Result<(), String> {
    let out = Command::new("tgtadm")
        .arg("-C")
        .arg(ctl.to_string())
        .args(["--lld", "iscsi"])
        .args(args)
        .output()
        .map_err(|e| format!("tgtadm: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "tgtadm {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

impl Tgtd {
    pub fn start(opts: TgtdOpts) -> Self {
        let port = free_port();
        // tgtd's control socket is /var/run/tgtd/socket.<ctl>; derive it from the port so
        // parallel tests never share one.
        let ctl = 10_000 + port % 20_000;
        let image = std::path::PathBuf::from(format!("/dev/shm/ipsan-initiator-test-{port}.img"));
        let f = std::fs::File::create(&image).unwrap();
        f.set_len(opts.size_mib.max(16) << 20).unwrap();
        drop(f);
        let child = Command::new("tgtd")
            .args(["-f", "-C", &ctl.to_string(), "--iscsi"])
            .arg(format!("portal=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tgtd must be installed (Debian package `tgt`)");
        let mut t = Tgtd {
            child,
            port,
            ctl,
            image,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match tgtadm(
                ctl,
                &[
                    "--mode",
                    "target",
                    "--op",
                    "new",
                    "--tid",
                    "1",
                    "--targetname",
                    TGT_IQN,
                ],
            ) {
                Ok(()) => break,
                Err(e) if Instant::now() > deadline => panic!("tgtd did not come up: {e}"),
                Err(_) if t.child.try_wait().ok().flatten().is_some() => {
                    // Lost a race for the port or control socket: try another.
                    return Self::start(opts);
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        let img = t.image.display().to_string();
        tgtadm(
            ctl,
            &[
                "--mode",
                "logicalunit",
                "--op",
                "new",
                "--tid",
                "1",
                "--lun",
                "1",
                "--backing-store",
                &img,
            ],
        )
        .unwrap();
        tgtadm(
            ctl,
            &[
                "--mode",
                "target",
                "--op",
                "bind",
                "--tid",
                "1",
                "--initiator-address",
                "ALL",
            ],
        )
        .unwrap();
        if let Some((u, p)) = opts.chap {
            tgtadm(
                ctl,
                &[
                    "--mode",
                    "account",
                    "--op",
                    "new",
                    "--user",
                    u,
                    "--password",
                    p,
                ],
            )
            .unwrap();
            tgtadm(
                ctl,
                &[
                    "--mode", "account", "--op", "bind", "--tid", "1", "--user", u,
                ],
            )
            .unwrap();
        }
        if let Some((u, p)) = opts.mutual {
            tgtadm(
                ctl,
                &[
                    "--mode",
                    "account",
                    "--op",
                    "new",
                    "--user",
                    u,
                    "--password",
                    p,
                ],
            )
            .unwrap();
            tgtadm(
                ctl,
                &[
                    "--mode",
                    "account",
                    "--op",
                    "bind",
                    "--tid",
                    "1",
                    "--user",
                    u,
                    "--outgoing",
                ],
            )
            .unwrap();
        }
        for (k, v) in &opts.params {
            tgtadm(
                ctl,
                &[
                    "--mode", "target", "--op", "update", "--tid", "1", "-n", k, "-v", v,
                ],
            )
            .unwrap();
        }
        // Wait for the portal to accept connections.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "tgtd portal never opened");
            std::thread::sleep(Duration::from_millis(50));
        }
        t.port = port;
        t
    }

    pub fn url(&self) -> IscsiUrl {
        IscsiUrl::parse(&format!("iscsi://127.0.0.1:{}/{TGT_IQN}/1", self.port)).unwrap()
    }

    pub fn url_with_user(&self, user: &str, password: &str) -> IscsiUrl {
        IscsiUrl::parse(&format!(
            "iscsi://{user}%{password}@127.0.0.1:{}/{TGT_IQN}/1",
            self.port
        ))
        .unwrap()
    }
}

impl Tgtd {
    /// Kill tgtd now (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Tgtd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.image);
        let _ = std::fs::remove_file(format!("/var/run/tgtd/socket.{}", self.ctl));
        let _ = std::fs::remove_file(format!("/var/run/tgtd/socket.{}.lock", self.ctl));
    }
}

pub fn config(login: LoginOptions) -> SessionConfig {
    SessionConfig {
        login,
        connect_timeout: Duration::from_secs(5),
        login_timeout: Duration::from_secs(10),
        nop_interval: Some(Duration::from_secs(2)),
        nop_timeout: Duration::from_secs(5),
        ..SessionConfig::default()
    }
}

/// Run an async test body with a hard time bound.
pub fn bounded<F: std::future::Future<Output = ()>>(secs: u64, f: F) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(secs), f)
            .await
            .expect("test exceeded its time bound");
    });
}

/// Write, read and mixed runs with `--verify` at several block sizes and depths, then proof
/// that a corrupted block is caught with its LBA.
pub async fn round_trip(url: IscsiUrl, login: LoginOptions, check: impl Fn(&Negotiated)) {
    {
        let s = Arc::new(Session::open(&url, &config(login)).await.unwrap());
        check(s.params());
        let mut seed = 1;
        for (bs, depth) in [
            (512u64, 1usize),
            (4096, 4),
            (65536, 16),
            (1 << 20, 8),
            (3 << 19, 3),
        ] {
            seed += 1;
            for mode in [RwMode::Write, RwMode::Read, RwMode::RandRw] {
                let w = Workload {
                    mode,
                    mix_read_percent: 50,
                    block_size: bs,
                    depth,
                    offset: 4096,
                    limit: Limit::Bytes((bs * 64).min(8 << 20)),
                    verify: true,
                    seed,
                    data: None,
                    rate: None,
                    sink: Default::default(),
                };
                let m = bench::run(s.clone(), w, None)
                    .await
                    .unwrap_or_else(|e| panic!("bs={bs} depth={depth} {mode:?}: {e}"));
                assert!(
                    m.verify.checked_blocks > 0,
                    "bs={bs} {mode:?} verified nothing"
                );
            }
        }
        // Corruption is caught: overwrite one block inside the verified region, read back.
        let lba = 4096 / 512 + 3;
        s.write(lba, Bytes::from(vec![0xeeu8; 512])).await.unwrap();
        let w = Workload {
            mode: RwMode::Read,
            mix_read_percent: 100,
            block_size: 3 << 19,
            depth: 2,
            offset: 4096,
            limit: Limit::Bytes(3 << 19),
            verify: true,
            seed,
            data: None,
            rate: None,
            sink: Default::default(),
        };
        match bench::run(s.clone(), w, None).await {
            Err(bench::BenchError::Verify { lba: bad, .. }) => assert_eq!(bad, lba),
            other => panic!("corruption not caught: {other:?}"),
        }
    }
}

/// The ipsan target in-process on 127.0.0.1:0: target `iqn` with one 32 MiB RAM LUN, Seal
/// `policy` with `secret` for every initiator, 2 crypto workers, and Seal's counter limit
/// lowered to `counter_limit` if given.
pub async fn seal_target(
    iqn: &str,
    secret: &[u8],
    policy: ipsan_seal::SealPolicy,
    counter_limit: Option<u64>,
) -> ipsan_target::ServerHandle {
    use ipsan_target::config::{self as tconfig, Config, SealSettings, TargetConfig};
    let mut t = TargetConfig::new(
        iqn,
        tconfig::luns_from_specs(&["mem:32MiB".to_owned()]).unwrap(),
    );
    t.seal = SealSettings {
        policy,
        secret: Some(ipsan_seal::Psk::new(secret.to_vec()).unwrap()),
        initiators: Vec::new(),
    };
    let mut c = Config {
        portals: vec!["127.0.0.1:0".parse().unwrap()],
        crypto_workers: 2,
        targets: vec![t],
        ..Config::default()
    };
    c.limits.seal_counter_limit = counter_limit;
    c.validate().unwrap();
    ipsan_target::ServerHandle::start(&c).await.unwrap()
}

/// The ipsan target in-process with an NVMe/TCP listener, both on 127.0.0.1:0: target `iqn`
/// with one LUN of `lun` (a backend spec, `mem:16MiB`), served as a namespace too.
pub async fn nvme_target(iqn: &str, lun: &str) -> ipsan_target::ServerHandle {
    nvme_target_with(iqn, lun, None).await
}

/// [`nvme_target`] with the I/O queues' in-capsule data size set (`None`: the default).
pub async fn nvme_target_with(
    iqn: &str,
    lun: &str,
    in_capsule: Option<u32>,
) -> ipsan_target::ServerHandle {
    use ipsan_target::config::{self as tconfig, Config, TargetConfig};
    let mut c = Config {
        portals: vec!["127.0.0.1:0".parse().unwrap()],
        targets: vec![TargetConfig::new(
            iqn,
            tconfig::luns_from_specs(&[lun.to_owned()]).unwrap(),
        )],
        ..Config::default()
    };
    c.nvme.listen = vec!["127.0.0.1:0".parse().unwrap()];
    if let Some(n) = in_capsule {
        c.nvme.in_capsule_data = n;
    }
    c.validate().unwrap();
    ipsan_target::ServerHandle::start(&c).await.unwrap()
}

/// Seal for one `cipher` with the pre-shared `secret` and a crypto pool of one worker.
pub fn seal_request(
    cipher: ipsan_seal::Cipher,
    secret: &[u8],
) -> ipsan_initiator::seal::SealRequest {
    ipsan_initiator::seal::SealRequest {
        ciphers: vec![cipher],
        chunk: ipsan_seal::DEFAULT_CHUNK,
        psk: ipsan_seal::Psk::new(secret.to_vec()).unwrap(),
        pool: Some(Arc::new(ipsan_seal::CryptoPool::new(1).unwrap())),
    }
}

/// [`config`] with the default login, sealed with [`seal_request`].
pub fn sealed_config(cipher: ipsan_seal::Cipher, secret: &[u8]) -> SessionConfig {
    SessionConfig {
        extension: Some(seal_request(cipher, secret).factory()),
        ..config(LoginOptions::default())
    }
}
