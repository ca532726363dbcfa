//! The engine of a session of several connections behind its lock: running it, handing its
//! events to the waiting callers (completions, task management answers, TASK REASSIGN's
//! outcomes, connection ends: the session's end at ErrorRecoveryLevel 0, a relogin at 2,
//! RFC 7143 §7.2), sealing reassigned writes again for their new connection, waking the
//! writers and the timer, and the session's one timer task.

use super::*;

impl McsConn {
    /// What its socket has yet to deliver and how fast it goes (`TCP_INFO`: bytes not sent,
    /// segments in flight, congestion window over smoothed RTT), plus what its writer holds.
    fn queue(&self) -> Option<mcs::QueueReport> {
        let g = self.sock.lock().ok()?;
        let info = ipsan_tcp::tcp_info(g.as_ref()?).ok()?;
        let mss = u64::from(info.snd_mss.max(1));
        let per_sec = if info.rtt_us == 0 {
            0
        } else {
            u64::from(info.cwnd) * mss * 1_000_000 / u64::from(info.rtt_us)
        };
        Some(mcs::QueueReport {
            bytes: u64::from(info.notsent_bytes)
                + u64::from(info.unacked) * mss
                + self.unflushed.load(Ordering::Relaxed),
            per_sec,
        })
    }

    /// Its reader or writer ended: no more `TCP_INFO` (and the socket is not kept open).
    pub(super) fn forget_socket(&self) {
        if let Ok(mut g) = self.sock.lock() {
            g.take();
        }
    }
}

impl McsInner {
    /// [`Spread::LeastQueued`]: tells the engine what each connection's socket holds, at most
    /// every [`QUEUE_PROBE_EVERY`] (a `getsockopt` per connection).
    fn probe_queues(&mut self) {
        let now = Instant::now();
        if self
            .probed
            .is_some_and(|t| now.duration_since(t) < QUEUE_PROBE_EVERY)
        {
            return;
        }
        self.probed = Some(now);
        for c in &self.conns {
            if let Some(q) = c.queue() {
                self.session.report_queue(c.cid, q);
            }
        }
    }
}

impl McsInner {
    /// Whether `c` is still the driver of its CID (a relogin replaces it): a replaced one's
    /// reader and writer must never touch the engine connection that took its CID.
    pub(super) fn current(&self, c: &McsConn) -> bool {
        self.conns.iter().any(|x| std::ptr::eq(Arc::as_ptr(x), c))
    }
}

