//! Issue 15, `ipsan attach`: the real `ipsan target` (a RAM LUN on loopback) and the real
//! `ipsan attach` mounting it with FUSE, then the kernel's own tools on top:
//!
//! - byte I/O at odd offsets and sizes through the file, and concurrent writes sharing blocks
//!   (read-modify-write must not lose any of them), compared with a model of the LUN — on
//!   one connection and on a session of four (`--connections 4`, issue 28);
//! - a loop device over the file, `mkfs.ext4`, a tree of files, `sync`, `umount`,
//!   `fsck.ext4 -f -n` clean, remount, every file equal — plain and over a sealed session
//!   (aes-256-gcm);
//! - the connection cut in the middle of the ext4 run over a sealed session (a loopback relay
//!   closes it and refuses reconnects for 3 s): session recovery (RFC 7143 §6.3.5) reconnects
//!   and resends, no I/O error reaches the filesystem, fsck is clean, every file equal;
//! - with recovery off (`--recovery-timeout 0`), the target killed while I/O runs: the file
//!   answers EIO (not a hang) and `ipsan attach` still exits on SIGTERM, unmounting.
//!
//! Needs root, /dev/fuse and loop devices (prints `SKIP:` and passes otherwise; creates
//! /dev/loop* with mknod when they are missing). Every process, loop device and mount is
//! removed by a Drop guard, so a failed assertion leaves nothing behind.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Relay;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ipsan");
const IQN: &str = "iqn.2026-11.org.ipsan:disk0";

/// One attach at a time: loop devices are a shared resource and each test keeps both cores busy.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

fn can_run(test: &str, need_loop: bool) -> bool {
    if !is_root() {
        println!("SKIP: {test}: needs root (FUSE mount, loop devices)");
        return false;
    }
    if !Path::new("/dev/fuse").exists() {
        println!("SKIP: {test}: no /dev/fuse");
        return false;
    }
    if need_loop && !ensure_loop_devices() {
        println!("SKIP: {test}: no loop devices (losetup -f fails, mknod did not help)");
        return false;
    }
    true
}

