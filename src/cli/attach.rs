//! `ipsan attach`: one LUN as a file on a FUSE mount, for hosts with no iSCSI initiator
//! (issue 15). A loop device over the file makes it a block device:
//!
//! ```text
//! ipsan attach iscsi://127.0.0.1:3260/iqn.2026-11.org.ipsan:disk0/0 --fuse /run/ipsan/disk0
//! losetup -f --show --direct-io=on /run/ipsan/disk0/lun0   # then mkfs, mount, ...
//! ```
//!
//! The session is opened exactly as `ipsan bench` opens one ([`super::bench::ConnArgs`]:
//! CHAP, Seal, digests, TCP settings), then the mount serves until it is unmounted
//! (`umount DIR`, `fusermount3 -u DIR`) or the process gets SIGINT/SIGTERM, which unmounts it;
//! either way the session logs out. While a loop device still holds the file the unmount is
//! refused (EBUSY): the process retries for a while (the loop device lets go of the file
//! asynchronously), then says so and keeps serving; a second signal detaches the mount
//! lazily (it is served until the loop device lets go, then the process exits); a third exits
//! at once (the loop device's I/O then fails).
//!
//! Layout: [`lun`] turns byte reads/writes/syncs into SCSI commands on the session
//! (read-modify-write for partial blocks, depth-limited); [`ranges`] serialises overlapping
//! writes; [`fs`] is the FUSE filesystem handing each request to a tokio task.

mod fs;
mod lun;
mod ranges;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ipsan_initiator::{McsConfig, McsSession, Session};
use lun::Link;

