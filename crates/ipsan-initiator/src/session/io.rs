//! Commands: the one path every command takes (`exchange`: the payload transform's seal and
//! open around it, bound to the ITT, sealed again when the engine rebinds it to a new
//! connection), the SCSI helpers (READ/WRITE(16), INQUIRY, READ CAPACITY, ...) and the
//! engine-side submission, waiting and task management (`Shared`).

use super::*;

impl Session {
    /// Send one SCSI command and wait for its completion. Waits (in the engine's queue) while
    /// the CmdSN window is closed. A non-GOOD status becomes [`Error::Scsi`]. With a payload
    /// transform installed, data-out is transformed before sending and Data-In after
    /// reassembly; a read's `len` is the plaintext length. With recovery on, a connection
    /// loss is ridden out as [`crate::recovery`] describes.
    pub async fn command(&self, cdb: [u8; 16], dir: DataDir) -> Result<Completion> {
        self.exchange(self.lun, cdb, dir, Until::Timeout)
            .await
            .and_then(Passthrough::into_completion)
    }

    /// One command to `lun` (the 8-byte LUN field as sent, SAM-5 §4.7), answered with any
    /// status: the one path [`Session::command`] and [`Session::command_to`] share, recovery
    /// included (the engine session sends it again on the next connection when it may).
    /// `until`: what may end the command before its status (see [`Until`]).
    pub(super) async fn exchange(
        &self,
        lun: u64,
        cdb: [u8; 16],
        dir: DataDir,
        until: Until<'_>,
    ) -> Result<Passthrough> {
        let c = self.connection_until(until).await?;
        let tr = c.core.observer.get();
        let transform = self.transform.clone().or_else(|| c.st.transform.clone());
        if transform.is_none() && tr.is_none() {
            // Nothing binds to the ITT before it is sent: the submission allocates it, under
            // the same lock (a plain session's hot path).
            let (itt, rx) = c.submit(lun, cdb, dir, None, Binding::Free, until)?;
            return c.wait_ended(itt, rx, until).await.0;
        }
        // The ITT is fixed before the transform runs because the transform binds to it (and
        // the observer sees the command issued before it is sent). It stays the command's
        // ITT on every connection it is sent on.
        let itt = c.core.with(|g| g.session.alloc_itt())?;
        let pending = observe::Pending::issued(tr, itt);
        let Some(t) = transform else {
            let (itt, rx) = c.submit(lun, cdb, dir, Some(itt), Binding::Free, until)?;
            return pending.finish(c.wait_ended(itt, rx, until).await.0);
        };
        let info = CommandInfo::of(lun, itt, &cdb);
        let r = match dir {
            DataDir::None => {
                let submitted = c.submit(lun, cdb, DataDir::None, Some(itt), Binding::Free, until);
                match submitted {
                    Ok((itt, rx)) => c.wait_ended(itt, rx, until).await.0,
                    Err(e) => Err(e),
                }
            }
            DataDir::Write(plain) => self.sealed_write(&c, t, info, cdb, plain, until).await,
            DataDir::Read(buf, len) => self.sealed_read(&c, t, info, cdb, buf, len, until).await,
            // Sealed data is opened before it is dropped: a discarded read still checks it.
            DataDir::Discard(len) => self
                .sealed_read(&c, t, info, cdb, BytesMut::new(), len, until)
                .await
                .map(|mut p| {
                    p.data = BytesMut::new();
                    p
                }),
        };
        pending.finish(r)
    }

    /// LOGICAL UNIT RESET of this session's LUN (RFC 7143 §11.5.1, SAM-5 §7.7): the target
    /// aborts every task on the LUN (from every initiator) and reports a unit attention to the
    /// other sessions' next command. This session's commands on the LUN that are still in
    /// flight fail with [`Error::TaskAborted`]: the target sends no status for them. Fails with
    /// [`Error::TaskManagement`] if the target does not complete the reset, and drops the
    /// connection if it does not answer within [`TMF_TIMEOUT`].
    pub async fn lun_reset(&self) -> Result<()> {
        let c = self.connection().await?;
        c.lun_reset(self.lun).await
    }