/// `losetup -f` works, creating /dev/loop-control and /dev/loop0..7 first if they are missing
/// (some containers have the driver but no nodes).
fn ensure_loop_devices() -> bool {
    let works = || {
        Command::new("losetup")
            .arg("-f")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if works() {
        return true;
    }
    if !Path::new("/dev/loop-control").exists() {
        let _ = Command::new("mknod")
            .args(["-m", "0660", "/dev/loop-control", "c", "10", "237"])
            .status();
    }
    for n in 0..8 {
        let dev = format!("/dev/loop{n}");
        if !Path::new(&dev).exists() {
            let _ = Command::new("mknod")
                .args(["-m", "0660", &dev, "b", "7", &n.to_string()])
                .status();
        }
    }
    works()
}

/// Run a command; panic with its output if it fails.
fn run(cmd: &str, args: &[&str]) -> String {
    let o = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        o.status.success(),
        "{cmd} {args:?} failed ({}):\n{}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A child process killed (by PID) when dropped.
struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Read stdout lines on a thread until `pred` matches one, within `limit`.
fn wait_line(child: &mut Child, limit: Duration, pred: impl Fn(&str) -> bool) -> String {
    let out = child.stdout.take().expect("stdout piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if pred(&l) => return l,
            Ok(_) => {}
            Err(_) => panic!("no expected line within {limit:?}"),
        }
    }
}

/// `ipsan target` on 127.0.0.1, a port of its choosing; `extra` flags (e.g. Seal).
fn start_target(lun: &str, extra: &[&str]) -> (Proc, u16) {
    let mut args = vec!["target", "--portal", "127.0.0.1:0", "--lun", lun];
    args.extend_from_slice(extra);
    let mut child = Command::new(BIN)
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let line = wait_line(&mut child, Duration::from_secs(20), |l| {
        l.contains("listening on")
    });
    let port = line
        .rsplit(':')
        .next()
        .and_then(|p| p.trim().parse().ok())
        .expect("port in the listening line");
    (Proc(child), port)
}

/// A running `ipsan attach` and its mount point. Drop: SIGTERM, then kill, then a lazy
/// unmount if the mount is still there, then remove the directory.
struct Attach {
    child: Option<Child>,
    dir: PathBuf,
    log: PathBuf,
    /// The `ipsan attach:` line it printed when ready.
    ready: String,
}

impl Attach {
    fn start(tag: &str, port: u16, extra: &[&str]) -> Attach {
        Attach::start_env(tag, port, extra, &[])
    }

    /// As `start`, with environment variables for `ipsan attach` (e.g. `RUST_LOG`).
    fn start_env(tag: &str, port: u16, extra: &[&str], env: &[(&str, &str)]) -> Attach {
        let base = std::env::temp_dir().join(format!("ipsan-attach-{}-{tag}", std::process::id()));
        let _ = Command::new("umount")
            .arg("-l")
            .arg(base.join("mnt"))
            .output();
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let dir = base.join("mnt");
        let log = base.join("attach.log");
        let url = format!("iscsi://127.0.0.1:{port}/{IQN}/0");
        let mut args = vec!["attach", url.as_str(), "--fuse", dir.to_str().unwrap()];
        args.extend_from_slice(extra);
        let mut child = Command::new(BIN)
            .args(&args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut a = Attach {
            child: None,
            dir,
            log,
            ready: String::new(),
        };
        let line = wait_line(&mut child, Duration::from_secs(30), |l| {
            l.starts_with("ipsan attach:")
        });
        a.child = Some(child);
        a.ready.clone_from(&line);
        assert!(line.contains("lun0"), "{line}");
        assert!(
            a.file().exists(),
            "{} missing after: {line}",
            a.file().display()
        );
        a
    }

    fn file(&self) -> PathBuf {
        self.dir.join("lun0")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn mounted(&self) -> bool {
        std::fs::read_to_string("/proc/self/mounts")
            .unwrap_or_default()
            .lines()
            .any(|l| l.split(' ').nth(1) == self.dir.to_str())
    }

    fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .args([sig, &c.id().to_string()])
                .status();
        }
    }

    /// SIGTERM and wait for a clean exit within `limit`; returns the exit status.
    fn terminate(&mut self, limit: Duration) -> std::process::ExitStatus {
        self.signal("-TERM");
        let deadline = Instant::now() + limit;
        let child = self.child.as_mut().expect("running");
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                self.child = None;
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "ipsan attach did not exit within {limit:?} of SIGTERM; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Attach {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            self.signal("-TERM");
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && c.try_wait().ok().flatten().is_none() {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        if self.mounted() {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).output();
        }
        if let Some(base) = self.dir.parent() {
            let _ = std::fs::remove_dir_all(base);
        }
    }
}

/// A loop device over a file, and optionally an ext4 mount of it; Drop unmounts and detaches.
struct Loop {
    dev: String,
    mnt: Option<PathBuf>,
}

impl Loop {
    fn attach(file: &Path) -> Loop {
        let dev = run(
            "losetup",
            &["-f", "--show", "--direct-io=on", file.to_str().unwrap()],
        )
        .trim()
        .to_owned();
        Loop { dev, mnt: None }
    }

    fn mount(&mut self, at: &Path) {
        std::fs::create_dir_all(at).unwrap();
        run("mount", &[&self.dev, at.to_str().unwrap()]);
        self.mnt = Some(at.to_owned());
    }

    fn umount(&mut self) {
        if let Some(m) = self.mnt.take() {
            run("umount", &[m.to_str().unwrap()]);
        }
    }

    /// Unmount, `losetup -d`, then wait (up to `limit`) until the kernel has really let go
    /// of the backing file: `losetup -d` returns at once and the loop driver unbinds only
    /// when its last opener closes it. Returns how long that took, or `None` if the device
    /// was still bound at `limit`.
    fn detach_and_wait(mut self, limit: Duration) -> Option<Duration> {
        let sys = Path::new("/sys/block")
            .join(Path::new(&self.dev).file_name().unwrap())
            .join("loop");
        self.umount();
        let _ = Command::new("losetup").args(["-d", &self.dev]).output();
        self.dev.clear(); // detached: nothing left for Drop
        let started = Instant::now();
        while sys.exists() {
            if started.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(started.elapsed())
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        if let Some(m) = self.mnt.take() {
            let _ = Command::new("umount").arg(&m).output();
            let _ = Command::new("umount").arg("-l").arg(&m).output();
        }
        if !self.dev.is_empty() {
            let _ = Command::new("losetup").args(["-d", &self.dev]).output();
        }
    }
}

/// Deterministic bytes (xorshift) for a seed.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

const MIB: u64 = 1 << 20;
/// open(2)'s O_DIRECT on Linux (x86-64, aarch64 differ; only the former runs this).
#[cfg(target_arch = "x86_64")]
const O_DIRECT: i32 = 0o40000;
#[cfg(not(target_arch = "x86_64"))]
const O_DIRECT: i32 = 0o200000;

#[test]
fn accepts_unaligned_and_concurrent_overlapping_writes_through_the_file() {
    if !can_run("attach byte I/O", false) {
        return;
    }
    let _s = serial();
    byte_io_through_the_file("bytes", &["--depth", "16"]);
}

#[test]
fn accepts_unaligned_and_concurrent_overlapping_writes_over_four_connections() {
    // `--connections 4` (issue 28): the same checks on a session of four connections (the
    // target grants four by default), commands spread over them.
    if !can_run("attach byte I/O over four connections", false) {
        return;
    }
    let _s = serial();
    let a = byte_io_through_the_file("bytes4", &["--depth", "16", "--connections", "4"]);
    assert!(a.contains("4 of 4 connections"), "{a}");
}

/// Byte I/O at odd offsets and sizes and concurrent overlapping writes through the file of an
/// `ipsan attach` started with `extra`, compared with a model of the LUN; returns its
/// `ipsan attach:` line.
fn byte_io_through_the_file(tag: &str, extra: &[&str]) -> String {
    let (_target, port) = start_target("mem:16MiB", &[]);
    let a = Attach::start(tag, port, extra);
    let size = 16 * MIB as usize;
    let f = File::options()
        .read(true)
        .write(true)
        .open(a.file())
        .unwrap();
    assert_eq!(
        f.metadata().unwrap().len(),
        size as u64,
        "file sized to the LUN"
    );
    let mut model = vec![0u8; size];

    // Odd offsets and sizes: inside one block, across block edges, many blocks, > 1 MiB.
    let writes: &[(usize, usize)] = &[
        (1, 1),
        (511, 2),
        (513, 1000),
        (4095, 8193),
        (100_003, 777_777),
        (3 * MIB as usize - 7, 1_500_001),
        (size - 300, 300),
    ];
    for (i, &(off, len)) in writes.iter().enumerate() {
        let p = pattern(i as u64 + 1, len);
        f.write_all_at(&p, off as u64).unwrap();
        model[off..off + len].copy_from_slice(&p);
    }
    for &(off, len) in &[
        (0usize, 4096usize),
        (510, 5),
        (4000, 10_000),
        (99_999, 800_000),
    ] {
        let mut got = vec![0u8; len];
        f.read_exact_at(&mut got, off as u64).unwrap();
        assert!(got == model[off..off + len], "read {len}@{off} differs");
    }

    // Four writers, each owning every fourth 100-byte slot: every 512-byte block gets bytes from
    // all four at once, so any RMW not serialised against the others loses some.
    let slot = 100usize;
    let region = (5 * MIB as usize, 256 * 1024usize);
    // O_DIRECT: the kernel passes each write straight to the FUSE server, in parallel
    // (FOPEN_PARALLEL_DIRECT_WRITES), instead of serialising buffered writes on the inode lock.
    let direct = File::options()
        .read(true)
        .write(true)
        .custom_flags(O_DIRECT)
        .open(a.file())
        .unwrap();
    std::thread::scope(|s| {
        for w in 0..4usize {
            let f = &direct;
            s.spawn(move || {
                let p = pattern(100 + w as u64, region.1);
                for k in (w..region.1 / slot).step_by(4) {
                    let at = k * slot;
                    f.write_all_at(&p[at..at + slot], (region.0 + at) as u64)
                        .unwrap();
                }
            });
        }
    });
    for w in 0..4usize {
        let p = pattern(100 + w as u64, region.1);
        for k in (w..region.1 / slot).step_by(4) {
            let at = k * slot;
            model[region.0 + at..region.0 + at + slot].copy_from_slice(&p[at..at + slot]);
        }
    }

    // The whole LUN read back (through a fresh descriptor, so no page cache of the writer).
    drop((f, direct));
    let mut back = Vec::with_capacity(size);
    File::open(a.file())
        .unwrap()
        .read_to_end(&mut back)
        .unwrap();
    assert_eq!(back.len(), size, "read to EOF stops at the LUN's end");
    if let Some(i) = back.iter().zip(&model).position(|(x, y)| x != y) {
        panic!("byte {i} differs from the model (block {})", i / 512);
    }

    // Past the end: short read, then nothing; a write past the end is refused.
    let f = File::options()
        .read(true)
        .write(true)
        .open(a.file())
        .unwrap();
    let mut tail = [0u8; 100];
    assert_eq!(f.read_at(&mut tail, size as u64 - 40).unwrap(), 40);
    assert_eq!(f.read_at(&mut tail, size as u64 + 10).unwrap(), 0);
    let e = f.write_at(&[1, 2, 3], size as u64 + 512).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(27), "EFBIG past the end, got {e}");
    drop(f);
    a.ready.clone()
}

/// ext4 over a loop device over the file: mkfs, a tree of files, sync, umount, fsck clean,
/// remount, every file equal. With `cut`, the session's connection goes through a relay that
/// is cut (and refuses reconnects for `cut`) while the files are being written.
fn ext4_round_trip(
    tag: &str,
    target_extra: &[&str],
    attach_extra: &[&str],
    files: usize,
    cut: Option<Duration>,
) {
    let (_target, port) = start_target("mem:160MiB", target_extra);
    let relay = cut.map(|_| Relay::start(port));
    let a = Attach::start(tag, relay.as_ref().map_or(port, |r| r.port), attach_extra);
    let mut lo = Loop::attach(&a.file());
    run("mkfs.ext4", &["-q", "-F", "-E", "nodiscard", &lo.dev]);
    let mnt = a.dir.parent().unwrap().join("ext4");
    lo.mount(&mnt);
    // A tree: 10 directories, files from 1 byte to ~1 MiB with odd sizes.
    let size_of = |i: usize| (i * 7919 + 1) % (1 << 20) + (i % 3);
    let path_of = |i: usize| mnt.join(format!("d{}", i % 10)).join(format!("f{i}"));
    for d in 0..10 {
        std::fs::create_dir_all(mnt.join(format!("d{d}"))).unwrap();
    }
    let mut cutter = None;
    for i in 0..files {
        if i == files / 3 {
            if let (Some(r), Some(hold)) = (&relay, cut) {
                // Everything so far goes to the LUN first, so the cut meets a busy session.
                run("sync", &[]);
                let ctl = r.ctl.clone();
                cutter = Some(std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(200));
                    ctl.cut_for(hold);
                }));
            }
        }
        let mut w = File::create(path_of(i)).unwrap();
        w.write_all(&pattern(i as u64, size_of(i))).unwrap();
        if cutter.as_ref().is_some_and(|c| !c.is_finished()) {
            // Keep data in flight on the session while the cut comes.
            w.sync_data().unwrap();
        }
    }
    if let Some(c) = cutter {
        c.join().unwrap();
    }
    run("sync", &[]);
    lo.umount();
    let fsck = Command::new("fsck.ext4")
        .args(["-f", "-n", &lo.dev])
        .output()
        .unwrap();
    assert!(
        fsck.status.success(),
        "fsck.ext4 -f -n found problems ({}):\n{}{}\nattach log:\n{}",
        fsck.status,
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr),
        a.log()
    );
    // Drop every cached page, so the remount reads through the session.
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
    lo.mount(&mnt);
    for i in 0..files {
        let got = std::fs::read(path_of(i)).unwrap();
        assert!(
            got == pattern(i as u64, size_of(i)),
            "{} differs after remount",
            path_of(i).display()
        );
    }
    // The loop device must have let go of the file before attach is asked to unmount it
    // (attach retries a busy unmount for 60 s, then keeps serving, as documented). It lets go
    // only when its last opener does, and a copy of the ext4 mount in another mount
    // namespace is one: processes started by `ip netns exec` (a lab or WAN script running
    // beside this test) copy every mount of this private-propagation root, and our umount
    // does not reach their copies. One CI run on a shared machine failed that way; this
    // wait turns it into a failure that says so.
    let released = lo.detach_and_wait(Duration::from_secs(180));
    println!("loop device released the file after {released:?}");
    assert!(
        released.is_some(),
        "the loop device still holds {} 180 s after losetup -d (another mount namespace \
         holding a copy of the ext4 mount?)",
        a.file().display()
    );
    assert!(
        !a.log().contains("EIO"),
        "I/O errors during the run:\n{}",
        a.log()
    );
    if cut.is_some() {
        assert!(
            a.log().contains("connection lost") && a.log().contains("session recovered"),
            "no recovery in the attach log:\n{}",
            a.log()
        );
        println!("attach log:\n{}", a.log());
    }
    // SIGTERM once the loop device is unbound: its last reference to the file may still be
    // dropped a moment later; attach retries the unmount and exits cleanly.
    let mut a = a;
    let asked = Instant::now();
    let st = a.terminate(Duration::from_secs(75));
    println!("attach exited {:?} after SIGTERM", asked.elapsed());
    assert!(
        st.success(),
        "ipsan attach exited with {st}; log:\n{}",
        a.log()
    );
    assert!(!a.mounted(), "still mounted after exit; log:\n{}", a.log());
}

