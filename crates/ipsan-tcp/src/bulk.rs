//! A bulk TCP sender and sink, for measuring what a congestion control and window achieve on a
//! path (the iFCP paper's experiments: Table 1's window/RTT ceiling, Fig. 10's loss sweep).
//!
//! Unlike a generic tool, every result carries the settings read back from the socket
//! ([`InForce`]) and the sender's `TCP_INFO` at the start and end of the measured interval, so
//! a throughput number always comes with the cwnd, ssthresh and retransmissions behind it.
//! Throughput is bytes the receiver acknowledged during the interval (`tcpi_bytes_acked`),
//! after an `omit` warm-up that leaves slow start out, as the paper reports steady state.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use socket2::{Domain, Protocol, Socket, Type};

use crate::{tcp_info, InForce, TcpError, TcpInfoSnapshot, TcpSettings};

/// How to run one bulk transfer.
#[derive(Debug, Clone)]
pub struct SendOptions {
    /// Socket settings for the sender (congestion control above all).
    pub settings: TcpSettings,
    /// Length of the measured interval.
    pub duration: Duration,
    /// Warm-up before the measured interval (slow start, buffer autotuning).
    pub omit: Duration,
    /// Offered load: `SO_MAX_PACING_RATE` in bits/s (the iFCP paper (Muknahallipatna et al.) drove 90 % of line rate).
    pub rate_bps: Option<u64>,
    /// Give up connecting after this long.
    pub connect_timeout: Duration,
}

/// The outcome of one bulk transfer, as bench and lab JSON carry it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BulkResult {
    /// Settings in force on the sender.
    pub in_force: InForce,
    /// Offered load, bits/s, if paced.
    pub rate_bps: Option<u64>,
    /// Measured interval, seconds.
    pub seconds: f64,
    /// Warm-up left out, seconds.
    pub omit_seconds: f64,
    /// Bytes acknowledged in the measured interval.
    pub bytes: u64,
    /// Throughput in MB/s (10^6 bytes/s, the paper's unit).
    pub mbyte_per_s: f64,
    /// Throughput in Mbit/s.
    pub mbit_per_s: f64,
    /// Segments retransmitted in the measured interval.
    pub retrans_segments: u32,
    /// Segments sent in the measured interval (delivered, from `tcpi_delivered`).
    pub delivered_segments: u32,
    /// Sender `TCP_INFO` when the measured interval began.
    pub start: TcpInfoSnapshot,
    /// Sender `TCP_INFO` when it ended.
    pub end: TcpInfoSnapshot,
}

/// Connects to `addr` with `opts.settings` applied before the SYN, sends as fast as the
/// connection allows (or at `rate_bps`) for `omit + duration`, and reports the interval.
pub fn send(addr: SocketAddr, opts: &SendOptions) -> Result<BulkResult, TcpError> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).map_err(
        |source| TcpError::Socket {
            op: "socket",
            source,
        },
    )?;
    let in_force = opts.settings.apply(&sock)?;
    if let Some(bps) = opts.rate_bps {
        crate::sys::set_max_pacing_rate(sock.as_fd().as_raw_fd(), bps / 8).map_err(|source| {
            TcpError::Socket {
                op: "setsockopt(SO_MAX_PACING_RATE)",
                source,
            }
        })?;
    }
    sock.connect_timeout(&addr.into(), opts.connect_timeout)
        .map_err(|source| TcpError::Socket {
            op: "connect",
            source,
        })?;
    let stream: TcpStream = sock.into();
    stream
        .set_write_timeout(Some(Duration::from_secs(2)))
        .map_err(|source| TcpError::Socket {
            op: "setsockopt(SO_SNDTIMEO)",
            source,
        })?;
    let writer_stream = stream
        .try_clone()
        .map_err(|source| TcpError::Socket { op: "dup", source })?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop_w = stop.clone();
    let writer = std::thread::spawn(move || {
        let chunk = vec![0xa5u8; 1 << 18];
        let mut s = writer_stream;
        while !stop_w.load(Ordering::Relaxed) {
            match s.write(&chunk) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    });
    std::thread::sleep(opts.omit);
    let start = tcp_info(&stream)?;
    let t0 = Instant::now();
    std::thread::sleep(opts.duration);
    let end = tcp_info(&stream)?;
    let seconds = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let _ = stream.shutdown(std::net::Shutdown::Both);
    let write_result = writer
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the bulk writer thread panicked")));
    if let Err(source) = write_result {
        // A reset after our own shutdown is expected; anything before it is an error.
        if end.bytes_acked == 0 {
            return Err(TcpError::Socket {
                op: "write",
                source,
            });
        }
    }
    let bytes = end.bytes_acked.saturating_sub(start.bytes_acked);
    let rate = bytes as f64 / seconds.max(1e-9);
    Ok(BulkResult {
        in_force,
        rate_bps: opts.rate_bps,
        seconds,
        omit_seconds: opts.omit.as_secs_f64(),
        bytes,
        mbyte_per_s: rate / 1e6,
        mbit_per_s: rate * 8.0 / 1e6,
        retrans_segments: end.total_retrans.saturating_sub(start.total_retrans),
        delivered_segments: end.delivered.saturating_sub(start.delivered),
        start,
        end,
    })
}