    /// READ(16) of `blocks` blocks at `lba`, into a fresh buffer.
    pub async fn read(&self, lba: u64, blocks: u32) -> Result<BytesMut> {
        self.read_into(lba, blocks, BytesMut::new()).await
    }

    /// READ(16) reusing `buf` (resized to the transfer length): the data comes back in it or
    /// in another buffer handed in with a read on this connection (the engine binds a read's
    /// buffer when its data arrives, the one handed in last, `iscsi_proto`'s `Data::Read`).
    pub async fn read_into(&self, lba: u64, blocks: u32, buf: BytesMut) -> Result<BytesMut> {
        let len = read_len(&self.capacity, blocks)?;
        let c = self
            .command(scsi::read16(lba, blocks), DataDir::Read(buf, len))
            .await?;
        read_data(c, len)
    }

    /// READ(16) of `blocks` blocks at `lba` whose data is checked, counted and dropped as it
    /// arrives ([`DataDir::Discard`]; `ipsan bench --sink discard`): fails as
    /// [`Session::read_into`] does when the target answers with fewer bytes.
    pub async fn read_discard(&self, lba: u64, blocks: u32) -> Result<()> {
        let len = read_len(&self.capacity, blocks)?;
        let c = self
            .command(scsi::read16(lba, blocks), DataDir::Discard(len))
            .await?;
        discarded(&c, len)
    }

    pub(super) async fn write_inner(&self, lba: u64, data: Bytes, fua: bool) -> Result<()> {
        let blocks = write_blocks(&self.capacity, &data)?;
        self.command(scsi::write16(lba, blocks, fua), DataDir::Write(data))
            .await?;
        Ok(())
    }

    /// WRITE(16) of `data` (a whole number of blocks) at `lba`.
    pub async fn write(&self, lba: u64, data: Bytes) -> Result<()> {
        self.write_inner(lba, data, false).await
    }

    /// WRITE(16) with FUA: the target must make it durable before answering.
    pub async fn write_fua(&self, lba: u64, data: Bytes) -> Result<()> {
        self.write_inner(lba, data, true).await
    }

    /// SYNCHRONIZE CACHE(10) over the whole LUN.
    pub async fn sync_cache(&self) -> Result<()> {
        self.command(scsi::sync_cache10(), DataDir::None).await?;
        Ok(())
    }

    /// Standard INQUIRY.
    pub async fn inquiry(&self) -> Result<Inquiry> {
        let c = self
            .command(scsi::inquiry(96), DataDir::Read(BytesMut::new(), 96))
            .await?;
        inquiry_data(&c)
    }

    /// READ CAPACITY(16), falling back to (10); remembers the block length for read/write.
    pub async fn read_capacity(&self) -> Result<Capacity> {
        let cap = match self
            .command(scsi::read_capacity16(), DataDir::Read(BytesMut::new(), 32))
            .await
        {
            Ok(c) => Capacity::parse16(&c.data),
            Err(Error::Scsi { sense: Some(s), .. }) if s.key == SenseKey::ILLEGAL_REQUEST => {
                let c = self
                    .command(scsi::read_capacity10(), DataDir::Read(BytesMut::new(), 8))
                    .await?;
                Capacity::parse10(&c.data)
            }
            Err(e) => return Err(e),
        };
        remember_capacity(&self.capacity, cap)
    }

    /// REPORT LUNS.
    pub async fn report_luns(&self) -> Result<Vec<u64>> {
        let c = self
            .command(
                scsi::report_luns(4096),
                DataDir::Read(BytesMut::new(), 4096),
            )
            .await?;
        Ok(scsi::parse_report_luns(&c.data))
    }
}

