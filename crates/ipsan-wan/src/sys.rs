//! The few syscalls the forwarder needs that std does not wrap: TUN creation, entering a
//! network namespace, timer slack and a nanosecond-timeout poll. Each `unsafe` block is the
//! smallest item that needs it.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;

/// `_IOW('T', 202, int)` from `<linux/if_tun.h>`.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;

/// `struct ifreq` as TUNSETIFF reads it: the name, then the flags, padded to 40 bytes.
#[repr(C)]
struct IfReqFlags {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Opens a layer-3 TUN device (`IFF_TUN | IFF_NO_PI`: each read or write is one bare IP packet)
/// named `name` in the calling thread's network namespace, non-blocking.
#[allow(unsafe_code)]
pub fn open_tun(name: &str) -> io::Result<File> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface name {name:?} must be 1-15 bytes without '/'"),
        ));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags_nonblock()
        .open("/dev/net/tun")?;
    let mut req = IfReqFlags {
        name: [0; libc::IFNAMSIZ],
        flags: IFF_TUN | IFF_NO_PI,
        _pad: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF reads and writes a `struct ifreq` (40 bytes: name then flags); `req`
    // has that layout and lives across the call; the fd is a valid open /dev/net/tun.
    let rc = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            TUNSETIFF as _,
            &mut req as *mut IfReqFlags,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(file)
}

trait NonBlock {
    fn custom_flags_nonblock(&mut self) -> &mut Self;
}

impl NonBlock for std::fs::OpenOptions {
    fn custom_flags_nonblock(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
    }
}

/// Moves the calling thread (only this thread) into the network namespace bound at `path`
/// (e.g. `/run/netns/lab-ini`).
#[allow(unsafe_code)]
pub fn enter_netns(path: &Path) -> io::Result<()> {
    let ns = File::open(path)?;
    // SAFETY: setns takes a valid namespace fd, which `ns` holds open for the call; it only
    // changes the calling thread's network namespace.
    let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets the calling thread's timer slack, so a 100 µs poll timeout wakes after ~100 µs instead
/// of the default 50 µs later.
#[allow(unsafe_code)]
pub fn set_timer_slack_ns(ns: u64) {
    // SAFETY: PR_SET_TIMERSLACK takes an integer argument and only affects this thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0);
    }
}

/// Waits until one of `fds` is readable or `timeout_ns` passes (`None`: forever). Returns
/// whether any fd became readable. `EINTR` counts as a timeout.
#[allow(unsafe_code)]
pub fn poll_readable(fds: &[RawFd], timeout_ns: Option<u64>) -> io::Result<bool> {
    let mut pfds = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; 4];
    let n = fds.len().min(pfds.len());
    for (p, &fd) in pfds.iter_mut().zip(&fds[..n]) {
        p.fd = fd;
        p.events = libc::POLLIN;
    }
    let ts = timeout_ns.map(|t| libc::timespec {
        tv_sec: (t / 1_000_000_000) as libc::time_t,
        tv_nsec: (t % 1_000_000_000) as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `pfds` holds `n` initialised pollfd entries, `tsp` is null or points at a live
    // timespec, and a null sigmask leaves the signal mask unchanged.
    let rc = unsafe { libc::ppoll(pfds.as_mut_ptr(), n as libc::nfds_t, tsp, std::ptr::null()) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(e)
        };
    }
    Ok(rc > 0)
}

/// Puts the calling thread in the `SCHED_FIFO` real-time class at `priority` (1-99), so the
/// forwarder is not delayed behind ordinary processes on a busy machine. Returns the OS error
/// if not permitted.
#[allow(unsafe_code)]
pub fn set_realtime(priority: i32) -> io::Result<()> {
    let p = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: pid 0 means the calling thread; `p` is a valid sched_param for the call.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Returns the calling thread to the normal time-sharing class (`SCHED_OTHER`).
#[allow(unsafe_code)]
pub fn set_normal_sched() -> io::Result<()> {
    let p = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 means the calling thread; `p` is a valid sched_param for the call.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &p) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// CPU time the calling thread has used, in nanoseconds.
#[allow(unsafe_code)]
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant the kernel knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc < 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