/// Binds a listener with `settings` applied before `listen` (so the window scale covers the
/// buffer, RFC 7323 §2.2).
pub fn listen(
    addr: SocketAddr,
    settings: &TcpSettings,
) -> Result<(TcpListener, InForce), TcpError> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).map_err(
        |source| TcpError::Socket {
            op: "socket",
            source,
        },
    )?;
    sock.set_reuse_address(true)
        .map_err(|source| TcpError::Socket {
            op: "setsockopt(SO_REUSEADDR)",
            source,
        })?;
    let in_force = settings.apply(&sock)?;
    sock.bind(&addr.into())
        .map_err(|source| TcpError::Socket { op: "bind", source })?;
    sock.listen(64).map_err(|source| TcpError::Socket {
        op: "listen",
        source,
    })?;
    Ok((sock.into(), in_force))
}

/// Accepts connections and discards what they send, each on its own thread, until `count`
/// connections have been accepted (forever if `None`). Returns after the last one closes.
pub fn sink(
    listener: &TcpListener,
    settings: &TcpSettings,
    count: Option<usize>,
) -> Result<(), TcpError> {
    let mut handles = Vec::new();
    let mut accepted = 0usize;
    while count.is_none_or(|c| accepted < c) {
        let (mut s, peer) = listener.accept().map_err(|source| TcpError::Socket {
            op: "accept",
            source,
        })?;
        accepted += 1;
        let settings = settings.clone();
        handles.push(std::thread::spawn(move || {
            if let Err(e) = settings.apply(&s) {
                tracing::warn!(%peer, error = ?e, "sink: applying the socket settings failed");
            }
            let mut buf = vec![0u8; 1 << 20];
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        }));
    }
    for h in handles {
        let _ = h.join();
    }
    Ok(())
}

/// Parses a rate such as `900mbit`, `1gbit`, `500kbit` or a plain bits/s count.
pub fn parse_rate_bps(s: &str) -> Result<u64, TcpError> {
    let t = s.trim().to_ascii_lowercase();
    let bad = |reason: &str| TcpError::InvalidSetting {
        what: "rate",
        value: s.to_string(),
        reason: reason.to_string(),
    };
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| bad("expected a number such as 900mbit"))?;
    let mult = match unit.trim() {
        "" | "bit" | "bps" => 1e0,
        "k" | "kbit" => 1e3,
        "m" | "mbit" => 1e6,
        "g" | "gbit" => 1e9,
        _ => return Err(bad("unknown unit (use kbit, mbit or gbit)")),
    };
    let bps = n * mult;
    if !(1.0..=1e12).contains(&bps) {
        return Err(bad("out of range (1 bit/s to 1 Tbit/s)"));
    }
    Ok(bps as u64)
}

/// Jain's fairness index (Jain, Chiu, Hawe 1984): (Σx)² / (n·Σx²); 1 is perfectly fair,
/// 1/n is one flow taking everything.
pub fn jain_index(throughputs: &[f64]) -> Option<f64> {
    let n = throughputs.len() as f64;
    let sum: f64 = throughputs.iter().sum();
    let sq: f64 = throughputs.iter().map(|x| x * x).sum();
    (sq > 0.0).then(|| sum * sum / (n * sq))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rates() {
        assert_eq!(parse_rate_bps("900mbit").unwrap(), 900_000_000);
        assert_eq!(parse_rate_bps("1gbit").unwrap(), 1_000_000_000);
        assert_eq!(parse_rate_bps("1.5G").unwrap(), 1_500_000_000);
        assert_eq!(parse_rate_bps("12345").unwrap(), 12345);
        for bad in ["", "fast", "10 parsecs", "0", "-1mbit"] {
            assert!(parse_rate_bps(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn jain_index_spans_fair_to_unfair() {
        assert!((jain_index(&[5.0, 5.0]).unwrap() - 1.0).abs() < 1e-12);
        assert!((jain_index(&[10.0, 0.0]).unwrap() - 0.5).abs() < 1e-12);
        assert!(jain_index(&[0.0, 0.0]).is_none());
    }

    #[test]
    fn measures_a_loopback_transfer() {
        let (l, _) = listen("127.0.0.1:0".parse().unwrap(), &TcpSettings::default()).unwrap();
        let addr = l.local_addr().unwrap();
        let sink = std::thread::spawn(move || sink(&l, &TcpSettings::default(), Some(1)));
        let opts = SendOptions {
            settings: TcpSettings::with_congestion("reno"),
            duration: Duration::from_millis(300),
            omit: Duration::from_millis(100),
            rate_bps: Some(200_000_000),
            connect_timeout: Duration::from_secs(2),
        };
        let r = send(addr, &opts).unwrap();
        sink.join().unwrap().unwrap();
        assert_eq!(r.in_force.congestion, "reno");
        assert!(r.bytes > 0);
        // Paced at 200 Mbit/s: the measured rate cannot be far above it.
        assert!(
            r.mbit_per_s < 240.0,
            "pacing ignored: {} Mbit/s",
            r.mbit_per_s
        );
        assert!(
            r.mbit_per_s > 50.0,
            "too slow for loopback: {} Mbit/s",
            r.mbit_per_s
        );
    }
}