impl Shared {
    /// Submits one command to the engine session (ITT `itt`, or a fresh one); its end (or a
    /// request for its data again) comes on the returned receiver. While the connection is
    /// lost and recovery is on, the engine keeps it for the next connection.
    pub(super) fn submit(
        &self,
        lun: u64,
        cdb: [u8; 16],
        dir: DataDir,
        itt: Option<u32>,
        binding: Binding,
        until: Until<'_>,
    ) -> Result<(u32, oneshot::Receiver<Done>)> {
        let data = match dir {
            DataDir::None => engine::Data::None,
            DataDir::Write(b) => engine::Data::Write(b),
            DataDir::Read(buf, len) => engine::Data::Read {
                buf,
                len: u32::try_from(len)
                    .map_err(|_| Error::InvalidRequest("transfer over 4 GiB".into()))?,
            },
            DataDir::Discard(len) => engine::Data::Discard {
                len: u32::try_from(len)
                    .map_err(|_| Error::InvalidRequest("transfer over 4 GiB".into()))?,
            },
        };
        self.submit_checked(lun, cdb, data, itt, binding, until, false)?
            .ok_or_else(|| self.st.lost())
    }

    /// [`Shared::submit`] of data made for this connection (sealed under its keys): `None`, and
    /// nothing submitted, when a newer connection has replaced it in the session meanwhile —
    /// the engine would send the data on that one, whose keys it was not sealed under, and the
    /// target would refuse it (74h/04h). The caller seals again for the current connection.
    pub(super) fn submit_here(
        &self,
        lun: u64,
        cdb: [u8; 16],
        data: engine::Data,
        itt: Option<u32>,
        until: Until<'_>,
    ) -> Result<Option<(u32, oneshot::Receiver<Done>)>> {
        self.submit_checked(lun, cdb, data, itt, Binding::Bound, until, true)
    }

    #[allow(clippy::too_many_arguments)]
    fn submit_checked(
        &self,
        lun: u64,
        cdb: [u8; 16],
        data: engine::Data,
        itt: Option<u32>,
        binding: Binding,
        until: Until<'_>,
        only_here: bool,
    ) -> Result<Option<(u32, oneshot::Receiver<Done>)>> {
        let (tx, rx) = oneshot::channel();
        let cmd = engine::Command {
            lun,
            cdb,
            data,
            timed: until.timed(),
        };
        // One lock for the ITT (when the caller has none yet) and the submission.
        let counters = &self.core.counters;
        self.core.with_timer(|g| {
            if only_here && g.conn.generation != self.st.generation {
                return Ok(None);
            }
            let itt = itt.unwrap_or_else(|| g.session.alloc_itt());
            match g.session.submit_as(Instant::now(), itt, cmd, binding) {
                Ok(itt) => {
                    // The connection whose transform the caller holds (`self`), which may
                    // already have been replaced: then the completion brings the new one.
                    g.waiters.insert(itt, (tx, self.st.generation));
                    Ok(Some((itt, rx)))
                }
                Err(proto::SubmitError::LogoutRequested) => Err(Error::LogoutRequested),
                Err(proto::SubmitError::RecoveryTimedOut { after, lost }) => {
                    Counters::bump(&counters.timed_out);
                    Err(Error::RecoveryTimedOut {
                        after,
                        reason: g.conn.loss(lost),
                    })
                }
                // After a refused reinstating login: that refusal (`Core::lost`).
                Err(proto::SubmitError::Closed(_)) => Err(self.core.lost(&g.conn)),
                Err(_) => Err(Error::InvalidRequest("transfer over 4 GiB".into())),
            }
        })?
    }

    /// Waits for command `itt` to end (or to need its data again). The engine ends it: with
    /// its status, or past the command timeout with `TimedOut` or the connection's end (its
    /// escalation, RFC 7143 §11.5.1), or a session recovery decision; or the caller aborts it.
    pub(super) async fn wait(
        &self,
        itt: u32,
        rx: oneshot::Receiver<Done>,
        until: Until<'_>,
    ) -> Done {
        match until {
            Until::Abort(abort) => {
                let mut rx = rx;
                tokio::select! {
                    biased;
                    r = &mut rx => r.unwrap_or_else(|_| Done::Ended(Err(self.lost()), None)),
                    () = abort.cancelled() => Done::Ended(self.abort_asked(itt, rx).await, None),
                }
            }
            Until::Status | Until::Timeout => rx
                .await
                .unwrap_or_else(|_| Done::Ended(Err(self.lost()), None)),
        }
    }