/// Attach one LUN as a file: `ipsan attach iscsi://host[:port]/iqn/lun --fuse DIR`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// iscsi://[user[%password]@]host[:port]/target-iqn/lun (the LUN number is required: one
    /// mount serves one LUN).
    pub url: String,
    /// Mount point (created if missing); the LUN appears in it as `lun<N>`.
    #[arg(long, value_name = "DIR")]
    pub fuse: PathBuf,
    /// SCSI commands in flight at most (the kernel's FUSE requests beyond it wait).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub depth: u64,
    /// Runtime threads serving the requests.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub threads: u64,
    /// Let other users than the one mounting open the file (non-root mounts need
    /// `user_allow_other` in /etc/fuse.conf).
    #[arg(long)]
    pub allow_other: bool,
    /// iSCSI connections in the session (RFC 7143 §4.2, MaxConnections; docs/wan.md "Several
    /// connections per session"), as `ipsan bench --connections`: the leading login offers
    /// this many, the others join with the session's TSIH (sealed: each with its own Seal
    /// login); the target may grant fewer. 1, the default, is the one-connection session with
    /// --recovery-timeout; with more, a lost connection is recovered at --erl 2 where the target
    /// grants it, and otherwise ends the session (the file answers EIO).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub connections: u16,
    /// ErrorRecoveryLevel offered with --connections above 1, 0 or 2 (RFC 7143 §7.2, §13.20;
    /// docs/wan.md "Connection recovery"; the session gets the lower of both offers). At 2,
    /// where the target grants it (`[server] error_recovery_level = 2`), a lost connection's
    /// commands are reassigned to a live one and the connection logs in again: the file sees
    /// nothing (sealed writes are sealed again under the new connection's keys).
    #[arg(long = "erl", value_name = "LEVEL", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(0..=2))]
    pub error_recovery_level: u32,
    /// With --connections above 1, which connection a command goes on: least-queued (the
    /// default: the one whose socket would deliver it soonest, its bytes not yet acknowledged
    /// by TCP over its rate), least-bytes (the fewest bytes outstanding) or round-robin.
    #[arg(long, default_value = "least-queued")]
    pub spread: ipsan_initiator::Spread,
    #[command(flatten)]
    pub conn: super::bench::ConnArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let threads = usize::try_from(args.threads).unwrap_or(2);
    let depth = usize::try_from(args.depth).unwrap_or(32);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let (url, cfg) = args.conn.config(&args.url)?;
    let lun_no = url
        .require_lun()
        .context("attach serves one LUN per mount: end the URL with /<lun>, e.g. .../0")?;
    std::fs::create_dir_all(&args.fuse)
        .with_context(|| format!("cannot create {}", args.fuse.display()))?;
    let meta = std::fs::metadata(&args.fuse)
        .with_context(|| format!("cannot stat {}", args.fuse.display()))?;
    anyhow::ensure!(meta.is_dir(), "{} is not a directory", args.fuse.display());

    anyhow::ensure!(
        args.error_recovery_level != 1,
        "--erl is 0 or 2 (ErrorRecoveryLevel 1, digest-error recovery by SNACK, is the target's only)"
    );
    let session = if args.connections > 1 {
        let mut cfg = cfg.clone();
        cfg.login.error_recovery_level = args.error_recovery_level;
        let mcs = McsConfig {
            connections: args.connections,
            spread: args.spread,
        };
        Link::Many(
            rt.block_on(McsSession::open(&url, &cfg, mcs))
                .with_context(|| format!("cannot open {url}"))?,
        )
    } else {
        Link::One(
            rt.block_on(Session::open(&url, &cfg))
                .with_context(|| format!("cannot open {url}"))?,
        )
    };
    let cap = session
        .capacity()
        .context("the LUN's capacity is unknown")?;
    let session = Arc::new(session);
    let io = Arc::new(lun::LunIo::new(session.clone(), cap, depth));
    let name = format!("lun{lun_no}");
    let fs = fs::LunFs::new(
        rt.handle().clone(),
        io,
        name.clone(),
        depth,
        meta.uid(),
        meta.gid(),
    );
    let mut options = fuser::Config::default();
    options.mount_options.extend([
        fuser::MountOption::FSName(format!("ipsan:{}", url.require_target()?)),
        fuser::MountOption::Subtype("ipsan".to_owned()),
        fuser::MountOption::NoAtime,
        fuser::MountOption::NoExec,
        fuser::MountOption::NoSuid,
    ]);
    if args.allow_other {
        options.acl = fuser::SessionACL::All;
    }
    let fuse = fuser::Session::new(fs, &args.fuse, &options)
        .with_context(|| format!("cannot mount FUSE on {}", args.fuse.display()))?;
    let fuse_thread = std::thread::Builder::new()
        .name("fuse".to_owned())
        .spawn(move || fuse.run())
        .context("FUSE thread")?;
    let file = args.fuse.join(&name);
    println!(
        "ipsan attach: {url} → {} ({} bytes, {}-byte blocks, depth {depth}{}{})",
        file.display(),
        cap.bytes(),
        cap.block_len,
        if args.conn.seal.is_some() {
            ", sealed"
        } else {
            ""
        },
        if args.connections > 1 {
            format!(
                ", {} of {} connections",
                session.connections(),
                args.connections
            )
        } else {
            String::new()
        }
    );

    if !rt.block_on(serve_until_unmounted(&fuse_thread, &args.fuse)) {
        tracing::warn!(
            "third signal: exiting while the mount is still in use (its users get errors)"
        );
        rt.block_on(logout(session));
        return Ok(());
    }
    match fuse_thread.join() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!("FUSE session: {e}"),
        Err(_) => tracing::warn!("FUSE session thread panicked"),
    }
    rt.block_on(logout(session));
    tracing::info!("{} unmounted", args.fuse.display());
    Ok(())
}

/// How long a signal's unmount is retried while the mount is busy: a loop device's last
/// reference to the file is dropped asynchronously, seconds after `losetup -d` returns when it
/// did direct AIO (measured here: 9–22 s after fio's libaio on ext4, under load).
const UNMOUNT_RETRY: Duration = Duration::from_secs(60);

