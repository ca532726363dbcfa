//! `TCP_INFO` snapshots (`tcp(7)`, `linux/tcp.h`): the sender's view of a connection at the end
//! of a run, carried in bench and lab JSON so every throughput number comes with the cwnd,
//! ssthresh, RTT and retransmissions that explain it.

use std::os::fd::{AsFd, AsRawFd};

use serde::{Deserialize, Serialize};

use crate::TcpError;

/// The kernel's "no threshold yet" ssthresh (`TCP_INFINITE_SSTHRESH`).
const INFINITE_SSTHRESH: u32 = 0x7fff_ffff;

/// One reading of `TCP_INFO`. Counts are segments unless named `bytes`; times are µs.
/// Fields the running kernel does not fill (an older `struct tcp_info`) read as 0.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TcpInfoSnapshot {
    /// `TCP_ESTABLISHED` = 1, … (`tcpi_state`).
    pub state: u8,
    /// 0 open, 1 disorder, 2 CWR, 3 recovery, 4 loss (`tcpi_ca_state`).
    pub ca_state: u8,
    /// Congestion window in segments.
    pub cwnd: u32,
    /// Slow-start threshold in segments; `None` until the first loss.
    pub ssthresh: Option<u32>,
    /// Smoothed RTT (RFC 6298 SRTT).
    pub rtt_us: u32,
    /// RTT variation (RFC 6298 RTTVAR).
    pub rttvar_us: u32,
    /// Lowest RTT seen.
    pub min_rtt_us: u32,
    /// Retransmission timeout.
    pub rto_us: u32,
    /// Sender MSS.
    pub snd_mss: u32,
    /// Segments sent and not yet acknowledged.
    pub unacked: u32,
    /// Bytes written to the socket and not yet sent (`tcpi_notsent_bytes`).
    #[serde(default)]
    pub notsent_bytes: u32,
    /// Segments currently thought lost.
    pub lost: u32,
    /// Segments retransmitted and still unacknowledged.
    pub retrans: u32,
    /// Retransmitted segments over the connection's life.
    pub total_retrans: u32,
    /// RTO-based recoveries over the connection's life (newer kernels).
    pub total_rto: u16,
    /// Estimated delivery rate, bytes/s.
    pub delivery_rate: u64,
    /// Pacing rate, bytes/s.
    pub pacing_rate: u64,
    /// Bytes sent, including retransmissions.
    pub bytes_sent: u64,
    /// Bytes retransmitted.
    pub bytes_retrans: u64,
    /// Bytes acknowledged by the peer.
    pub bytes_acked: u64,
    /// Bytes received.
    pub bytes_received: u64,
    /// Segments delivered (acknowledged, SACKed or not).
    pub delivered: u32,
    /// Time spent with data in flight.
    pub busy_time_us: u64,
    /// Time limited by the peer's receive window: Table 1's limit in the iFCP paper (Muknahallipatna et al.).
    pub rwnd_limited_us: u64,
    /// Time limited by our send buffer.
    pub sndbuf_limited_us: u64,
    /// Peer's advertised receive window, bytes.
    pub snd_wnd: u32,
    /// Our advertised receive window, bytes.
    pub rcv_wnd: u32,
    /// Window scale we send with / the peer uses (RFC 7323 §2).
    pub snd_wscale: u8,
    /// Window scale the peer announced.
    pub rcv_wscale: u8,
    /// Reordering threshold (segments).
    pub reordering: u32,
    /// Bytes of `struct tcp_info` the kernel filled.
    pub info_len: u32,
}

impl TcpInfoSnapshot {
    /// `ssthresh / cwnd`, the ratio the storage-friendly cut is about (0.5 Reno, 0.875 ipsan_sf)
    /// when taken right after a loss.
    pub fn ssthresh_ratio(&self, cwnd_before_loss: u32) -> Option<f64> {
        let st = self.ssthresh?;
        (cwnd_before_loss > 0).then(|| f64::from(st) / f64::from(cwnd_before_loss))
    }
}

