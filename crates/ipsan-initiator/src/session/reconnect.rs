//! Session recovery's driver side ([`crate::recovery`]): the supervisor that reconnects with
//! backoff and reinstates the session (RFC 7143 §6.3.5), and the clock that passes the time
//! in while no connection is up.

use super::*;

/// Passes the time in to the engine session while it has no connection, so commands kept
/// for recovery end with `RecoveryTimedOut` at the recovery timeout.
pub(super) async fn recovery_clock(core: Arc<Core>) {
    loop {
        let Ok(Some(d)) = core.with(|g| g.session.poll_timeout()) else {
            return;
        };
        tokio::time::sleep_until(d.into()).await;
        if core
            .with(|g| g.session.handle_timeout(Instant::now()))
            .is_err()
        {
            return;
        }
    }
}

/// The recovery supervisor of a session ([`crate::recovery`]): waits for the connection to
/// end, then reconnects with backoff, reinstating the session (same InitiatorName and ISID,
/// TSIH 0: RFC 7143 §6.3.5) with a fresh login extension (fresh Seal keys), until a login
/// succeeds or is refused for good (status class 2). The engine session keeps the commands
/// in flight and sends them again on the new connection (`attach_quiet`, `reissue`); new
/// commands wait on [`Link::state`].
pub(super) async fn supervise(
    link: Arc<Link>,
    url: IscsiUrl,
    cfg: SessionConfig,
    target: String,
    lun: u64,
) {
    let Some(limit) = link.recovery_timeout else {
        return;
    };
    let core = link.core.clone();
    loop {
        let Some(conn) = link.up() else { return };
        let mut ended = conn.st.ended.subscribe();
        if ended.wait_for(|e| *e).await.is_err() || link.closing.load(Ordering::Acquire) {
            return;
        }
        let since = Instant::now();
        let reason = conn
            .lost()
            .connection_loss()
            .unwrap_or(ConnectionLoss::Local(LocalClose::Unknown));
        let generation = conn.st.generation;
        drop(conn);
        let c = &core.counters;
        Counters::bump(&c.losses);
        let (reissued0, failed0) = (Counters::get(&c.reissued), Counters::get(&c.not_idempotent));
        tracing::warn!(
            %reason,
            "connection lost; recovering the session (RFC 7143 §6.3.5 reinstatement), commands wait up to {limit:?}"
        );
        link.state.send_replace(LinkState::Recovering {
            since,
            reason: reason.clone(),
        });
        let clock = AbortOnDrop(tokio::spawn(recovery_clock(core.clone())).abort_handle());
        let mut backoff = Backoff::new();
        let mut expired = false;
        let mut attempts = 0u64;
        let fresh = loop {
            if link.closing.load(Ordering::Acquire) {
                return;
            }
            Counters::bump(&c.reconnects);
            attempts += 1;
            match login_connection(&url, &cfg, &target).await {
                Ok(s) => break s,
                Err(Error::LoginRefused {
                    class: 2,
                    detail,
                    message,
                }) => {
                    tracing::error!(
                        "session recovery stopped: the reinstating login was refused ({message}, status class 2 detail {detail:#04x})"
                    );
                    let _ = core.refused.set((detail, message));
                    let _ = core.with(|g| {
                        g.session.end(
                            Instant::now(),
                            ConnectionError {
                                by: Side::Target,
                                reason: CloseReason::Local,
                            },
                        )
                    });
                    link.state.send_replace(LinkState::Refused {
                        class: 2,
                        detail,
                        message,
                    });
                    return;
                }
                Err(e) => tracing::debug!(attempts, "reconnect failed: {e}"),
            }
            if !expired && since.elapsed() >= limit {
                expired = true;
                tracing::warn!(
                    "session not recovered within {limit:?}: commands fail until a reconnect succeeds"
                );
            }
            tokio::time::sleep(backoff.next_wait()).await;
        };
        drop(clock);
        // The new connection becomes the engine session's current one; the commands kept
        // from the old one wait until the unit attention is cleared.
        let st = Arc::new(ConnState::new(generation + 1, fresh.li.transform.clone()));
        let engine_conn = fresh.engine(&cfg);
        let attached = core.with(|g| {
            g.conn = st.clone();
            g.timer_at = None;
            g.session.attach_quiet(Instant::now(), engine_conn);
        });
        if attached.is_err() {
            return;
        }
        let fresh = Unpublished(Some(fresh.start(core.clone(), st)));
        // A reinstated nexus is a new nexus to the target: it may report a unit attention
        // (POWER ON OR RESET, 29h/xxh) to its first command. Consume it here, as a host's
        // SCSI layer would, so reissued commands see only their own status.
        if let Some(s) = &fresh.0 {
            let mut ended = s.st.ended.subscribe();
            for _ in 0..4 {
                let Ok((itt, rx)) = s.submit(
                    lun,
                    scsi::test_unit_ready(),
                    DataDir::None,
                    None,
                    Binding::Free,
                    Until::Timeout,
                ) else {
                    break;
                };
                let answer = tokio::select! {
                    (r, _) = s.wait_ended(itt, rx, Until::Timeout) => r,
                    // Lost again: the engine would keep this TEST UNIT READY for the next
                    // connection, which only this task makes. It is not the caller's.
                    _ = ended.wait_for(|e| *e) => {
                        let _ = s.core.with(|g| g.session.withdraw(itt));
                        break;
                    }
                };
                let ua = matches!(
                    answer.and_then(Passthrough::into_completion),
                    Err(Error::Scsi { sense: Some(ref x), .. }) if x.key == SenseKey::UNIT_ATTENTION
                );
                if !ua {
                    break;
                }
            }
            let _ = s.core.with(|g| g.session.reissue(Instant::now()));
        }
        let mut fresh = fresh;
        let Some(s) = fresh.0.take() else { return };
        let took = since.elapsed();
        c.recovered(took);
        let tsih = s.params.tsih;
        link.state.send_replace(LinkState::Up(s));
        tracing::info!(
            took_ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
            attempts,
            tsih,
            reissued = Counters::get(&c.reissued) - reissued0,
            failed_not_idempotent = Counters::get(&c.not_idempotent) - failed0,
            "session recovered in {took:?}"
        );
    }
}

/// Aborts a task when dropped (the supervisor's recovery clock, whatever way it leaves).
pub(super) struct AbortOnDrop(AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