    /// A command's end, as [`Shared::wait`] gives it, for a command whose data is not made
    /// per connection (a `Rebind` cannot come for it).
    pub(super) async fn wait_ended(
        &self,
        itt: u32,
        rx: oneshot::Receiver<Done>,
        until: Until<'_>,
    ) -> (Result<Passthrough>, Option<Arc<dyn PayloadTransform>>) {
        match self.wait(itt, rx, until).await {
            Done::Ended(r, t) => (r, t),
            Done::Rebind(_) => (Err(self.lost()), None),
        }
    }

    /// See [`Session::lun_reset`].
    pub(super) async fn lun_reset(&self, lun: u64) -> Result<()> {
        self.refuse_after_logout_request()?;
        let (tx, rx) = oneshot::channel();
        self.core.with_timer(|g| {
            if let Some(itt) = g.session.lun_reset(Instant::now(), lun) {
                g.tmf_waiters.insert(itt, tx);
            }
        })?;
        // The engine drops the connection when the answer does not come within TMF_TIMEOUT.
        match rx.await {
            Ok(TmfResponse::FUNCTION_COMPLETE) => Ok(()),
            Ok(other) => Err(Error::TaskManagement(other.0)),
            Err(_) => Err(self.lost()),
        }
    }

    pub(super) fn refuse_after_logout_request(&self) -> Result<()> {
        if self.st.logout_asked.load(Ordering::Acquire) {
            return Err(Error::LogoutRequested);
        }
        Ok(())
    }

    /// ABORT TASK asked by the caller ([`Until::Abort`]; RFC 7143 §11.5.1): a gateway
    /// forwarding its host's ABORT TASK. The task stays in the engine until the response, so
    /// its PDUs are still handled in order. Ends with [`Error::TaskAborted`] when the target
    /// ended the task (Function complete, or Task does not exist: it finished and its status
    /// crossed the abort), or with the command's own answer when that came first or the
    /// target refused the abort (the command then runs to its end; §11.6.1). A command kept
    /// for the next connection ends at once, never sent again.
    pub(super) async fn abort_asked(
        &self,
        itt: u32,
        mut rx: oneshot::Receiver<Done>,
    ) -> Result<Passthrough> {
        tracing::debug!(itt, "ABORT TASK asked by the caller");
        let (tx, mut tmf_rx) = oneshot::channel();
        self.core.with_timer(|g| {
            if let Some(t) = g.session.abort(Instant::now(), itt) {
                g.tmf_waiters.insert(t, tx);
            }
        })?;
        let ended = |d: std::result::Result<Done, oneshot::error::RecvError>| match d {
            Ok(Done::Ended(r, _)) => r,
            _ => Err(self.lost()),
        };
        let first = tokio::select! {
            biased;
            r = &mut rx => Ok(r),
            t = &mut tmf_rx => Err(t),
        };
        match first {
            Ok(r) => ended(r),
            Err(Ok(response)) if ends_the_task(response) => {
                Err(Error::TaskAborted("ABORT TASK".into()))
            }
            // Refused, or no TMF sent (the task had ended): the command's own answer.
            Err(_) => ended(rx.await),
        }
    }

    /// See [`Session::logout`].
    pub(super) async fn logout(&self) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        let sent = self.core.with_timer(|g| {
            let itt = g.session.logout(Instant::now());
            if itt.is_some() {
                g.closed_waiters.push(tx);
            }
            itt
        })?;
        if sent.is_none() {
            return Err(self.lost());
        }
        match tokio::time::timeout(Duration::from_secs(5), rx).await {
            Ok(Ok(())) => {
                let ok = self
                    .core
                    .with(|g| g.session.connection().closed())?
                    .is_some_and(|e| e.reason == CloseReason::Logout);
                if ok {
                    Ok(())
                } else {
                    Err(self.lost())
                }
            }
            Ok(Err(_)) => Err(self.lost()),
            Err(_) => Err(Error::Timeout("logout")),
        }
    }
}

