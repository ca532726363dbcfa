//! ErrorRecoveryLevel 2's relogin task (RFC 7143 §7.2, §6.3.5): a connection logged in again,
//! with the session's TSIH and a fresh CID, for each lost one, with backoff.

use super::*;

/// What the relogin task needs to log a connection of the session in again.
pub(super) struct Relogin {
    pub(super) url: IscsiUrl,
    pub(super) cfg: SessionConfig,
    pub(super) target: String,
    pub(super) tsih: u16,
}

/// ErrorRecoveryLevel 2: logs a connection in for each lost one (a fresh CID), one at a time,
/// each with backoff (`recovery::Backoff`, jittered, 100 ms doubling to 5 s).
pub(super) async fn mcs_relogin(core: Arc<McsCore>, r: Relogin) {
    loop {
        core.wake_relogin.notified().await;
        loop {
            let next = match core.lock() {
                Ok(g) if !g.logging_out => g.relogin.first().copied(),
                _ => return,
            };
            let Some(cid) = next else {
                break;
            };
            relogin_one(&core, &r, cid).await;
            if let Ok(mut g) = core.lock() {
                g.relogin.retain(|c| *c != cid);
            }
        }
    }
}

/// Logs a connection in with the session's TSIH, under a fresh CID, in place of lost
/// connection `lost` until one joins. With no connection open and none back within the
/// recovery timeout, the session ends.
async fn relogin_one(core: &Arc<McsCore>, r: &Relogin, lost: u16) {
    let mut backoff = Backoff::new();
    let patience = r
        .cfg
        .recovery_timeout
        .unwrap_or(recovery::DEFAULT_RECOVERY_TIMEOUT);
    let give_up_at = Instant::now() + patience;
    let Ok(cid) = core.lock().map(|mut g| fresh_cid(&mut g)) else {
        return;
    };
    let mut cfg = r.cfg.clone();
    cfg.login.join = Some(Join { tsih: r.tsih, cid });
    loop {
        tokio::time::sleep(backoff.next_wait()).await;
        match core.lock() {
            Ok(g) if !g.logging_out && g.ended.is_none() => {}
            _ => return,
        }
        // The target ended the session (it held none of its tasks when its last connection
        // went, RFC 7143 §7.2): no connection can join it again, so waiting is pointless.
        let mut gone = false;
        let err = match login_connection(&r.url, &cfg, &r.target).await {
            Ok(fresh) if fresh.li.done.established.tsih == r.tsih => {
                let engine = fresh.engine(&cfg);
                let added = core.with(true, |g| {
                    // The lost connection's driver side and engine member go; its tasks are
                    // the engine's recovery's, not the member's.
                    if let Some(k) = g.conns.iter().position(|c| c.cid == lost) {
                        let old = g.conns.remove(k);
                        if let Ok(t) = old.io_tasks.lock() {
                            for h in t.iter() {
                                h.abort();
                            }
                        };
                    }
                    let now = Instant::now();
                    g.session.remove(now, lost);
                    g.session.add_connection(now, cid, engine)
                });
                match added {
                    Ok(Ok(())) => match start_conn(core, cid, fresh) {
                        Ok(()) => {
                            if let Ok(mut g) = core.lock() {
                                g.recovery.relogins += 1;
                            }
                            tracing::info!(cid, lost, "connection logged in again");
                            return;
                        }
                        Err(e) => e.to_string(),
                    },
                    Ok(Err(e)) => e.to_string(),
                    Err(e) => e.to_string(),
                }
            }
            Ok(fresh) => format!(
                "joined session {:#x}, not {:#x}",
                fresh.li.done.established.tsih, r.tsih
            ),
            Err(e) => {
                gone = matches!(
                    e,
                    Error::LoginRefused {
                        class: 0x02,
                        detail: 0x0a,
                        ..
                    }
                );
                e.to_string()
            }
        };
        tracing::debug!(cid, "relogin failed: {err}");
        if gone {
            let _ = core.with(false, |g| {
                if g.session.open_connections() == 0 {
                    tracing::warn!(cid, "the target ended the session; it ends here too");
                    g.ended
                        .get_or_insert(ConnectionLoss::Local(LocalClose::Unknown));
                    g.session.give_up(
                        Instant::now(),
                        ConnectionError {
                            by: Side::Target,
                            reason: CloseReason::Local,
                        },
                    );
                }
            });
            return;
        }
        if Instant::now() >= give_up_at {
            let _ = core.with(false, |g| {
                if g.session.open_connections() == 0 {
                    tracing::warn!(cid, ?patience, "no connection came back; the session ends");
                    g.ended
                        .get_or_insert(ConnectionLoss::Local(LocalClose::Unknown));
                    g.session.give_up(
                        Instant::now(),
                        ConnectionError {
                            by: Side::Initiator,
                            reason: CloseReason::Local,
                        },
                    );
                }
            });
            return;
        }
    }
}

/// A CID no connection of the session has and no recovery names.
fn fresh_cid(g: &mut McsInner) -> u16 {
    loop {
        let cid = g.next_cid;
        g.next_cid = g.next_cid.wrapping_add(1);
        if !g.session.cids().any(|c| c == cid) && !g.session.recovering().contains(&cid) {
            return cid;
        }
    }
}
