//! Raising another process's UDP socket buffers: the lab's fix for wireguard-go 0.0.20220316
//! (Debian 12) dropping the tunnel's packets in its own receive buffer.
//!
//! That wireguard-go leaves its UDP sockets at `net.core.rmem_default` (208 KiB, host-wide,
//! not settable per namespace). On the emulated link the receiving wireguard-go falls
//! behind by more than that in bursts, the kernel drops the datagrams (`UdpRcvbufErrors`),
//! and the TCP inside the tunnel sees each as a loss: measured at 8 ms one way, 94 drops
//! = 94 retransmissions and 6 MB/s; at 64 ms the iSCSI session stalled behind its own
//! queue until the initiator's 10 s keepalive gave up. Newer wireguard-go
//! (`conn: set SO_{SND,RCV}BUF to 7 MiB`) sets 7 MiB with `SO_RCVBUFFORCE`; the lab does
//! the same from outside: it takes a duplicate of each socket with `pidfd_getfd(2)` and
//! sets `SO_RCVBUFFORCE`/`SO_SNDBUFFORCE` (needs CAP_NET_ADMIN and ptrace access: root).

use std::os::fd::{FromRawFd, OwnedFd};

/// What upstream wireguard-go asks for since late 2022.
pub const WIREGUARD_SOCKET_BUFFER: usize = 7 << 20;

/// Socket inodes of `pid`'s UDP sockets bound to local `port` (IPv4 and IPv6), read from
/// `/proc/<pid>/net/udp{,6}` (which show the process's own namespace).
fn udp_inodes(pid: u32, port: u16) -> Vec<String> {
    let mut v = Vec::new();
    for f in ["udp", "udp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{f}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let local_port = cols
                .get(1)
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if local_port == Some(port) {
                if let Some(ino) = cols.get(9) {
                    v.push((*ino).to_string());
                }
            }
        }
    }
    v
}

/// Sets `SO_RCVBUFFORCE` and `SO_SNDBUFFORCE` to `bytes` on every UDP socket of process
/// `pid` bound to `port`. Returns the receive buffer sizes the kernel reports afterwards
/// (it doubles the request), one per socket.
pub fn force_udp_buffers(pid: u32, port: u16, bytes: usize) -> Result<Vec<usize>, String> {
    let inodes = udp_inodes(pid, port);
    if inodes.is_empty() {
        return Err(format!("process {pid} has no UDP socket on port {port}"));
    }
    let pidfd = pidfd_open(pid).map_err(|e| format!("pidfd_open({pid}): {e}"))?;
    let mut sizes = Vec::new();
    let dir =
        std::fs::read_dir(format!("/proc/{pid}/fd")).map_err(|e| format!("/proc/{pid}/fd: {e}"))?;
    for e in dir.flatten() {
        let Ok(link) = std::fs::read_link(e.path()) else {
            continue;
        };
        let link = link.to_string_lossy().into_owned();
        let Some(ino) = link
            .strip_prefix("socket:[")
            .and_then(|s| s.strip_suffix(']'))
        else {
            continue;
        };
        if !inodes.iter().any(|i| i == ino) {
            continue;
        }
        let Some(target_fd) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let fd = pidfd_getfd(&pidfd, target_fd)
            .map_err(|e| format!("pidfd_getfd({pid}, {target_fd}): {e}"))?;
        set_force(&fd, bytes).map_err(|e| format!("setsockopt on {pid}'s fd {target_fd}: {e}"))?;
        sizes.push(get_rcvbuf(&fd).map_err(|e| format!("getsockopt: {e}"))?);
    }
    if sizes.is_empty() {
        return Err(format!(
            "no file descriptor of {pid} matches its UDP sockets"
        ));
    }
    Ok(sizes)
}

#[allow(unsafe_code)]
fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new fd or -1; no memory is
    // passed. A returned fd is ours alone, so OwnedFd may close it.
    unsafe {
        let r = libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0 as libc::c_uint);
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(r as i32))
    }
}

#[allow(unsafe_code)]
fn pidfd_getfd(pidfd: &OwnedFd, target_fd: i32) -> std::io::Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_getfd(2) takes a valid pidfd (borrowed for the call), an fd number in
    // that process and flags 0; it returns a new fd in this process or -1. The new fd is
    // ours alone, so OwnedFd may close it.
    unsafe {
        let r = libc::syscall(
            libc::SYS_pidfd_getfd,
            pidfd.as_raw_fd(),
            target_fd,
            0 as libc::c_uint,
        );
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(r as i32))
    }
}

fn set_force(fd: &OwnedFd, bytes: usize) -> std::io::Result<()> {
    set_opts(fd, &[libc::SO_RCVBUFFORCE, libc::SO_SNDBUFFORCE], bytes)
}

/// Fixed receive and send buffers on one of our own sockets (`SO_RCVBUF`, `SO_SNDBUF`, up to
/// `net.core.{r,w}mem_max`), which turns the kernel's autotuning off for it. Set on a
/// listener, accepted connections inherit it and the handshake announces a window scale to
/// match.
pub fn set_tcp_buffers(fd: &impl std::os::fd::AsFd, bytes: usize) -> std::io::Result<()> {
    set_opts(fd, &[libc::SO_RCVBUF, libc::SO_SNDBUF], bytes)
}

#[allow(unsafe_code)]
fn set_opts(
    fd: &impl std::os::fd::AsFd,
    opts: &[libc::c_int],
    bytes: usize,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = fd.as_fd();
    let v: libc::c_int = bytes.min(libc::c_int::MAX as usize) as libc::c_int;
    for &opt in opts {
        // SAFETY: setsockopt with a valid fd, a pointer to a c_int that outlives the call
        // and its exact size.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[allow(unsafe_code)]
fn get_rcvbuf(fd: &OwnedFd) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt with a valid fd and pointers to a c_int and its length, both
    // living on this stack frame for the duration of the call.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(v.max(0) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raises_the_receive_buffer_of_a_processs_udp_socket() {
        if !ipsan_wan::link::is_root() {
            eprintln!("SKIP: SO_RCVBUFFORCE and pidfd_getfd need root");
            return;
        }
        // Our own process stands in for wireguard-go: pidfd_getfd works on oneself too.
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = sock.local_addr().unwrap().port();
        let sizes = force_udp_buffers(std::process::id(), port, 4 << 20).unwrap();
        assert_eq!(sizes.len(), 1);
        // The kernel doubles the request for bookkeeping; and it is the same socket.
        assert!(sizes[0] >= 4 << 20, "{sizes:?}");
        let fd = std::os::fd::AsFd::as_fd(&sock)
            .try_clone_to_owned()
            .unwrap();
        assert_eq!(get_rcvbuf(&fd).unwrap(), sizes[0]);
        drop((fd, sock));
        assert!(force_udp_buffers(std::process::id(), port, 1 << 20).is_err());
    }
}