/// Wait for the mount to end: unmounted from outside, or a signal, on which we unmount,
/// retrying while busy for [`UNMOUNT_RETRY`]. Still busy then (a loop device holds the file):
/// reported and served on. A second signal detaches the mount lazily (served until its last
/// user lets go); a third gives up at once (returns false).
async fn serve_until_unmounted(
    fuse_thread: &std::thread::JoinHandle<std::io::Result<()>>,
    dir: &Path,
) -> bool {
    let shown = dir.display().to_string();
    let mut signals = 0;
    let mut retry_until: Option<tokio::time::Instant> = None;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok();
    while !fuse_thread.is_finished() {
        let signal = async {
            tokio::select! {
                Some(()) = async { term.as_mut()?.recv().await } => {}
                Some(()) = async { int.as_mut()?.recv().await } => {}
            }
        };
        tokio::select! {
            () = signal => {
                signals += 1;
                match signals {
                    1 => {
                        tracing::info!("signal: unmounting {shown}");
                        retry_until = Some(tokio::time::Instant::now() + UNMOUNT_RETRY);
                    }
                    2 => {
                        retry_until = None;
                        match unmount(dir, true).await {
                            Ok(()) => tracing::info!(
                                "second signal: {shown} detached lazily; serving until its \
                                 last user lets go"
                            ),
                            Err(e) => tracing::warn!("second signal: cannot detach {shown}: {e}"),
                        }
                    }
                    _ => return false,
                }
            }
            // The FUSE thread ends when the mount goes away (umount, fusermount -u).
            () = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
        if let Some(until) = retry_until {
            match unmount(dir, false).await {
                Ok(()) => retry_until = None,
                Err(e) if tokio::time::Instant::now() >= until => {
                    retry_until = None;
                    tracing::warn!(
                        "cannot unmount {shown}: {e}; still serving (detach the loop device \
                         with `losetup -d` first, or signal again to detach lazily)"
                    );
                }
                Err(e) => tracing::debug!("unmount {shown}: {e}; retrying"),
            }
        }
    }
    true
}

/// Unmount `dir` (`lazy`: detach it even while busy) with the system's tools: `umount` as
/// root, `fusermount3 -u` (or `fusermount -u`) otherwise.
async fn unmount(dir: &Path, lazy: bool) -> anyhow::Result<()> {
    let root = std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false);
    let tries: &[(&str, &[&str])] = match (root, lazy) {
        (true, false) => &[("umount", &[])],
        (true, true) => &[("umount", &["-l"])],
        (false, false) => &[("fusermount3", &["-u"]), ("fusermount", &["-u"])],
        (false, true) => &[
            ("fusermount3", &["-u", "-z"]),
            ("fusermount", &["-u", "-z"]),
        ],
    };
    let mut last = anyhow::anyhow!("no unmount tool");
    for (tool, flags) in tries {
        let out = tokio::process::Command::new(tool)
            .args(*flags)
            .arg(dir)
            .output()
            .await;
        match out {
            Ok(o) if o.status.success() => return Ok(()),
            Ok(o) => {
                last = anyhow::anyhow!("{tool}: {}", String::from_utf8_lossy(&o.stderr).trim());
            }
            Err(e) => last = anyhow::anyhow!("{tool}: {e}"),
        }
    }
    Err(last)
}

/// Log out once the FUSE tasks have let go of the session (bounded: a dead connection or a
/// task that does not finish must not keep the process alive).
async fn logout(session: Arc<Link>) {
    let mut session = session;
    for _ in 0..50 {
        match Arc::try_unwrap(session) {
            Ok(s) => {
                match tokio::time::timeout(Duration::from_secs(6), s.logout()).await {
                    Ok(Ok(())) => tracing::info!("logged out"),
                    Ok(Err(e)) => tracing::warn!("logout: {e}"),
                    Err(_) => tracing::warn!("logout: timed out"),
                }
                return;
            }
            Err(s) => session = s,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tracing::warn!("logout skipped: requests still hold the session");
}
