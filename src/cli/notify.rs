//! systemd's readiness protocol (sd_notify(3)) without libsystemd: one datagram of
//! `KEY=VALUE` lines to the Unix socket named by `$NOTIFY_SOCKET` (a path, or `@name` for
//! the abstract namespace). Without `$NOTIFY_SOCKET` (not under systemd) it does nothing.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (e.g. `READY=1`, `RELOADING=1`, `STOPPING=1`, `STATUS=…`) to systemd.
/// Failures are logged, never fatal: the service works without the notification, only
/// systemd's view of it is late.
pub fn notify(state: &str) {
    let Some(addr) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(e) = send(&addr, state) {
        tracing::warn!("sd_notify {state:?} to {addr:?} failed: {e}");
    }
}

fn send(addr: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let sock = UnixDatagram::unbound()?;
    let bytes = addr.as_bytes();
    match bytes.first() {
        Some(b'@') => {
            use std::os::linux::net::SocketAddrExt;
            let a = std::os::unix::net::SocketAddr::from_abstract_name(&bytes[1..])?;
            sock.send_to_addr(state.as_bytes(), &a)?;
        }
        Some(b'/') => {
            sock.send_to(state.as_bytes(), std::path::Path::new(addr))?;
        }
        _ => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "NOTIFY_SOCKET is neither a path nor @abstract",
            ))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn delivers_ready_to_a_path_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let rx = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        super::send(path.as_os_str(), "READY=1\nSTATUS=ok").unwrap();
        let mut buf = [0u8; 128];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=ok");
    }

    #[test]
    fn delivers_to_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("ipsan-notify-test-{}", std::process::id());
        let a = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let rx = std::os::unix::net::UnixDatagram::bind_addr(&a).unwrap();
        super::send(std::ffi::OsStr::new(&format!("@{name}")), "STOPPING=1").unwrap();
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
    }
}
