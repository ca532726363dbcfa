//! Each connection's reader and writer tasks of a session of several connections: the writer
//! drains `poll_transmit(cid)` through the connection's framed, record-protected transport,
//! the reader feeds `handle_pdu(cid)` (RFC 7143 §4.2.3: a task's PDUs stay on its connection).

use super::*;

/// Starts connection `cid`'s reader and writer on its framed halves (with its negotiated
/// digests and Seal record layer).
pub(super) fn start_conn(core: &Arc<McsCore>, cid: u16, fresh: Fresh) -> Result<()> {
    let Fresh { conn, li } = fresh;
    let Conn { mut rd, mut wr } = conn;
    let codec = codec_for(&li.params);
    let (sealer, opener) = li.record.map_or((None, None), |(s, o)| (Some(s), Some(o)));
    rd.codec = codec.clone();
    rd.record = opener;
    wr.codec = codec;
    wr.sealer = sealer;
    // A second descriptor of the socket, for TCP_INFO only (Spread::LeastQueued); without
    // one the connection is spread by its outstanding bytes.
    let (sock, rto_floor) = {
        use std::os::fd::AsFd;
        let s: &TcpStream = wr.get_ref().as_ref();
        // A lone lost command would stall every connection (see COMMAND_RTO_MIN).
        let floor = match ipsan_tcp::set_rto_min(s, COMMAND_RTO_MIN) {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(cid, "minimum RTO left as the kernel's: {e}");
                false
            }
        };
        // Paced by the kernel: a connection's window leaves spread over the round trip, not
        // as a burst into a shallow bottleneck queue (issue 28, docs/results/mcs-sweep-6:
        // 8 sealed connections at 1 Gbit/s, 32 ms, wrote 2.15x as much, iperf3's rate).
        if let Err(e) = ipsan_tcp::pace(s) {
            tracing::debug!(cid, "not paced: {e}");
        }
        (s.as_fd().try_clone_to_owned().ok(), floor)
    };
    let c = Arc::new(McsConn {
        cid,
        wake_writer: Notify::new(),
        transform: li.transform,
        dead: OnceLock::new(),
        io_tasks: Mutex::new(Vec::new()),
        sock: Mutex::new(sock),
        unflushed: AtomicU64::new(0),
        rto_floor,
    });
    core.with(false, |g| g.conns.push(c.clone()))?;
    // Its socket came with the whole path's buffer (`connect_tcp`): every connection's share.
    core.share_send_buffers(true);
    let w = tokio::spawn(mcs_writer(wr, core.clone(), c.clone()));
    let r = tokio::spawn(mcs_reader(rd, core.clone(), c.clone()));
    if let Ok(mut t) = c.io_tasks.lock() {
        *t = vec![w.abort_handle(), r.abort_handle()];
    }
    // Anything queued for it before its writer started.
    c.wake_writer.notify_one();
    Ok(())
}

async fn mcs_writer(
    wr: ipsan_transport::FrameWriter<OwnedWriteHalf>,
    core: Arc<McsCore>,
    c: Arc<McsConn>,
) {
    let r = mcs_writer_inner(wr, &core, &c).await;
    c.forget_socket();
    core.share_send_buffers(false);
    if let Err(e) = r {
        core.kill(&c, e);
    }
}

async fn mcs_writer_inner(
    mut wr: ipsan_transport::FrameWriter<OwnedWriteHalf>,
    core: &McsCore,
    c: &McsConn,
) -> std::result::Result<(), ConnectionLoss> {
    let mut batch: Vec<Pdu> = Vec::with_capacity(512);
    loop {
        let woken = c.wake_writer.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let closed = {
            let mut g = core
                .lock()
                .map_err(|_| ConnectionLoss::Local(LocalClose::Poisoned))?;
            if !g.current(c) {
                // A relogin took its CID: what is queued there is the new connection's.
                return Ok(());
            }
            let mut bytes = 0usize;
            while bytes < 4 * 1024 * 1024 && batch.len() < 512 {
                let Some(p) = g.session.poll_transmit(c.cid) else {
                    break;
                };
                bytes += p.data.len() + 48;
                batch.push(p);
            }
            c.unflushed.store(bytes as u64, Ordering::Relaxed);
            g.session
                .connection(c.cid)
                .is_none_or(|x| x.closed().is_some())
        };
        if batch.is_empty() {
            if closed {
                break;
            }
            woken.await;
            continue;
        }
        for pdu in batch.drain(..) {
            wr.push(pdu).map_err(|e| match e {
                ipsan_transport::PushError::Protect(e) => {
                    tracing::warn!("seal: cannot protect a PDU: {e}; dropping the connection");
                    ConnectionLoss::SealExhausted
                }
                ipsan_transport::PushError::Encode(e, _) => ConnectionLoss::Encode(e),
            })?;
        }
        wr.flush().await.map_err(|e| ConnectionLoss::Io {
            op: IoOp::Send,
            kind: e.kind(),
        })?;
        c.unflushed.store(0, Ordering::Relaxed);
        core.flushed(c);
    }
    let _ = wr.shutdown().await;
    Ok(())
}

async fn mcs_reader(
    rd: ipsan_transport::FrameReader<OwnedReadHalf>,
    core: Arc<McsCore>,
    c: Arc<McsConn>,
) {
    mcs_reader_inner(rd, &core, &c).await;
    c.forget_socket();
    core.share_send_buffers(false);
}

impl McsCore {
    /// Long paths: splits the path's send buffer across the connections whose sockets are open
    /// ([`ipsan_tcp::SendShare::split`] says when and how: with the whole buffer each kept MBs
    /// unsent behind a window no larger than its share, issue 28, docs/results/mcs-sweep-9).
    pub(super) fn share_send_buffers(&self, added: bool) {
        if !self.share_buffers {
            return;
        }
        let Ok(g) = self.lock() else {
            return;
        };
        let socks: Vec<_> = g.conns.iter().filter_map(|c| c.sock.lock().ok()).collect();
        let open: Vec<&std::os::fd::OwnedFd> = socks.iter().filter_map(|s| s.as_ref()).collect();
        if let Some(n) = self.send_share.split(&open, added) {
            tracing::debug!(
                connections = n,
                "send buffer split across the session's connections"
            );
        }
    }
}

async fn mcs_reader_inner(
    mut rd: ipsan_transport::FrameReader<OwnedReadHalf>,
    core: &McsCore,
    c: &McsConn,
) {
    loop {
        match rd.next().await {
            Ok(Some(Ok(pdu))) => {
                let current = core.with(false, |g| {
                    let current = g.current(c);
                    if current {
                        g.session.handle_pdu(c.cid, Instant::now(), pdu);
                    }
                    current
                });
                if !matches!(current, Ok(true)) {
                    return;
                }
            }
            Ok(Some(Err(e))) => {
                core.kill(c, ConnectionLoss::Framing(e));
                return;
            }
            Ok(None) => {
                let _ = core.with(false, |g| {
                    if g.current(c) {
                        g.session.peer_closed(c.cid, Instant::now());
                    }
                });
                return;
            }
            Err(e) => {
                let loss = match ipsan_transport::forgery(&e) {
                    Some(f) => {
                        tracing::warn!("{f}; dropping the session");
                        ConnectionLoss::SealForgery(f.clone())
                    }
                    None => ConnectionLoss::Io {
                        op: IoOp::Receive,
                        kind: e.kind(),
                    },
                };
                core.kill(c, loss);
                return;
            }
        }
    }
}
