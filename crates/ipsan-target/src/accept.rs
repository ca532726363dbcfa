//! The listening socket ([`listen`]) and the accept loop every listener of the target runs,
//! iSCSI and NVMe/TCP alike: take a
//! connection, hold it to the process-wide connection limit and the registry's per-address
//! limit, and run it as a task of the server's connection set (reaped as it goes, drained at
//! shutdown). One loop, so both front ends refuse the same way and count against the same
//! limits.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::registry::Registry;

/// Binds a portal. TCP settings go on the listening socket before `listen`, so accepted
/// connections inherit the buffers (and the window scale they allow) and the congestion
/// control from the SYN on.
pub(crate) fn listen(
    addr: SocketAddr,
    tcp: Option<&ipsan_tcp::TcpSettings>,
) -> std::io::Result<TcpListener> {
    let sock = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    sock.set_reuseaddr(true)?;
    if let Some(t) = tcp {
        let in_force = t
            .apply(&sock)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        info!(%addr, congestion = %in_force.congestion, sndbuf = in_force.sndbuf, rcvbuf = in_force.rcvbuf, notes = ?in_force.notes, "portal TCP settings");
    }
    sock.bind(addr)?;
    sock.listen(1024)
}

/// What every accept loop of one server shares.
#[derive(Clone)]
pub(crate) struct Accepting {
    /// Connections the whole process may hold (`max_connections`), across front ends.
    pub limit: Arc<Semaphore>,
    /// The per-address limit (`Registry::open_connection`).
    pub registry: Arc<Registry>,
    /// Every running connection, waited for at shutdown.
    pub conns: Arc<Mutex<JoinSet<()>>>,
    /// Stops accepting (running connections watch it themselves).
    pub cancel: CancellationToken,
    /// Whether a long path's connection gets its send buffer sized
    /// ([`ipsan_tcp::tune_for_path`]): not where `[server.tcp] sndbuf` sets one.
    pub send_buffer: ipsan_tcp::SendBuffer,
}

/// Accepts on `listener` until cancelled; `serve` runs each admitted connection, told whether
/// its send buffer was sized for a long path ([`ipsan_tcp::PathTuning::sndbuf`]: only such a
/// socket's buffer is split across a session's connections later). `what` names the front end
/// in the log ("iSCSI", "NVMe/TCP").
pub(crate) async fn accept_loop<F, Fut>(
    listener: TcpListener,
    what: &'static str,
    a: Accepting,
    serve: F,
) where
    F: Fn(TcpStream, SocketAddr, bool) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            () = a.cancel.cancelled() => return,
        };
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning on the error.
                warn!("{what} accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = a.limit.clone().try_acquire_owned() else {
            warn!(%peer, "{what} connection limit reached; refusing");
            continue;
        };
        let Some(slot) = a.registry.open_connection(peer.ip()) else {
            continue;
        };
        // Across a WAN (the handshake's round trip): paced, so a read's Data-In leaves spread
        // over the round trip (issue 28: one connection's reads 2.41x, mcs-sweep-7), and a
        // send buffer past the autotuning ceiling unless `[server.tcp] sndbuf` chose one
        // (mcs-sweep-8).
        let sized = match ipsan_tcp::tune_for_path(&stream, a.send_buffer) {
            Ok(t) if t.long => {
                tracing::debug!(%peer, rtt = ?t.rtt, paced = t.paced, sndbuf = ?t.sndbuf, "long path");
                t.sndbuf.is_some()
            }
            Ok(_) => false,
            Err(e) => {
                tracing::debug!(%peer, "path not judged: {e}");
                false
            }
        };
        let conn = serve(stream, peer, sized);
        let mut set = a.conns.lock().await;
        // Reap finished connections so the set does not grow without bound.
        while set.try_join_next().is_some() {}
        set.spawn(async move {
            conn.await;
            drop(slot);
            drop(permit);
        });
    }
}
