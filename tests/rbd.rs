//! RBD LUNs against a real Ceph (issue 16): a one-node cluster from `scripts/ceph-cluster`,
//! started per test on its own port and always torn down (a guard runs `down` even when the
//! test panics). Needs the Debian packages ceph-mon ceph-osd ceph-common (and libiscsi-bin,
//! qemu-utils, qemu-block-extra): a machine without them fails here, loudly, as the libiscsi
//! and tgtd tests do — `scripts/install-deps` installs them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ipsan_initiator::{DataDir, Error, IscsiUrl, Session, SessionConfig};
use ipsan_target::config::{self, Config, TargetConfig};
use ipsan_target::ServerHandle;

/// One cluster at a time: each is a mon and an OSD, and the machine has two cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn require(tool: &str) {
    let ok = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .unwrap()
        .status
        .success();
    assert!(
        ok,
        "{tool} is required for the RBD tests (scripts/install-deps: ceph-mon ceph-osd ceph-common libiscsi-bin qemu-utils qemu-block-extra)"
    );
}

/// Runs `cmd` with a time limit; panics on timeout.
fn run_for(mut cmd: Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("command timed out after {limit:?}: {cmd:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ok(o: &Output) -> String {
    let text =
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{text}");
    text
}

/// A running one-node cluster; `down` on drop.
struct Ceph {
    dir: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Ceph {
    fn up() -> Ceph {
        for t in ["ceph-mon", "ceph-osd", "ceph", "rbd"] {
            require(t);
        }
        let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
        let dir = tmp.path().join("ceph");
        let c = Ceph { dir, _tmp: tmp };
        let mut cmd = Command::new(repo().join("scripts/ceph-cluster"));
        cmd.arg("up").arg(&c.dir).env("CEPH_OSD_SIZE", "4G");
        ok(&run_for(cmd, Duration::from_secs(180)));
        c
    }

    fn conf(&self) -> PathBuf {
        self.dir.join("ceph.conf")
    }

    fn cli(&self, tool: &str, args: &[&str]) -> String {
        let mut cmd = Command::new(tool);
        cmd.arg("-c").arg(self.conf()).args(args);
        ok(&run_for(cmd, Duration::from_secs(60)))
    }

    fn rbd(&self, args: &[&str]) -> String {
        self.cli("rbd", args)
    }

    fn script(&self, what: &str) {
        let mut cmd = Command::new(repo().join("scripts/ceph-cluster"));
        cmd.arg(what).arg(&self.dir);
        ok(&run_for(cmd, Duration::from_secs(180)));
    }

    /// An `rbd:` LUN spec with short timeouts, so an unreachable cluster shows in seconds.
    fn lun(&self, image: &str) -> String {
        format!(
            "rbd:rbd/{image},conf={},rados_osd_op_timeout=5,rados_mon_op_timeout=5,client_mount_timeout=10",
            self.conf().display()
        )
    }
}

impl Drop for Ceph {
    fn drop(&mut self) {
        let mut cmd = Command::new(repo().join("scripts/ceph-cluster"));
        cmd.arg("down").arg(&self.dir);
        let _ = run_for(cmd, Duration::from_secs(60));
    }
}

async fn start(iqn: &str, luns: &[String], relative_port_id: u16) -> ServerHandle {
    let mut c = Config {
        portals: vec!["127.0.0.1:0".parse().unwrap()],
        targets: vec![TargetConfig::new(
            iqn,
            config::luns_from_specs(luns).unwrap(),
        )],
        relative_port_id,
        ..Config::default()
    };
    c.validate().unwrap();
    ServerHandle::start(&c).await.unwrap()
}

async fn session(t: &ServerHandle, lun: u64) -> Session {
    session_as(t, lun, None).await
}

/// A session from initiator `name` (default: the initiator's own).
async fn session_as(t: &ServerHandle, lun: u64, name: Option<&str>) -> Session {
    let url = IscsiUrl::parse(&t.urls[lun as usize]).unwrap();
    let mut cfg = SessionConfig {
        command_timeout: Some(Duration::from_secs(60)),
        ..SessionConfig::default()
    };
    if let Some(n) = name {
        cfg.login.initiator_name = n.to_owned();
    }
    let s = Session::open(&url, &cfg).await.unwrap();
    // Consume the first command's unit attentions, if any.
    for _ in 0..4 {
        if s.command(tur(), DataDir::None).await.is_ok() {
            break;
        }
    }
    s
}

fn tur() -> [u8; 16] {
    [0; 16]
}

fn pattern(seed: u64, len: usize) -> Bytes {
    let mut v = vec![0u8; len];
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for b in v.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    Bytes::from(v)
}

fn sense_of(e: &Error) -> (u8, u8, u8) {
    let s = e.sense().unwrap_or_else(|| panic!("no sense in {e}"));
    (s.key.0, s.asc, s.ascq)
}

/// INQUIRY VPD page `page`.
async fn vpd(s: &Session, page: u8) -> Vec<u8> {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x12;
    cdb[1] = 1;
    cdb[2] = page;
    cdb[4] = 255;
    let c = s
        .command(cdb, DataDir::Read(bytes::BytesMut::new(), 255))
        .await
        .unwrap();
    c.data.to_vec()
}

/// The designators of VPD 83h: (type, identifier bytes).
fn designators(page: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 4;
    while at + 4 <= page.len() {
        let len = page[at + 3] as usize;
        out.push((page[at + 1] & 0x0F, page[at + 4..at + 4 + len].to_vec()));
        at += 4 + len;
    }
    out
}

fn sha256(path: &Path) -> String {
    let o = ok(&run_for(
        {
            let mut c = Command::new("sha256sum");
            c.arg(path);
            c
        },
        Duration::from_secs(60),
    ));
    o.split_whitespace().next().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_targets_serve_one_image_with_one_identity_and_rbd_export_agrees() {
    let _g = SERIAL.lock().await;
    let ceph = Ceph::up();
    ceph.rbd(&["create", "rbd/shared", "--size", "64M"]);
    let a = start("iqn.2026-11.org.ipsan:a", &[ceph.lun("shared")], 1).await;
    let b = start("iqn.2026-11.org.ipsan:b", &[ceph.lun("shared")], 2).await;
    let sa = session(&a, 0).await;
    let sb = session(&b, 0).await;
    assert_eq!(sa.read_capacity().await.unwrap().blocks, (64 << 20) / 512);

    // Written through A (several objects, one unaligned tail), read back through B.
    let data = pattern(1, 9 << 20);
    sa.write(2048, data.clone()).await.unwrap();
    sa.sync_cache().await.unwrap();
    let back = sb.read(2048, (data.len() / 512) as u32).await.unwrap();
    assert!(back[..] == data[..], "B read different data than A wrote");

    // And through librbd directly.
    let out = ceph.dir.join("export.img");
    ceph.rbd(&["export", "rbd/shared", out.to_str().unwrap()]);
    let img = std::fs::read(&out).unwrap();
    assert_eq!(img.len(), 64 << 20);
    assert!(img[2048 * 512..2048 * 512 + data.len()] == data[..]);
    assert!(img[..2048 * 512].iter().all(|&x| x == 0));

    // One device (same serial and NAA designator), two relative ports.
    let (va, vb) = (vpd(&sa, 0x83).await, vpd(&sb, 0x83).await);
    let (da, db) = (designators(&va), designators(&vb));
    let naa = |d: &[(u8, Vec<u8>)]| d.iter().find(|x| x.0 == 3).unwrap().1.clone();
    let rel = |d: &[(u8, Vec<u8>)]| d.iter().find(|x| x.0 == 4).unwrap().1.clone();
    assert_eq!(naa(&da), naa(&db), "one image must be one device");
    assert_eq!(rel(&da), vec![0, 0, 0, 1]);
    assert_eq!(rel(&db), vec![0, 0, 0, 2]);
    assert_eq!(
        vpd(&sa, 0x80).await,
        vpd(&sb, 0x80).await,
        "same unit serial"
    );

    // Block limits: the 4 MiB object is the optimal transfer granularity (in blocks).
    let bl = vpd(&sa, 0xB0).await;
    assert_eq!(
        u32::from(u16::from_be_bytes([bl[6], bl[7]])),
        (4u32 << 20) / 512
    );

    // COMPARE AND WRITE: atomic in the OSD; a miscompare names the first differing byte.
    let mut caw = [0u8; 16];
    caw[0] = 0x89;
    caw[2..10].copy_from_slice(&2049u64.to_be_bytes());
    caw[13] = 1;
    let cur = sb.read(2049, 1).await.unwrap();
    let mut wrong = cur.to_vec();
    wrong[100] ^= 0xFF;
    let mut payload = wrong.clone();
    payload.extend_from_slice(&[0xCD; 512]);
    let e = sb
        .command(caw, DataDir::Write(Bytes::from(payload)))
        .await
        .unwrap_err();
    let s = e.sense().unwrap();
    assert_eq!((s.key.0, s.asc, s.ascq), (0x0E, 0x1D, 0x00), "{e}");
    assert_eq!(s.information, Some(100), "miscompare offset");
    let mut payload = cur.to_vec();
    payload.extend_from_slice(&[0xCD; 512]);
    sb.command(caw, DataDir::Write(Bytes::from(payload)))
        .await
        .unwrap();
    let mut caw2 = caw;
    caw2[13] = 2;
    let e = sb
        .command(caw2, DataDir::Write(Bytes::from(vec![0u8; 2048])))
        .await
        .unwrap_err();
    assert_eq!(
        sense_of(&e),
        (0x05, 0x24, 0x00),
        "2-block COMPARE AND WRITE: {e}"
    );
    assert!(sa.read(2049, 1).await.unwrap().iter().all(|&x| x == 0xCD));

    // UNMAP: reads return zeros afterwards (LBPRZ), seen from the other target too.
    let mut unmap = [0u8; 16];
    unmap[0] = 0x42;
    unmap[8] = 24;
    let mut list = vec![0u8; 24];
    list[1] = 22;
    list[3] = 16;
    list[8..16].copy_from_slice(&2048u64.to_be_bytes());
    list[16..20].copy_from_slice(&8193u32.to_be_bytes());
    sa.command(unmap, DataDir::Write(Bytes::from(list)))
        .await
        .unwrap();
    let z = sb.read(2048, 8193).await.unwrap();
    assert!(z.iter().all(|&x| x == 0), "unmapped range must read zeros");
    assert!(sb.read(2048 + 8193, 8).await.unwrap()[..] == data[8193 * 512..8201 * 512]);

    let _ = sa.logout().await;
    let _ = sb.logout().await;
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_img_convert_round_trips_through_an_rbd_lun() {
    let _g = SERIAL.lock().await;
    require("qemu-img");
    let ceph = Ceph::up();
    ceph.rbd(&["create", "rbd/qemu", "--size", "32M"]);
    let t = start("iqn.2026-11.org.ipsan:qemu", &[ceph.lun("qemu")], 1).await;
    let url = t.urls[0].clone();
    let src = ceph.dir.join("src.img");
    std::fs::write(&src, pattern(7, 32 << 20)).unwrap();
    let back = ceph.dir.join("back.img");
    let exported = ceph.dir.join("exported.img");
    let (s, u, bk) = (src.clone(), url.clone(), back.clone());
    tokio::task::spawn_blocking(move || {
        let mut c = Command::new("qemu-img");
        c.args(["convert", "-n", "-f", "raw", "-O", "raw"])
            .arg(&s)
            .arg(&u);
        ok(&run_for(c, Duration::from_secs(120)));
        let mut c = Command::new("qemu-img");
        c.args(["convert", "-f", "raw", "-O", "raw"])
            .arg(&u)
            .arg(&bk);
        ok(&run_for(c, Duration::from_secs(120)));
    })
    .await
    .unwrap();
    ceph.rbd(&["export", "rbd/qemu", exported.to_str().unwrap()]);
    let want = sha256(&src);
    assert_eq!(sha256(&back), want, "qemu-img read back different data");
    assert_eq!(
        sha256(&exported),
        want,
        "rbd export differs from what qemu-img wrote"
    );
    t.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_resize_raises_capacity_changed_and_grows_the_lun() {
    let _g = SERIAL.lock().await;
    let ceph = Ceph::up();
    ceph.rbd(&["create", "rbd/grow", "--size", "16M"]);
    let t = start("iqn.2026-11.org.ipsan:grow", &[ceph.lun("grow")], 1).await;
    let s = session(&t, 0).await;
    assert_eq!(s.read_capacity().await.unwrap().blocks, (16 << 20) / 512);
    let e = s.read((16 << 20) / 512, 1).await.unwrap_err();
    assert_eq!(sense_of(&e), (0x05, 0x21, 0x00), "beyond the end: {e}");
    ceph.rbd(&["resize", "rbd/grow", "--size", "48M"]);
    // The header watch fires within moments; the next command reports the change once.
    let deadline = Instant::now() + Duration::from_secs(20);
    let ua = loop {
        match s.command(tur(), DataDir::None).await {
            Err(e) if e.sense().is_some() => break sense_of(&e),
            Err(e) => panic!("{e}"),
            Ok(_) => {
                assert!(Instant::now() < deadline, "no unit attention after resize");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(ua, (0x06, 0x2A, 0x09), "CAPACITY DATA HAS CHANGED");
    assert_eq!(s.read_capacity().await.unwrap().blocks, (48 << 20) / 512);
    let tail = (40 << 20) / 512;
    s.write(tail, pattern(3, 4096)).await.unwrap();
    assert!(s.read(tail, 8).await.unwrap()[..] == pattern(3, 4096)[..]);
    t.shutdown().await.unwrap();
}

/// The cluster goes away under a writer and comes back: every write either succeeds or
/// fails with a retryable NOT READY sense (never a wrong GOOD, never a hang past the op
/// timeout), writes succeed again after the restart, and every block holds the data of its
/// last acknowledged write or of a later attempt that reported an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_stop_and_restart_under_load_reports_not_ready_and_recovers_without_wrong_data() {
    let _g = SERIAL.lock().await;
    let ceph = Ceph::up();
    ceph.rbd(&["create", "rbd/outage", "--size", "16M"]);
    let t = start("iqn.2026-11.org.ipsan:outage", &[ceph.lun("outage")], 1).await;
    let s = std::sync::Arc::new(session(&t, 0).await);
    const SLOTS: u64 = 16; // 64 KiB each
                           // Per slot: the seed of the last GOOD write, and the seeds attempted since (errors).
    let state = std::sync::Arc::new(Mutex::new(vec![(0u64, Vec::<u64>::new()); SLOTS as usize]));
    for slot in 0..SLOTS {
        s.write(slot * 128, pattern(slot << 32, 64 << 10))
            .await
            .unwrap();
        state.lock().unwrap()[slot as usize].0 = slot << 32;
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..4u64 {
        let (s, state, stop) = (s.clone(), state.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let (mut good, mut not_ready, mut n) = (0u32, 0u32, 0u64);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                let slot = (w + 4 * n) % SLOTS;
                let seed = (slot << 32) | (w << 24) | n;
                state.lock().unwrap()[slot as usize].1.push(seed);
                let started = Instant::now();
                match s.write(slot * 128, pattern(seed, 64 << 10)).await {
                    Ok(()) => {
                        let mut st = state.lock().unwrap();
                        st[slot as usize] = (seed, Vec::new());
                        good += 1;
                    }
                    Err(e) => {
                        assert_eq!(sense_of(&e), (0x02, 0x04, 0x01), "retryable NOT READY: {e}");
                        assert!(
                            started.elapsed() < Duration::from_secs(30),
                            "a write hung for {:?}",
                            started.elapsed()
                        );
                        not_ready += 1;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
            (good, not_ready)
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let c = &ceph;
    tokio::task::block_in_place(|| c.script("stop"));
    tokio::time::sleep(Duration::from_secs(12)).await;
    tokio::task::block_in_place(|| c.script("start"));
    // Recovery: a write succeeds again within a bounded time.
    let back = Instant::now();
    loop {
        match s.write(SLOTS * 128, pattern(99, 4096)).await {
            Ok(()) => break,
            Err(e) => {
                assert_eq!(sense_of(&e), (0x02, 0x04, 0x01), "{e}");
                assert!(back.elapsed() < Duration::from_secs(90), "no recovery: {e}");
            }
        }
    }
    println!("recovered {:?} after the restart", back.elapsed());
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut good, mut not_ready) = (0, 0);
    for w in writers {
        let (g, n) = w.await.unwrap();
        good += g;
        not_ready += n;
    }
    println!("writes: {good} good, {not_ready} NOT READY");
    assert!(not_ready > 0, "the outage must have been reported");
    assert!(good > 0);
    let st = state.lock().unwrap().clone();
    for slot in 0..SLOTS {
        let got = s.read(slot * 128, 128).await.unwrap();
        let (last_good, attempts) = &st[slot as usize];
        let ok = std::iter::once(last_good)
            .chain(attempts.iter())
            .any(|&seed| got[..] == pattern(seed, 64 << 10)[..]);
        assert!(
            ok,
            "slot {slot} holds data nobody wrote after its last GOOD write"
        );
    }
    t.shutdown().await.unwrap();
}

/// PERSISTENT RESERVE OUT `sa` (SPC-4 §6.16) with reservation key `key`, service action
/// key `sa_key` and type `kind`.
async fn prout(s: &Session, sa: u8, kind: u8, key: u64, sa_key: u64) -> Result<(), Error> {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x5F;
    cdb[1] = sa;
    cdb[2] = kind;
    cdb[8] = 24;
    let mut p = vec![0u8; 24];
    p[..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    s.command(cdb, DataDir::Write(Bytes::from(p)))
        .await
        .map(drop)
}

/// PERSISTENT RESERVE IN `sa` (SPC-4 §6.15).
async fn prin(s: &Session, sa: u8) -> Vec<u8> {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x5E;
    cdb[1] = sa;
    cdb[7..9].copy_from_slice(&4096u16.to_be_bytes());
    let c = s
        .command(cdb, DataDir::Read(bytes::BytesMut::new(), 4096))
        .await
        .unwrap();
    c.data.to_vec()
}

/// The reservation keys of PR IN READ KEYS data.
fn keys(d: &[u8]) -> Vec<u64> {
    let n = u32::from_be_bytes([d[4], d[5], d[6], d[7]]) as usize;
    d[8..8 + n]
        .chunks(8)
        .map(|k| u64::from_be_bytes(k.try_into().unwrap()))
        .collect()
}

fn is_conflict(r: Result<(), Error>) -> bool {
    matches!(r, Err(Error::Scsi { status: 0x18, .. }))
}

/// Two targets serving one image keep one reservation state (in a RADOS object next to the
/// image): a WRITE EXCLUSIVE reservation made through A binds a writer on B, B reports A's
/// key and A's relative port, releasing through A frees B at once; RESERVE(6) too; and
/// registrations made through both targets at the same time are all kept (the updates are
/// compare-and-swap on a version).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_targets_share_persistent_reservations_through_the_image() {
    let _g = SERIAL.lock().await;
    let ceph = Ceph::up();
    ceph.rbd(&["create", "rbd/pr", "--size", "16M"]);
    let a = start("iqn.2026-11.org.ipsan:pr-a", &[ceph.lun("pr")], 1).await;
    let b = start("iqn.2026-11.org.ipsan:pr-b", &[ceph.lun("pr")], 2).await;
    let h1 = session_as(&a, 0, Some("iqn.2026-11.org.ipsan:host1")).await;
    let h2 = session_as(&b, 0, Some("iqn.2026-11.org.ipsan:host2")).await;
    const K1: u64 = 0xA1A1_0000_0000_0001;
    const WE: u8 = 1;

    prout(&h1, 0x00, 0, 0, K1).await.unwrap(); // REGISTER
    prout(&h1, 0x01, WE, K1, 0).await.unwrap(); // RESERVE, Write Exclusive
    assert!(
        is_conflict(h2.write(8, pattern(2, 4096)).await),
        "a write through B must conflict with A's reservation"
    );
    h2.read(8, 8)
        .await
        .expect("Write Exclusive lets others read");
    assert_eq!(
        keys(&prin(&h2, 0x00).await),
        vec![K1],
        "READ KEYS through B"
    );
    let res = prin(&h2, 0x01).await; // READ RESERVATION
    assert_eq!(u32::from_be_bytes(res[4..8].try_into().unwrap()), 16);
    assert_eq!(u64::from_be_bytes(res[8..16].try_into().unwrap()), K1);
    assert_eq!(res[21] & 0x0F, WE);
    let full = prin(&h2, 0x03).await; // READ FULL STATUS: A's key, holder, A's port
    assert_eq!(u64::from_be_bytes(full[8..16].try_into().unwrap()), K1);
    assert_eq!(full[20] & 1, 1, "R_HOLDER");
    assert_eq!(
        u16::from_be_bytes([full[26], full[27]]),
        1,
        "relative port of A"
    );
    // The holder still writes, through A.
    h1.write(16, pattern(1, 4096)).await.unwrap();

    prout(&h1, 0x02, WE, K1, 0).await.unwrap(); // RELEASE
    h2.write(8, pattern(2, 4096))
        .await
        .expect("released through A: B writes at once");
    assert!(h1.read(8, 8).await.unwrap()[..] == pattern(2, 4096)[..]);
    prout(&h1, 0x00, 0, K1, 0).await.unwrap(); // unregister
    assert!(keys(&prin(&h2, 0x00).await).is_empty());

    // RESERVE(6) through A binds B as well; RELEASE(6) frees it.
    let mut r6 = [0u8; 16];
    r6[0] = 0x16;
    h1.command(r6, DataDir::None).await.unwrap();
    assert!(is_conflict(h2.write(8, pattern(3, 4096)).await));
    r6[0] = 0x17;
    h1.command(r6, DataDir::None).await.unwrap();
    h2.write(8, pattern(3, 4096)).await.unwrap();

    // Concurrent registrations through both targets: none lost.
    let mut hosts = Vec::new();
    for i in 0..6u64 {
        let t = if i % 2 == 0 { &a } else { &b };
        let name = format!("iqn.2026-11.org.ipsan:reg{i}");
        hosts.push(std::sync::Arc::new(session_as(t, 0, Some(&name)).await));
    }
    let gen0 = u32::from_be_bytes(prin(&h1, 0x00).await[..4].try_into().unwrap());
    let regs: Vec<_> = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let h = h.clone();
            tokio::spawn(async move { prout(&h, 0x00, 0, 0, 0x100 + i as u64).await })
        })
        .collect();
    for r in regs {
        r.await.unwrap().unwrap();
    }
    let d = prin(&h2, 0x00).await;
    let mut got = keys(&d);
    got.sort_unstable();
    assert_eq!(
        got,
        (0x100..0x106).collect::<Vec<u64>>(),
        "a registration was lost"
    );
    let gen = u32::from_be_bytes(d[..4].try_into().unwrap());
    assert_eq!(gen, gen0 + 6, "PRgeneration counts every registration once");

    drop(hosts);
    let _ = h1.logout().await;
    let _ = h2.logout().await;
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// A backend dropped while librbd is still running one of its completion callbacks closes
/// the image on the thread that drops it. The callback used to hold the backend's last
/// reference then and so closed the image from inside librbd's callback context, where
/// `rbd_close` waits for that very callback: the close never finished, the image's exclusive
/// lock stayed with the half-closed client, and the other gateway's next flush (a flush needs
/// the lock) never completed. That was the shutdown flush that hung in CI at the end of
/// `two_targets_share_persistent_reservations_through_the_image` (target A dropped its LUN
/// just after its own shutdown flush completed; B's flush then waited on A for good).
#[test]
fn a_backend_dropped_during_a_completion_closes_the_image_and_hands_the_lock_on() {
    use ipsan_scsi::{IoOp, IoRequest};
    use std::sync::mpsc;
    let _g = SERIAL.blocking_lock();
    let ceph = Ceph::up();
    ceph.rbd(&["create", "rbd/drop", "--size", "16M"]);
    let spec: ipsan_scsi::BackendSpec = ceph.lun("drop").parse().unwrap();
    let a = ipsan_scsi::open(&spec).unwrap();
    let b = ipsan_scsi::open(&spec).unwrap();
    // B writes, so B holds the exclusive lock; A's flush takes it over.
    b.write_at(&[7u8; 4096], 0).unwrap();
    let (fired_tx, fired) = mpsc::channel();
    let (release, released) = mpsc::channel::<()>();
    a.submit(
        IoRequest {
            tag: 1,
            op: IoOp::Flush,
        },
        Box::new(move |c| {
            let _ = fired_tx.send(c.result.is_ok());
            // Keep librbd's callback running while A is dropped (the CI race, made certain).
            let _ = released.recv_timeout(Duration::from_secs(10));
        }),
    );
    assert_eq!(
        fired.recv_timeout(Duration::from_secs(60)),
        Ok(true),
        "A's flush"
    );
    let dropper = std::thread::spawn(move || drop(a));
    std::thread::sleep(Duration::from_millis(300));
    let _ = release.send(());
    // B's flush needs the lock back from A: it gets it once A's image is closed.
    let (tx, rx) = mpsc::channel();
    let b2 = b.clone();
    std::thread::spawn(move || {
        let _ = tx.send(b2.flush().map_err(|e| e.to_string()));
    });
    let flushed = rx.recv_timeout(Duration::from_secs(60));
    if flushed != Ok(Ok(())) {
        // B's close would wait on the same lock: leave it, so the failure is reported.
        std::mem::forget(b);
        panic!("B's flush did not complete within 60 s ({flushed:?}): A's image was not closed");
    }
    dropper.join().unwrap();
    let status = ceph.rbd(&["status", "rbd/drop"]);
    assert_eq!(
        status.matches("watcher=").count(),
        1,
        "only B watches the image once A is dropped: {status}"
    );
}

/// A gateway whose Ceph client is blocklisted (`ceph osd blocklist add`, as another client
/// breaking its exclusive lock would do) reopens the image with a new client by itself:
/// writes fail with retryable NOT READY meanwhile, succeed again within a bounded time, and
/// the data read back is what was last written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocklisted_gateway_reopens_the_image_and_recovers() {
    let _g = SERIAL.lock().await;
    let ceph = Ceph::up();
    ceph.rbd(&["create", "rbd/bl", "--size", "16M"]);
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let t = start("iqn.2026-11.org.ipsan:bl", &[ceph.lun("bl")], 1).await;
    let s = session(&t, 0).await;
    s.write(0, pattern(1, 64 << 10)).await.unwrap();
    // The gateway's client is the image's watcher: `watcher=127.0.0.1:0/123 client.4 ...`.
    let status = ceph.rbd(&["status", "rbd/bl"]);
    let addrs: Vec<&str> = status
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("watcher="))
        .collect();
    assert_eq!(addrs.len(), 1, "one watcher expected: {status}");
    ceph.cli("ceph", &["osd", "blocklist", "add", addrs[0]]);
    // The old client's operations now fail with EBLOCKLISTED, forever (librbd does not
    // recover); the gateway notices (watch error or a failed command), opens a new client
    // and the image again. Until then writes fail with retryable NOT READY.
    let start_at = Instant::now();
    let (mut failed, mut n, mut last_good) = (0u32, 1u64, 1u64);
    let recovered = loop {
        n += 1;
        match s.write(0, pattern(n, 64 << 10)).await {
            Ok(()) => last_good = n,
            Err(e) => {
                assert_eq!(sense_of(&e), (0x02, 0x04, 0x01), "retryable NOT READY: {e}");
                failed += 1;
            }
        }
        let st = tokio::task::block_in_place(|| ceph.rbd(&["status", "rbd/bl"]));
        if last_good == n && st.contains("watcher=") && !st.contains(addrs[0]) {
            break start_at.elapsed();
        }
        assert!(
            start_at.elapsed() < Duration::from_secs(60),
            "no new client within 60 s: {st}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!("a new client serves the image {recovered:?} after the blocklist; {failed} writes NOT READY meanwhile");
    // And it writes: the data read back is the last write's.
    n += 1;
    s.write(0, pattern(n, 64 << 10)).await.unwrap();
    assert!(s.read(0, 128).await.unwrap()[..] == pattern(n, 64 << 10)[..]);
    let out = ceph.dir.join("bl.img");
    ceph.rbd(&["export", "rbd/bl", out.to_str().unwrap()]);
    assert!(std::fs::read(&out).unwrap()[..64 << 10] == pattern(n, 64 << 10)[..]);
    let _ = s.logout().await;
    t.shutdown().await.unwrap();
}

/// Outcome per test of one iscsi-test-cu run (scripts/cu-summary.py's reading).
fn conformance(url: &str, suite: &str, log: &Path) -> std::collections::BTreeMap<String, String> {
    let mut cmd = Command::new("iscsi-test-cu");
    cmd.args(["--dataloss", &format!("--test={suite}"), url]);
    let o = run_for(cmd, Duration::from_secs(300));
    let mut text = o.stdout.clone();
    text.extend_from_slice(&o.stderr);
    std::fs::write(log, &text).unwrap();
    let mut cmd = Command::new("python3");
    cmd.arg(repo().join("scripts/cu-summary.py"))
        .arg(log)
        .arg("--json");
    let out = ok(&run_for(cmd, Duration::from_secs(30)));
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    v["tests"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect()
}

/// libiscsi's conformance suites for block I/O and reservations, run against an RBD LUN and a
/// file LUN of the same target: the same outcome for every test (reservations on RBD live in
/// a RADOS object next to the image, docs/rbd.md). The full suite
/// (`--test=ALL`, ~3 min per LUN here) is in docs/results/rbd/.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libiscsi_conformance_on_rbd_matches_a_file_lun() {
    let _g = SERIAL.lock().await;
    require("iscsi-test-cu");
    require("python3");
    let ceph = Ceph::up();
    ceph.rbd(&["create", "rbd/cu", "--size", "64M"]);
    let file = format!("file:{},size=64MiB", ceph.dir.join("cu-file.img").display());
    let t = start("iqn.2026-11.org.ipsan:cu", &[ceph.lun("cu"), file], 1).await;
    let (rbd_url, file_url) = (t.urls[0].clone(), t.urls[1].clone());
    let dir = ceph.dir.clone();
    let diffs = tokio::task::spawn_blocking(move || {
        let mut diffs = Vec::new();
        let mut passed = 0;
        for suite in [
            "SCSI.CompareAndWrite",
            "SCSI.Read16",
            "SCSI.Write16",
            "SCSI.WriteSame16",
            "SCSI.Unmap",
            "SCSI.GetLBAStatus",
            "SCSI.Write10",
            "SCSI.ReadCapacity16",
            "SCSI.Inquiry",
            "SCSI.PrinReadKeys",
            "SCSI.PrinServiceactionRange",
            "SCSI.PrinReportCapabilities",
            "SCSI.ProutRegister",
            "SCSI.ProutReserve",
            "SCSI.ProutClear",
            "SCSI.ProutPreempt",
            "SCSI.Reserve6",
        ] {
            let r = conformance(&rbd_url, suite, &dir.join(format!("{suite}.rbd.log")));
            let f = conformance(&file_url, suite, &dir.join(format!("{suite}.file.log")));
            assert!(!f.is_empty(), "{suite}: no tests ran");
            for (test, fv) in &f {
                let rv = r.get(test).map_or("missing", String::as_str);
                if rv == "passed" {
                    passed += 1;
                }
                if rv != fv {
                    diffs.push(format!("{test}: file {fv}, rbd {rv}"));
                }
            }
        }
        assert!(passed > 30, "only {passed} tests passed on RBD");
        diffs
    })
    .await
    .unwrap();
    assert!(diffs.is_empty(), "RBD differs from file: {diffs:#?}");
    t.shutdown().await.unwrap();
}
