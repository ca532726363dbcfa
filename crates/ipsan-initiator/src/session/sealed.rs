//! A command's data through the payload transform (Seal, docs/seal.md §2): a write's data is
//! sealed under the connection's keys and the command's ITT before it is submitted (under
//! `none` the caller's bytes go as they are, the trailer after them: `wire_data`), and sealed
//! again from the caller's plaintext when the engine rebinds the task to a new connection
//! (`Done::Rebind`, a reissue after session recovery); a read's data is opened with the keys of
//! the connection it completed on. The engine decides when a task is rebound; this file only
//! runs the crypto, which is asynchronous (a worker pool) and so stays out of the engine.

use super::*;

impl Session {
    /// A write through the transform `t`; see the module doc.
    pub(super) async fn sealed_write(
        &self,
        c: &Shared,
        t: Arc<dyn PayloadTransform>,
        info: CommandInfo,
        cdb: [u8; 16],
        plain: Bytes,
        until: Until<'_>,
    ) -> Result<Passthrough> {
        let tr = c.core.observer.get();
        let (lun, itt) = (info.lun, info.itt);
        // Sealed under this connection's keys and the ITT: a reissue on another connection
        // seals the caller's plaintext again (Event::Rebind). The engine does not keep the
        // sealed form; we keep the plaintext (a reference).
        observe::note(tr, itt, CommandEvent::SealStart, 0, plain.len() as u64);
        // Without recovery no reissue comes: no second reference to the plaintext.
        let keep = self.link.recovery_timeout.map(|_| plain.clone());
        let wire = wire_data(&*t, info, plain).await?;
        let wire_len = wire.write_len().unwrap_or(0) as u64;
        observe::note(tr, itt, CommandEvent::SealEnd, 0, wire_len);
        let (itt, mut rx) = match c.submit_here(lun, cdb, wire, Some(itt), until)? {
            Some(submitted) => submitted,
            // Session recovery replaced the connection while the data was being sealed:
            // sealed again for the current one (only with recovery on is there a new one).
            None => {
                let Some(plain) = keep.clone() else {
                    return Err(c.lost());
                };
                let mut plain = plain;
                loop {
                    let now = self.connection_until(until).await?;
                    let t = self
                        .transform
                        .clone()
                        .or_else(|| now.st.transform.clone())
                        .unwrap_or_else(|| t.clone());
                    let wire = wire_data(&*t, info, plain.clone()).await?;
                    if let Some(submitted) = now.submit_here(lun, cdb, wire, Some(itt), until)? {
                        break submitted;
                    }
                    plain = keep.clone().unwrap_or(plain);
                }
            }
        };
        loop {
            match c.wait(itt, rx, until).await {
                Done::Ended(r, _) => return r,
                Done::Rebind(fresh) => {
                    let Some(plain) = keep.clone() else {
                        return Err(c.lost());
                    };
                    let t = self
                        .transform
                        .clone()
                        .or(fresh)
                        .unwrap_or_else(|| t.clone());
                    // The new waiter first: whatever ends the task meanwhile reaches it.
                    let (tx, next) = oneshot::channel();
                    c.core.with(|g| {
                        let generation = g.conn.generation;
                        g.waiters.insert(itt, (tx, generation))
                    })?;
                    rx = next;
                    match wire_data(&*t, info, plain).await {
                        Ok(wire) => {
                            // Refused when that connection is gone too: the next one asks
                            // again.
                            let _ = c
                                .core
                                .with_timer(|g| g.session.resubmit(Instant::now(), itt, wire))?;
                        }
                        Err(e) => {
                            c.core.with(|g| {
                                g.waiters.remove(&itt);
                                g.session.withdraw(itt);
                            })?;
                            return Err(e);
                        }
                    }
                }
            }
        }
    }

    /// A read through the transform `t` of `len` plaintext bytes into `buf`; see the module
    /// doc.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn sealed_read(
        &self,
        c: &Shared,
        t: Arc<dyn PayloadTransform>,
        info: CommandInfo,
        cdb: [u8; 16],
        buf: BytesMut,
        len: usize,
        until: Until<'_>,
    ) -> Result<Passthrough> {
        let tr = c.core.observer.get();
        let itt = info.itt;
        let wire_len = t.wire_len(len).ok_or_else(|| {
            Error::InvalidRequest(format!("{len} bytes cannot be carried by the transform"))
        })?;
        let (itt, rx) = c.submit(
            info.lun,
            cdb,
            DataDir::Read(buf, wire_len),
            Some(itt),
            Binding::Free,
            until,
        )?;
        let (r, on) = c.wait_ended(itt, rx, until).await;
        let mut done = r?;
        // Opened with the keys of the connection it completed on (a reissued read completes
        // on a later one).
        let t = self.transform.clone().or(on).unwrap_or(t);
        // A status without data (CHECK CONDITION, say) has nothing to open.
        if !done.data.is_empty() {
            observe::note(tr, itt, CommandEvent::OpenStart, 0, done.data.len() as u64);
            done.data = t.inbound(info, done.data).await?;
            observe::note(tr, itt, CommandEvent::OpenEnd, 0, done.data.len() as u64);
        }
        Ok(done)
    }
}

/// `plain` as it goes on the wire under `t`: the caller's bytes themselves and `t`'s tail when
/// `t` leaves the data unchanged (Seal `none`: its trailer; issue 27: no copy of the data and
/// nothing for a crypto worker to do), otherwise what `t` seals (a copy).
pub(super) async fn wire_data(
    t: &dyn PayloadTransform,
    info: CommandInfo,
    plain: Bytes,
) -> Result<engine::Data> {
    match t.outbound_tail(info, plain.len()) {
        Some(tail) => Ok(engine::Data::WriteParts {
            data: plain,
            tail: tail?,
        }),
        None => Ok(engine::Data::Write(t.outbound(info, plain).await?)),
    }
}
