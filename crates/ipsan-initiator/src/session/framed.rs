//! The connection's tasks: the reader (PDUs from `ipsan-transport`'s [`FrameReader`] — read,
//! verify the Seal record, decode — into the engine), the writer (batch `poll_transmit` into
//! its [`FrameWriter`] — protect, encode, vectored write) and the timer that passes the time
//! in to the engine. The framing itself is the target's too: one implementation.

use super::*;
use ipsan_transport::{FrameReader, FrameWriter, PushError, Received};

/// Runs the engine's timers: NOP-Out keepalive and its timeout, command timeouts and their
/// escalation, task management timeouts. It only passes the time in.
pub(super) async fn timer(shared: Arc<Shared>) {
    drive_timer(
        &shared.st.wake_timer,
        || {
            shared.with_io(true, |g| {
                let d = g.session.poll_timeout();
                g.timer_at = d;
                d
            })
        },
        || shared.with_io(false, |g| g.session.handle_timeout(Instant::now())),
    )
    .await
}

/// A timer task's loop, for both drivers: asks `poll` for the engine's next deadline (and
/// records it, so a submission that needs an earlier one notifies `wake`), sleeps until then
/// or until woken, and passes the time in with `fire`; ends when either fails (the connection
/// or the session is gone).
pub(super) async fn drive_timer<T, U, E>(
    wake: &Notify,
    mut poll: impl FnMut() -> std::result::Result<Option<T>, E>,
    mut fire: impl FnMut() -> std::result::Result<U, E>,
) where
    T: Into<tokio::time::Instant>,
{
    loop {
        let woken = wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let Ok(deadline) = poll() else {
            return;
        };
        match deadline {
            Some(d) => {
                tokio::select! {
                    () = tokio::time::sleep_until(d.into()) => {
                        if fire().is_err() {
                            return;
                        }
                    }
                    () = &mut woken => {}
                }
            }
            None => woken.await,
        }
    }
}

/// The one framed write of this connection: drains the engine's PDUs (ExpStatSN stamped as
/// they leave it) into `ipsan-transport`'s [`FrameWriter`], batching what is queued into
/// vectored writes. In a sealed session the writer record-protects every PDU, in wire order
/// (docs/seal.md §4a).
pub(super) async fn writer(wr: FrameWriter<OwnedWriteHalf>, shared: Arc<Shared>) {
    if let Err(e) = writer_inner(wr, &shared).await {
        shared.kill(e);
    }
}

async fn writer_inner(
    mut wr: FrameWriter<OwnedWriteHalf>,
    shared: &Shared,
) -> std::result::Result<(), ConnectionLoss> {
    let mut batch: Vec<Pdu> = Vec::with_capacity(512);
    loop {
        let woken = shared.st.wake_writer.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let (closed, in_flight) = shared
            .with_io(true, |g| {
                let mut bytes = 0usize;
                // Batch what is queued so many small PDUs go out in one syscall.
                while bytes < 4 * 1024 * 1024 && batch.len() < 512 {
                    let Some(p) = g.session.poll_transmit() else {
                        break;
                    };
                    bytes += p.data.len();
                    batch.push(p);
                }
                let conn = g.session.connection();
                (conn.closed().is_some(), conn.tasks_in_flight())
            })
            .map_err(|_| ConnectionLoss::Local(LocalClose::Poisoned))?;
        if batch.is_empty() {
            if closed {
                break;
            }
            woken.await;
            if in_flight > 1 {
                // Woken by a submission while other commands are out: their answers wake
                // their callers, who submit again right after. Let the tasks that are ready
                // run first, so one write carries their commands too. Otherwise a
                // multi-thread runtime runs the writer at once (the woken task runs next)
                // and sends nearly every 4 KiB command in a `writev` of its own: 0.75 per
                // command at depth 32, each a loopback segment (issue 27). A lone command
                // (depth 1) is sent at once.
                tokio::task::yield_now().await;
            }
            continue;
        }
        let tr = shared.core.observer.get();
        for pdu in batch.drain(..) {
            observe_sent(tr, &pdu);
            wr.push(pdu).map_err(|e| match e {
                PushError::Protect(e) => {
                    tracing::warn!("seal: cannot protect a PDU: {e}; dropping the connection");
                    ConnectionLoss::SealExhausted
                }
                // Fatal plain or sealed: the engine already counted it as sent.
                PushError::Encode(e, _) => ConnectionLoss::Encode(e),
            })?;
        }
        wr.flush().await.map_err(|e| ConnectionLoss::Io {
            op: IoOp::Send,
            kind: e.kind(),
        })?;
    }
    let _ = wr.shutdown().await;
    Ok(())
}