impl McsCore {
    pub(super) fn lock(&self) -> Result<std::sync::MutexGuard<'_, McsInner>> {
        self.inner
            .lock()
            .map_err(|_| Error::ConnectionLost(ConnectionLoss::Local(LocalClose::Poisoned)))
    }

    /// Runs `f` on the engine, hands its events to the waiters and wakes the writers with
    /// work (and the timer when `timer` and the next deadline moved earlier).
    pub(super) fn with<T>(&self, timer: bool, f: impl FnOnce(&mut McsInner) -> T) -> Result<T> {
        let mut g = self.lock()?;
        if self.least_queued {
            g.probe_queues();
        }
        let r = f(&mut g);
        Self::dispatch(&mut g);
        Self::open_gate(&mut g);
        if !g.relogin.is_empty() {
            self.wake_relogin.notify_one();
        }
        for c in &g.conns {
            let closed = g
                .session
                .connection(c.cid)
                .is_none_or(|x| x.closed().is_some());
            if closed || g.session.has_transmit(c.cid) {
                c.wake_writer.notify_one();
            }
        }
        if timer {
            let earlier = match (g.session.poll_timeout(), g.timer_at) {
                (Some(d), Some(t)) => d < t,
                (Some(_), None) => true,
                (None, _) => false,
            };
            if earlier {
                self.wake_timer.notify_one();
            }
        }
        Ok(r)
    }

    fn dispatch(g: &mut McsInner) {
        loop {
            let mut closed = Vec::new();
            while let Some(ev) = g.session.poll_event() {
                match ev {
                    mcs::Event::Completed { itt, cid, result } => {
                        if let Some(cid) = cid {
                            *g.placed.entry(cid).or_default() += 1;
                        }
                        g.plain.remove(&itt);
                        let adopted = matches!(g.moved.remove(&itt), Some(Reassignment::Adopted));
                        let never_left = g.session.take_never_left(itt);
                        let transform = cid
                            .and_then(|c| g.conns.iter().find(|x| x.cid == c))
                            .and_then(|x| x.transform.clone());
                        if let Some(tx) = g.waiters.remove(&itt) {
                            let _ = tx.send(McsDone {
                                result,
                                transform,
                                adopted,
                                never_left,
                            });
                        }
                    }
                    mcs::Event::Reseal { itt, to } => g.reseals.push((itt, to)),
                    mcs::Event::ConnectionClosed { cid, error, gap } => {
                        tracing::debug!(cid, ?error, gap, "connection ended");
                        let reason = g
                            .conns
                            .iter()
                            .find(|c| c.cid == cid)
                            .and_then(|c| c.dead.get().cloned())
                            .unwrap_or_else(|| ConnectionLoss::from_engine(error));
                        closed.push((cid, reason));
                    }
                    mcs::Event::LogoutRequested { cid, within_secs } => {
                        tracing::info!(cid, within_secs, "target requests logout (AsyncEvent 1)");
                    }
                    mcs::Event::Rejected {
                        cid,
                        reason,
                        opcode,
                    } => {
                        tracing::warn!(cid, reason = reason.0, ?opcode, "target rejected a PDU");
                    }
                    mcs::Event::TimeoutStep { cid, itt, step } => {
                        tracing::warn!(cid, itt, ?step, "command timed out");
                    }
                    mcs::Event::TaskManagement { itt, response, .. } => {
                        if let Some(tx) = g.tmf_waiters.remove(&itt) {
                            let _ = tx.send(response);
                        }
                    }
                    mcs::Event::Reassigned { itt, cid, outcome } => {
                        tracing::debug!(itt, cid, ?outcome, "task reassigned");
                        if g.waiters.contains_key(&itt) {
                            g.moved.insert(itt, outcome);
                        }
                        match outcome {
                            Reassignment::Adopted => g.recovery.reassigned += 1,
                            Reassignment::Retried => g.recovery.retried += 1,
                            Reassignment::Refused(r) => {
                                g.recovery.refused += 1;
                                tracing::warn!(itt, cid, response = r.0, "TASK REASSIGN refused");
                            }
                        }
                    }
                }
            }
            let resealed = Self::reseal(g);
            if closed.is_empty() {
                if resealed {
                    continue;
                }
                break;
            }
            if g.session.recovers_connections() && g.session.ended().is_none() {
                // ErrorRecoveryLevel 2: the engine reassigns the tasks; the CID logs in again.
                for (cid, reason) in closed {
                    tracing::info!(cid, %reason, "connection lost; its tasks are reassigned");
                    g.recovery.connections_lost += 1;
                    if !g.logging_out && !g.relogin.contains(&cid) {
                        g.relogin.push(cid);
                    }
                }
                continue;
            }
            // ErrorRecoveryLevel 0 (or a session given up): one connection's end is the
            // session's.
            for (_, reason) in closed {
                if g.ended.is_none() {
                    g.ended = Some(reason);
                }
            }
            let open: Vec<u16> = g.session.cids().collect();
            for cid in open {
                if g.session
                    .connection(cid)
                    .is_some_and(|c| c.closed().is_none())
                {
                    g.session
                        .close(Instant::now(), cid, Side::Initiator, CloseReason::Local);
                }
            }
        }
        if g.ended.is_some() {
            // Unanswered task management fails with the session.
            g.tmf_waiters.clear();
        }
        if g.ended.is_some() && g.session.open_connections() == 0 {
            // Whatever the engine did not end (nothing should be left) ends here.
            for (_, tx) in g.waiters.drain() {
                let _ = tx.send(McsDone {
                    result: Err(TaskError::ConnectionLost(ConnectionError {
                        by: Side::Initiator,
                        reason: CloseReason::Local,
                    })),
                    transform: None,
                    adopted: false,
                    never_left: false,
                });
            }
        }
    }

    /// Seals the write data of reassigned tasks again for the connection each goes to, from
    /// the plaintext kept (see the module notes); one whose connection's driver side has not
    /// started yet waits for it. True when the engine got an answer.
    fn reseal(g: &mut McsInner) -> bool {
        if g.reseals.is_empty() {
            return false;
        }
        let mut answered = false;
        let pending = std::mem::take(&mut g.reseals);
        for (itt, to) in pending {
            if g.session
                .connection(to)
                .is_none_or(|c| c.closed().is_some())
            {
                // Gone: the engine asks again for the next connection.
                continue;
            }
            let Some(t) = g
                .conns
                .iter()
                .find(|c| c.cid == to)
                .and_then(|c| c.transform.clone())
            else {
                g.reseals.push((itt, to));
                continue;
            };
            let data = match g.plain.get(&itt) {
                Some((info, plain)) => match t.outbound_now(*info, plain) {
                    Some(Ok(b)) => Some(b),
                    Some(Err(e)) => {
                        tracing::warn!(itt, to, "cannot seal a reassigned write again: {e}");
                        None
                    }
                    None => None,
                },
                None => {
                    tracing::warn!(itt, to, "no plaintext kept for a reassigned write");
                    None
                }
            };
            tracing::debug!(
                itt,
                to,
                ok = data.is_some(),
                "write sealed again for its new connection"
            );
            g.session.resealed(Instant::now(), itt, to, data);
            answered = true;
        }
        answered
    }

    /// Sealed: lets commands waiting at the gate pick their connection, in arrival order, while
    /// the window has room for them (`engine::mcs::Session::free_slots`, less those let
    /// through and not yet picked); once the session is over, wakes them all (to fail).
    pub(super) fn open_gate(g: &mut McsInner) {
        if g.ended.is_some() || g.session.ended().is_some() {
            g.gate.clear();
            return;
        }
        while g.session.free_slots() > g.let_through {
            let Some(tx) = g.gate.pop_front() else {
                break;
            };
            // A waiter that went away (timed out, aborted) takes no slot.
            if tx.send(()).is_ok() {
                g.let_through += 1;
            }
        }
    }

    pub(super) fn lost(&self) -> Error {
        let reason = self
            .lock()
            .ok()
            .and_then(|g| g.ended.clone())
            .unwrap_or(ConnectionLoss::Local(LocalClose::Unknown));
        Error::ConnectionLost(reason)
    }

    /// Connection `c`'s writer wrote what it took into the socket: its tail probe is armed
    /// (the timer woken if that is now the first deadline).
    pub(super) fn flushed(&self, c: &McsConn) {
        if !self.probing.load(Ordering::Relaxed) {
            return;
        }
        let Ok(mut g) = self.inner.lock() else {
            return;
        };
        if !g.current(c) {
            return;
        }
        g.session.flushed(c.cid, Instant::now());
        let earlier = match (g.session.poll_timeout(), g.timer_at) {
            (Some(d), Some(t)) => d < t,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if earlier {
            self.wake_timer.notify_one();
        }
    }

    /// Ends connection `cid` for a reason the driver found itself.
    pub(super) fn kill(&self, conn: &McsConn, reason: ConnectionLoss) {
        let _ = conn.dead.set(reason);
        let _ = self.with(false, |g| {
            if g.current(conn) {
                g.session.close(
                    Instant::now(),
                    conn.cid,
                    Side::Initiator,
                    CloseReason::Local,
                );
            }
        });
    }
}

/// Passes the time in to every connection's engine (keepalives, command timeouts).
pub(super) async fn mcs_timer(core: Arc<McsCore>) {
    framed::drive_timer(
        &core.wake_timer,
        || {
            core.lock().map(|mut g| {
                let d = g.session.poll_timeout();
                g.timer_at = d;
                d
            })
        },
        || core.with(false, |g| g.session.handle_timeout(Instant::now())),
    )
    .await
}