#[test]
fn ext4_on_a_loop_device_over_the_file_survives_fsck_and_remount() {
    if !can_run("attach ext4", true) {
        return;
    }
    let _s = serial();
    ext4_round_trip("ext4", &[], &["--depth", "32"], 120, None);
}

#[test]
fn ext4_over_a_sealed_session_survives_fsck_and_remount() {
    if !can_run("attach ext4 sealed", true) {
        return;
    }
    let _s = serial();
    let key = std::env::temp_dir().join(format!("ipsan-attach-{}-seal.key", std::process::id()));
    std::fs::write(&key, "attach-test-secret-0123456789abcdef\n").unwrap();
    // Secret files readable by others are refused (docs/operate.md).
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let k = key.to_str().unwrap();
    ext4_round_trip(
        "sealed",
        &["--seal", "required", "--seal-secret-file", k],
        &["--seal", "aes-256-gcm", "--secret-file", k, "--depth", "16"],
        60,
        None,
    );
    let _ = std::fs::remove_file(&key);
}

#[test]
fn ext4_over_a_sealed_session_rides_out_a_connection_cut_without_an_io_error() {
    if !can_run("attach ext4 sealed cut", true) {
        return;
    }
    let _s = serial();
    let key = std::env::temp_dir().join(format!("ipsan-attach-{}-cut.key", std::process::id()));
    std::fs::write(&key, "attach-cut-secret-0123456789abcdef\n").unwrap();
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let k = key.to_str().unwrap();
    ext4_round_trip(
        "cut",
        &["--seal", "required", "--seal-secret-file", k],
        &[
            "--seal",
            "aes-256-gcm",
            "--secret-file",
            k,
            "--depth",
            "16",
            "--nop-interval",
            "1",
            "--nop-timeout",
            "2",
            "--recovery-timeout",
            "60s",
        ],
        60,
        Some(Duration::from_secs(3)),
    );
    let _ = std::fs::remove_file(&key);
}