/// Reads `TCP_INFO` from a connected TCP socket (std, tokio or socket2).
pub fn tcp_info<S: AsFd>(socket: &S) -> Result<TcpInfoSnapshot, TcpError> {
    let (raw, len) =
        crate::sys::getsockopt_tcp_info(socket.as_fd().as_raw_fd()).map_err(|source| {
            TcpError::Socket {
                op: "getsockopt(TCP_INFO)",
                source,
            }
        })?;
    Ok(TcpInfoSnapshot {
        state: raw.tcpi_state,
        ca_state: raw.tcpi_ca_state,
        cwnd: raw.tcpi_snd_cwnd,
        ssthresh: (raw.tcpi_snd_ssthresh < INFINITE_SSTHRESH).then_some(raw.tcpi_snd_ssthresh),
        rtt_us: raw.tcpi_rtt,
        rttvar_us: raw.tcpi_rttvar,
        min_rtt_us: raw.tcpi_min_rtt,
        rto_us: raw.tcpi_rto,
        snd_mss: raw.tcpi_snd_mss,
        unacked: raw.tcpi_unacked,
        notsent_bytes: raw.tcpi_notsent_bytes,
        lost: raw.tcpi_lost,
        retrans: raw.tcpi_retrans,
        total_retrans: raw.tcpi_total_retrans,
        total_rto: raw.tcpi_total_rto,
        delivery_rate: raw.tcpi_delivery_rate,
        pacing_rate: raw.tcpi_pacing_rate,
        bytes_sent: raw.tcpi_bytes_sent,
        bytes_retrans: raw.tcpi_bytes_retrans,
        bytes_acked: raw.tcpi_bytes_acked,
        bytes_received: raw.tcpi_bytes_received,
        delivered: raw.tcpi_delivered,
        busy_time_us: raw.tcpi_busy_time,
        rwnd_limited_us: raw.tcpi_rwnd_limited,
        sndbuf_limited_us: raw.tcpi_sndbuf_limited,
        snd_wnd: raw.tcpi_snd_wnd,
        rcv_wnd: raw.tcpi_rcv_wnd,
        snd_wscale: raw.tcpi_snd_rcv_wscale & 0x0f,
        rcv_wscale: raw.tcpi_snd_rcv_wscale >> 4,
        reordering: raw.tcpi_reordering,
        info_len: len,
    })
}

/// Where a socket's sending stands, in bytes over the connection's life (`TCP_INFO`): what has
/// been written into it and what the peer's TCP has acknowledged. A byte written when
/// [`SendProgress::written`] read `w` has reached the peer once a later reading is
/// [`SendProgress::delivered`]`(w)`. The target's keepalive waits for its ping's answer from
/// then, not from when the ping went into a send buffer MiBs deep (issue 28).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendProgress {
    /// Bytes written into the socket: sent once (sent less retransmitted) or not yet sent.
    pub written: u64,
    /// Bytes the peer acknowledged.
    pub acked: u64,
    /// Nothing written is waiting to be sent or acknowledged.
    pub idle: bool,
}

impl SendProgress {
    /// Every byte up to `mark` (a [`SendProgress::written`] read earlier) is acknowledged;
    /// an idle socket has delivered everything, whatever the byte counts say.
    #[must_use]
    pub fn delivered(&self, mark: u64) -> bool {
        self.idle || self.acked >= mark
    }
}

/// Reads [`SendProgress`] from a connected TCP socket.
pub fn send_progress<S: AsFd>(socket: &S) -> Result<SendProgress, TcpError> {
    let i = tcp_info(socket)?;
    Ok(SendProgress {
        written: i
            .bytes_sent
            .saturating_sub(i.bytes_retrans)
            .saturating_add(u64::from(i.notsent_bytes)),
        acked: i.bytes_acked,
        idle: i.notsent_bytes == 0 && i.unacked == 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn reads_tcp_info_after_a_transfer() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let reader = std::thread::spawn(move || {
            let mut sink = vec![0u8; 1 << 16];
            let mut total = 0usize;
            while total < 4 << 20 {
                total += s.read(&mut sink).unwrap();
            }
            (total, s)
        });
        let chunk = vec![7u8; 1 << 16];
        for _ in 0..64 {
            c.write_all(&chunk).unwrap();
        }
        let (total, _server) = reader.join().unwrap();
        assert_eq!(total, 4 << 20);
        let info = tcp_info(&c).unwrap();
        assert_eq!(info.state, 1, "established");
        assert!(info.cwnd >= 1);
        assert!(info.snd_mss > 0);
        assert!(info.bytes_sent >= 4 << 20, "{info:?}");
        assert!(
            info.info_len as usize >= 104,
            "kernel filled at least the classic struct"
        );
        let json = serde_json::to_string(&info).unwrap();
        assert!(json.contains("\"cwnd\""));
    }

    #[test]
    fn send_progress_tells_when_bytes_written_reached_the_peer() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        // The peer reads nothing yet: we write until our socket takes no more, so the peer's
        // window is shut and what is in our send buffer is not acknowledged.
        c.set_nonblocking(true).unwrap();
        let chunk = vec![7u8; 1 << 16];
        let mut written = 0usize;
        let mut full = false;
        while written < 256 << 20 {
            match c.write(&chunk) {
                Ok(n) => written += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    full = true;
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(full, "the socket took {written} bytes without blocking");
        std::thread::sleep(std::time::Duration::from_millis(50));
        let p = send_progress(&c).unwrap();
        assert_eq!(p.written, written as u64, "{p:?}");
        let mark = p.written;
        assert!(!p.delivered(mark), "the peer has not taken it all: {p:?}");
        let mut sink = vec![0u8; 1 << 16];
        let mut total = 0usize;
        while total < written {
            total += s.read(&mut sink).unwrap();
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let p = send_progress(&c).unwrap();
            if p.delivered(mark) {
                assert!(p.acked >= mark, "{p:?}");
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "never acknowledged: {p:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[test]
    fn rejects_a_socket_that_is_not_tcp() {
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let err = tcp_info(&udp).unwrap_err();
        assert!(err.to_string().contains("TCP_INFO"), "{err}");
    }
}
