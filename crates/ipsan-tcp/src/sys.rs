//! The socket options socket2 does not cover (`TCP_INFO`, `TCP_WINDOW_CLAMP`,
//! `SO_MAX_PACING_RATE`), as the few `unsafe` calls this crate makes, each with its argument.

use std::io;
use std::os::fd::RawFd;

/// `getsockopt(fd, IPPROTO_TCP, TCP_INFO)`: the struct and how many bytes the kernel filled.
#[allow(unsafe_code)]
pub(crate) fn getsockopt_tcp_info(fd: RawFd) -> io::Result<(libc::tcp_info, u32)> {
    // SAFETY: `tcp_info` is a plain C struct of integers, for which all-zero bytes are valid.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `fd` is borrowed from a live socket for the duration of the call; `info` is a
    // writable buffer of `len` bytes; the kernel writes at most `len` bytes and updates `len`.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((info, len))
}

/// `setsockopt(fd, level, name, &value, sizeof value)` for an option that takes a `T`.
#[allow(unsafe_code)]
fn setsockopt<T: Copy>(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: T,
) -> io::Result<()> {
    // SAFETY: `value` lives on this stack frame for the whole call and `optlen` is its exact
    // size; the kernel only reads `optlen` bytes from it.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `getsockopt(fd, level, name)` for an option that returns a `T` (an integer type).
#[allow(unsafe_code)]
fn getsockopt<T: Copy + Default>(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
) -> io::Result<T> {
    let mut value = T::default();
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `value` is a writable `T` of `len` bytes on this frame; the kernel writes at most
    // `len` bytes and updates `len`.
    let rc = unsafe { libc::getsockopt(fd, level, name, (&mut value as *mut T).cast(), &mut len) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value)
}

/// `TCP_WINDOW_CLAMP`: the largest receive window this socket advertises, bytes.
pub(crate) fn set_window_clamp(fd: RawFd, bytes: u32) -> io::Result<()> {
    let v = libc::c_int::try_from(bytes).map_err(|_| io::ErrorKind::InvalidInput)?;
    setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_WINDOW_CLAMP, v)
}

/// Reads `TCP_WINDOW_CLAMP`.
pub(crate) fn window_clamp(fd: RawFd) -> io::Result<u32> {
    let v: libc::c_int = getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_WINDOW_CLAMP)?;
    Ok(u32::try_from(v).unwrap_or(0))
}

/// `SO_MAX_PACING_RATE`, bytes per second (the kernel paces TCP itself since Linux 4.13).
pub(crate) fn set_max_pacing_rate(fd: RawFd, bytes_per_sec: u64) -> io::Result<()> {
    // asm-generic/socket.h (x86, arm64, riscv): SO_MAX_PACING_RATE is 47; libc lacks it.
    const SO_MAX_PACING_RATE: libc::c_int = 47;
    setsockopt(fd, libc::SOL_SOCKET, SO_MAX_PACING_RATE, bytes_per_sec)
}

/// Reads `SO_MAX_PACING_RATE` (64 bits: `u64::MAX` is "unlimited").
pub(crate) fn max_pacing_rate(fd: RawFd) -> io::Result<u64> {
    const SO_MAX_PACING_RATE: libc::c_int = 47;
    getsockopt(fd, libc::SOL_SOCKET, SO_MAX_PACING_RATE)
}

/// `TCP_RTO_MIN_US` (Linux 6.15), microseconds: the socket's floor under its retransmission
/// timeout, and what a tail loss probe of a lone segment waits beyond two round trips.
pub(crate) fn set_rto_min_us(fd: RawFd, us: u32) -> io::Result<()> {
    // include/uapi/linux/tcp.h: TCP_RTO_MIN_US is 45; libc lacks it.
    const TCP_RTO_MIN_US: libc::c_int = 45;
    let v = libc::c_int::try_from(us).map_err(|_| io::ErrorKind::InvalidInput)?;
    setsockopt(fd, libc::IPPROTO_TCP, TCP_RTO_MIN_US, v)
}

/// Reads `TCP_RTO_MIN_US`.
pub(crate) fn rto_min_us(fd: RawFd) -> io::Result<u32> {
    const TCP_RTO_MIN_US: libc::c_int = 45;
    let v: libc::c_int = getsockopt(fd, libc::IPPROTO_TCP, TCP_RTO_MIN_US)?;
    Ok(u32::try_from(v).unwrap_or(0))
}

/// `SO_SNDBUFFORCE` / `SO_RCVBUFFORCE`: like `SO_SNDBUF`/`SO_RCVBUF` but past
/// `net.core.wmem_max`/`rmem_max`; needs `CAP_NET_ADMIN`.
pub(crate) fn set_buf_force(fd: RawFd, receive: bool, bytes: u64) -> io::Result<()> {
    let v = libc::c_int::try_from(bytes).map_err(|_| io::ErrorKind::InvalidInput)?;
    let name = if receive {
        libc::SO_RCVBUFFORCE
    } else {
        libc::SO_SNDBUFFORCE
    };
    setsockopt(fd, libc::SOL_SOCKET, name, v)
}