/// Seconds since midnight of a log line's RFC 3339 timestamp (`2026-11-25T19:36:04.174084Z …`).
fn log_secs(line: &str) -> Option<f64> {
    let t = line
        .split_whitespace()
        .next()?
        .split('T')
        .nth(1)?
        .trim_end_matches('Z');
    let mut p = t.split(':');
    let (h, m, s) = (p.next()?, p.next()?, p.next()?);
    Some(h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
}

/// A loop device with `--direct-io=on` hands the file asynchronous direct I/O; with
/// FUSE_ASYNC_DIO negotiated the kernel passes those requests on without waiting for each
/// reply, so they reach attach together and become SCSI commands in flight together. Without
/// it the kernel turns each into a synchronous request, and the loop driver sends the next
/// only when the previous one was answered: one request per round trip to the target, which
/// across a WAN bound ext4 through attach to ~17 MB/s at 8 ms (docs/gateway.md). Here every
/// command crosses a 25 ms-each-way relay, so requests that waited for each other arrive at
/// least 50 ms apart; one 8 MiB direct write to the loop device (several requests) must bring
/// at least two within 20 ms of each other.
#[test]
fn loop_device_direct_io_reaches_attach_several_requests_at_a_time() {
    if !can_run("attach async direct I/O", true) {
        return;
    }
    let _s = serial();
    let (_target, port) = start_target("mem:64MiB", &[]);
    let mut relay = Command::new(BIN)
        .args(["wan", "proxy", "--listen", "127.0.0.1:0"])
        .args(["--to", &format!("127.0.0.1:{port}"), "--delay", "25ms"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Kept open to the end: the relay must not meet a closed stderr.
    let mut err = BufReader::new(relay.stderr.take().unwrap());
    let _relay = Proc(relay);
    let mut first = String::new();
    while !first.starts_with("relaying") {
        first.clear();
        assert!(
            err.read_line(&mut first).unwrap() > 0,
            "the relay did not start"
        );
    }
    // "relaying 127.0.0.1:PORT -> …"
    let relay_port: u16 = first
        .split_whitespace()
        .nth(1)
        .and_then(|a| a.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no relay address in {first:?}"));
    let a = Attach::start_env(
        "asyncdio",
        relay_port,
        &["--depth", "32"],
        &[("RUST_LOG", "info,ipsan::cli::attach::fs=trace")],
    );
    let lo = Loop::attach(&a.file());
    run(
        "dd",
        &[
            "if=/dev/zero",
            &format!("of={}", lo.dev),
            "bs=8M",
            "count=1",
            "oflag=direct",
            "status=none",
        ],
    );
    drop(lo);
    let log = a.log();
    let mut arrivals: Vec<f64> = log
        .lines()
        .filter(|l| l.contains("TRACE") && l.contains(" write offset="))
        .filter_map(log_secs)
        .collect();
    arrivals.sort_by(f64::total_cmp);
    assert!(arrivals.len() >= 2, "fewer than two write requests:\n{log}");
    let closest = arrivals
        .windows(2)
        .map(|w| w[1] - w[0])
        .fold(f64::INFINITY, f64::min);
    println!(
        "{} write requests, closest arrivals {:.1} ms apart",
        arrivals.len(),
        closest * 1e3
    );
    assert!(
        closest < 0.020,
        "{} write requests, never two within 20 ms (closest {:.1} ms apart): the loop device's \
         direct I/O reaches attach one request per round trip; log:\n{log}",
        arrivals.len(),
        closest * 1e3
    );
}

#[test]
fn target_killed_mid_run_gives_eio_and_attach_still_exits() {
    if !can_run("attach target killed", false) {
        return;
    }
    let _s = serial();
    let (mut target, port) = start_target("mem:32MiB", &[]);
    // Recovery off: today's fail-fast behaviour (with it, requests would wait for the
    // target up to --recovery-timeout).
    let mut a = Attach::start(
        "killed",
        port,
        &[
            "--depth",
            "8",
            "--nop-interval",
            "1",
            "--recovery-timeout",
            "0",
        ],
    );
    let file = a.file();
    // A writer and reader hammering the file with O_DIRECT-free I/O until an error comes.
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        let f = File::options().read(true).write(true).open(&file).unwrap();
        let buf = pattern(7, 64 * 1024 + 3);
        let mut i = 0u64;
        let started = Instant::now();
        loop {
            let off = (i * 70_001) % (31 * MIB);
            let r = f
                .write_all_at(&buf, off)
                .and_then(|()| f.sync_data())
                .and_then(|()| {
                    let mut b = vec![0u8; 4099];
                    f.read_exact_at(&mut b, off + 1)
                });
            if let Err(e) = r {
                let _ = tx.send((e.raw_os_error(), started.elapsed()));
                return;
            }
            i += 1;
            if started.elapsed() > Duration::from_secs(60) {
                return;
            }
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    let _ = target.0.kill();
    let _ = target.0.wait();
    let killed = Instant::now();
    let (errno, _) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("no I/O error within 20 s of the target's death (hang?)");
    assert_eq!(errno, Some(5), "expected EIO");
    assert!(killed.elapsed() < Duration::from_secs(20));
    worker.join().unwrap();
    // Further I/O fails at once, it does not wait for anything.
    let t = Instant::now();
    let mut b = [0u8; 512];
    let e = File::open(a.file()).and_then(|f| f.read_exact_at(&mut b, 4096));
    assert!(e.is_err(), "a read after the target died succeeded");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "EIO took {:?}",
        t.elapsed()
    );
    let st = a.terminate(Duration::from_secs(15));
    assert!(
        st.success(),
        "ipsan attach exited with {st}; log:\n{}",
        a.log()
    );
    assert!(!a.mounted(), "the mount outlived ipsan attach");
    assert!(
        a.log().contains("connection to the target lost"),
        "the reason is not logged:\n{}",
        a.log()
    );
}

#[test]
fn rejects_a_url_without_a_lun_before_mounting_anything() {
    let dir = std::env::temp_dir().join(format!("ipsan-attach-{}-nolun", std::process::id()));
    let o = Command::new(BIN)
        .args([
            "attach",
            &format!("iscsi://127.0.0.1:9/{IQN}"),
            "--fuse",
            dir.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "attach without a LUN succeeded");
    assert!(err.contains("one LUN per mount"), "unclear error: {err}");
    assert!(
        !dir.exists(),
        "the mount point was created for a refused URL"
    );
}