// The block-command checks both drivers ([`super::Session`] and [`super::McsSession`]) share:
// each builds the CDB and sends it its own way, the lengths and answers are checked here once.

/// The block length READ CAPACITY found.
pub(super) fn block_len(capacity: &OnceLock<Capacity>) -> Result<u32> {
    capacity
        .get()
        .map(|c| c.block_len)
        .ok_or_else(|| Error::InvalidRequest("capacity unknown: call read_capacity".into()))
}

/// The bytes a READ of `blocks` blocks moves (none is refused).
pub(super) fn read_len(capacity: &OnceLock<Capacity>, blocks: u32) -> Result<usize> {
    if blocks == 0 {
        return Err(Error::InvalidRequest("read of zero blocks".into()));
    }
    Ok(blocks as usize * block_len(capacity)? as usize)
}

/// A READ's data, which must be exactly the `len` bytes asked for.
pub(super) fn read_data(c: Completion, len: usize) -> Result<BytesMut> {
    if c.data.len() != len {
        return Err(Error::Protocol(format!(
            "READ returned {} of {len} bytes",
            c.data.len()
        )));
    }
    Ok(c.data)
}

/// A discarded READ's answer ([`DataDir::Discard`]): all `len` bytes came (the engine fails a
/// GOOD status with fewer than it announced) unless the target reports an underflow, which
/// [`read_data`] refuses for a kept read too.
pub(super) fn discarded(c: &Completion, len: usize) -> Result<()> {
    if c.residual > 0 {
        let got = (len as u64).saturating_sub(c.residual as u64);
        return Err(Error::Protocol(format!(
            "READ returned {got} of {len} bytes"
        )));
    }
    Ok(())
}

/// The blocks a WRITE of `data` covers: a positive whole number of blocks.
pub(super) fn write_blocks(capacity: &OnceLock<Capacity>, data: &[u8]) -> Result<u32> {
    let bl = block_len(capacity)? as usize;
    if data.is_empty() || data.len() % bl != 0 {
        return Err(Error::InvalidRequest(format!(
            "write of {} bytes is not a positive multiple of the {bl}-byte block",
            data.len()
        )));
    }
    u32::try_from(data.len() / bl).map_err(|_| Error::InvalidRequest("write too large".into()))
}

/// Standard INQUIRY data.
pub(super) fn inquiry_data(c: &Completion) -> Result<Inquiry> {
    Inquiry::parse(&c.data).ok_or_else(|| Error::Protocol("short INQUIRY data".into()))
}

/// A READ CAPACITY answer (`None`: too short), checked and remembered for reads and writes.
pub(super) fn remember_capacity(
    capacity: &OnceLock<Capacity>,
    cap: Option<Capacity>,
) -> Result<Capacity> {
    let cap = cap.ok_or_else(|| Error::Protocol("short READ CAPACITY data".into()))?;
    if cap.block_len == 0 || cap.block_len % 512 != 0 {
        return Err(Error::Protocol(format!(
            "unsupported block length {}",
            cap.block_len
        )));
    }
    let _ = capacity.set(cap);
    Ok(cap)
}

/// READ CAPACITY until it answers, past the UNIT ATTENTIONs a fresh nexus reports (at most
/// four tries).
pub(super) async fn past_unit_attention<F, Fut>(mut read_capacity: F) -> Result<Capacity>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Capacity>>,
{
    let mut last = None;
    for _ in 0..4 {
        match read_capacity().await {
            Ok(c) => return Ok(c),
            Err(e) if e.sense().is_some_and(|s| s.key == SenseKey::UNIT_ATTENTION) => {
                last = Some(e)
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or(Error::Timeout("read capacity")))
}