/// Observer events for a PDU leaving (see [`crate::observe`]).
pub(super) fn observe_sent(tr: Option<&Observer>, pdu: &Pdu) {
    let Some(tr) = tr else { return };
    match &pdu.header {
        Header::ScsiCommand(c) => {
            tr.on_event(c.itt, CommandEvent::CmdSent, 0, pdu.data.len() as u64)
        }
        Header::DataOut(d) if d.final_ => tr.on_event(
            d.itt,
            CommandEvent::DataOut,
            u64::from(d.buffer_offset),
            pdu.data.len() as u64,
        ),
        _ => {}
    }
}

/// Observer events for a PDU arriving (see [`crate::observe`]); `placed`: the length of a
/// Data-In segment received in place (the PDU's own data is empty then).
pub(super) fn observe_received(tr: Option<&Observer>, pdu: &Pdu, placed: Option<usize>) {
    let Some(tr) = tr else { return };
    match &pdu.header {
        Header::DataIn(h) => {
            let len = placed.unwrap_or(pdu.data.len()) as u64;
            if h.buffer_offset == 0 {
                tr.on_event(h.itt, CommandEvent::DataInFirst, 0, len);
            }
            if h.final_ || h.status_present {
                tr.on_event(
                    h.itt,
                    CommandEvent::DataInLast,
                    u64::from(h.buffer_offset),
                    len,
                );
            }
            if h.status_present {
                tr.on_event(h.itt, CommandEvent::Status, 0, 0);
            }
        }
        Header::ScsiResponse(h) => tr.on_event(h.itt, CommandEvent::Status, 0, 0),
        Header::R2t(h) => tr.on_event(
            h.itt,
            CommandEvent::R2t,
            u64::from(h.buffer_offset),
            u64::from(h.desired_data_transfer_length),
        ),
        _ => {}
    }
}

/// The one framed read of this connection: PDUs from `ipsan-transport`'s [`FrameReader`]
/// into the engine until it ends. In a sealed session nothing of a PDU beyond its lengths is
/// read before its record tag verifies (the same step as the target's); any failure (tag,
/// digest, opcode, field, length) drops the connection, and every command in flight fails
/// with [`Error::SealForgery`]. A plain connection's framing error drops it too (the
/// initiator answers no Reject).
pub(super) async fn reader(mut rd: FrameReader<OwnedReadHalf>, shared: Arc<Shared>) {
    let tr = shared.core.observer.get().cloned();
    // A READ whose data comes in one Data-In gets that segment as its buffer (no copy); the
    // buffer it brought comes back here to receive into. A READ whose data comes in several
    // is received into its own buffer in place (issue 27), in a sealed session too: each
    // Data-In's header verifies first, its data (a slice of a sealed transfer) is opened in
    // that buffer before the READ completes (`sealed_read`).
    rd.hand_over(true);
    // Lending changes nothing the writer or a waiter cares about: no wake-up.
    let lend = |h: &iscsi_wire::header::DataIn, len: usize| {
        shared
            .with_io(true, |g| {
                g.session.lend_read_buffer(h.itt, h.buffer_offset, len)
            })
            .ok()
            .flatten()
    };
    loop {
        match rd.next_placing(lend).await {
            Ok(Some(Received::Pdu(Ok(pdu)))) => {
                observe_received(shared.core.observer.get().or(tr.as_ref()), &pdu, None);
                let spare = shared.with_io(false, |g| {
                    g.session.handle_pdu(Instant::now(), pdu);
                    g.session.take_spare_buffer()
                });
                match spare {
                    Ok(Some(buf)) => rd.recycle(buf),
                    Ok(None) => {}
                    Err(_) => return,
                }
            }
            Ok(Some(Received::Placed { pdu, data })) => {
                let len = Some(data.len());
                observe_received(shared.core.observer.get().or(tr.as_ref()), &pdu, len);
                let handled = shared.with_io(false, |g| {
                    g.session.handle_placed_data_in(Instant::now(), pdu, data)
                });
                if handled.is_err() {
                    return;
                }
            }
            Ok(Some(Received::Pdu(Err(e)))) => {
                shared.kill(ConnectionLoss::Framing(e));
                return;
            }
            Ok(None) => {
                let _ = shared.with_io(false, |g| g.session.peer_closed(Instant::now()));
                return;
            }
            Err(e) => {
                if let Some(f) = ipsan_transport::forgery(&e) {
                    tracing::warn!(
                        "{f}; nothing of it acted, dropping the connection and failing every command in flight"
                    );
                    let _ = shared.st.forged.set(f.clone());
                    shared.kill(ConnectionLoss::SealForgery(f.clone()));
                } else {
                    shared.kill(ConnectionLoss::Io {
                        op: IoOp::Receive,
                        kind: e.kind(),
                    });
                }
                return;
            }
        }
    }
}
