//! The commands of a session of several connections: each made for the connection it goes on
//! (sealed: under its keys), submitted to `engine::mcs`, awaited, and made again when
//! ErrorRecoveryLevel 2 moved it where its data cannot go (RFC 7143 §4.2.3, §7.2); the SCSI
//! helpers and task management (ABORT TASK, LOGICAL UNIT RESET, §11.5.1) over them.

use super::*;

/// What one try of a command came to.
enum Attempt {
    Done(Passthrough),
    /// Made for a connection that is gone before it left, or a read whose data is sealed for a
    /// failed connection: made again, for another (ErrorRecoveryLevel 2).
    Again(&'static str),
    /// No connection is open (ErrorRecoveryLevel 2 logs one in): wait, then try again.
    Wait,
}

/// What the data of a read adopted by TASK REASSIGN (ErrorRecoveryLevel 2) came to.
#[derive(Debug)]
pub(super) enum Adopted {
    /// It opened under the keys of the connection it completed on.
    Opened(BytesMut),
    /// Sealed for the connection the read was first sent on (the target sealed it before the
    /// reassignment): not forged, but never used on another connection; read again.
    Stale,
    /// It opens under neither: refused as a forgery (and read again).
    Forged,
}

/// Opens an adopted read's data under `keys`, the connection it completed on; what does not
/// open there is checked under `first`'s, the connection it was first sent on, only to tell
/// a stale Data-In from a forged one (that plaintext is dropped: nothing sealed for one
/// connection is used on another). Neither check logs a refusal; the caller says which it was.
pub(super) async fn open_adopted(
    info: CommandInfo,
    data: BytesMut,
    keys: &Arc<dyn PayloadTransform>,
    first: &Arc<dyn PayloadTransform>,
) -> Adopted {
    let copy = (!Arc::ptr_eq(keys, first)).then(|| data.clone());
    if let Ok(d) = keys.inbound_quiet(info, data).await {
        return Adopted::Opened(d);
    }
    let stale = match copy {
        Some(c) => first.inbound_quiet(info, c).await.is_ok(),
        None => false,
    };
    if stale {
        Adopted::Stale
    } else {
        Adopted::Forged
    }
}

/// A command picked for a connection and not yet submitted ([`mcs::Session::pick_for`]):
/// counted there until it is submitted, or until this drops (its data could not be made, or
/// its caller went away mid-seal).
struct Reserved<'a> {
    core: &'a McsCore,
    picked: Option<mcs::Picked>,
}

impl Reserved<'_> {
    /// Submitted now: the caller unpicks it under the lock it submits under.
    fn take(&mut self) -> Option<mcs::Picked> {
        self.picked.take()
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.picked.take() {
            if let Ok(mut g) = self.core.lock() {
                g.session.unpick(p);
                // Its slot of the window goes to the next command at the gate.
                McsCore::open_gate(&mut g);
            }
        }
    }
}

/// A sealed command's turn at the session's window (`McsCore::open_gate`): it was let
/// through the gate and holds a slot until it picks its connection (or, dropped, gives it
/// back to the next waiter).
struct Turn<'a> {
    core: &'a McsCore,
    through: bool,
}

impl Turn<'_> {
    /// It picks now (under the lock it picks under): its slot is the pick's from here.
    fn settle(&mut self, g: &mut McsInner) {
        if std::mem::take(&mut self.through) {
            g.let_through = g.let_through.saturating_sub(1);
        }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if self.through {
            if let Ok(mut g) = self.core.lock() {
                g.let_through = g.let_through.saturating_sub(1);
                McsCore::open_gate(&mut g);
            }
        }
    }
}

/// Tries of one command at most (each a new ITT), counting only [`Attempt::Again`].
const MAX_TRIES: u32 = 8;

impl McsSession {
    /// One SCSI command to the session's LUN; a non-GOOD status is [`Error::Scsi`]. With Seal,
    /// the data is sealed (and Data-In opened) under the keys of the connection it goes on.
    pub async fn command(&self, cdb: [u8; 16], dir: DataDir) -> Result<Completion> {
        self.exchange(self.lun, cdb, dir, self.timed, None)
            .await?
            .into_completion()
    }

    /// [`Session::command_to`] on this session: `cdb` to LUN `lun` (the raw 8-byte LUN field),
    /// answered as the target answered, whatever the status (a gateway's remote leg). No
    /// command timeout applies (the host times its commands out).
    pub async fn command_to(&self, lun: u64, cdb: [u8; 16], dir: DataDir) -> Result<Passthrough> {
        self.exchange(lun, cdb, dir, false, None).await
    }

    /// [`McsSession::command_to`] that `abort` can end: once it is cancelled, ABORT TASK goes
    /// on the command's connection (its allegiance, RFC 7143 §11.5.1) and the command ends
    /// with [`Error::TaskAborted`] when the target ended it, or with its own answer if that
    /// came first or the target refused the abort (§11.6.1). A gateway forwards its host's
    /// aborts this way.
    pub async fn command_to_abortable(
        &self,
        lun: u64,
        cdb: [u8; 16],
        dir: DataDir,
        abort: &tokio_util::sync::CancellationToken,
    ) -> Result<Passthrough> {
        self.exchange(lun, cdb, dir, false, Some(abort)).await
    }

    /// LOGICAL UNIT RESET of LUN `lun` (the raw 8-byte LUN field; RFC 7143 §11.5.1) on one
    /// connection. The target ends the LU's tasks of every connection; the engine ends this
    /// session's on the reset's connection, and those on the others end here with an ABORT
    /// TASK each (answered "task does not exist", §11.6.1), so none waits for a status that
    /// will not come. Fails with [`Error::TaskManagement`] if the target refuses the reset.
    pub async fn lun_reset_to(&self, lun: u64) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        let cid = self.core.with(true, |g| {
            if let Some(e) = &g.ended {
                return Err(Error::ConnectionLost(e.clone()));
            }
            let (cid, itt) =
                g.session
                    .lun_reset(Instant::now(), lun)
                    .ok_or(Error::ConnectionLost(ConnectionLoss::Local(
                        LocalClose::Unknown,
                    )))?;
            g.tmf_waiters.insert(itt, tx);
            Ok(cid)
        })??;
        let response = rx.await.map_err(|_| self.core.lost())?;
        if response != TmfResponse::FUNCTION_COMPLETE {
            return Err(Error::TaskManagement(response.0));
        }
        self.core
            .with(true, |g| g.session.end_reset_lun(Instant::now(), cid, lun))?;
        Ok(())
    }

    /// One command, answered with any status (the one path of [`McsSession::command`] and
    /// [`McsSession::command_to`]). `timed`: [`SessionConfig::command_timeout`] applies;
    /// `abort`: the caller's token (see [`McsSession::command_to_abortable`]).
    async fn exchange(
        &self,
        lun: u64,
        cdb: [u8; 16],
        dir: DataDir,
        timed: bool,
        abort: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<Passthrough> {
        // A discarded read's data is dropped as it arrives, or (sealed) opened and dropped at
        // the end.
        let discard = matches!(dir, DataDir::Discard(_));
        let (mut write, mut read) = match dir {
            DataDir::None => (None, None),
            DataDir::Write(b) => (Some(b), None),
            DataDir::Read(buf, len) => (None, Some((buf, len))),
            DataDir::Discard(len) => (None, Some((BytesMut::new(), len))),
        };
        let mut tries = 0u32;
        let mut waiting_since: Option<tokio::time::Instant> = None;
        loop {
            if abort.is_some_and(tokio_util::sync::CancellationToken::is_cancelled) {
                return Err(Error::TaskAborted("ABORT TASK".into()));
            }
            // Another try gets a fresh read buffer (the last one went with the engine's task).
            let dir = match (write.take(), read.take()) {
                (Some(b), _) => {
                    write = Some(b.clone());
                    DataDir::Write(b)
                }
                (None, Some((_, len))) if discard => {
                    read = Some((BytesMut::new(), len));
                    DataDir::Discard(len)
                }
                (None, Some((buf, len))) => {
                    read = Some((BytesMut::new(), len));
                    DataDir::Read(buf, len)
                }
                (None, None) => DataDir::None,
            };
            match self.exchange_once(lun, cdb, dir, timed, abort).await? {
                Attempt::Done(mut p) => {
                    if discard {
                        p.data = BytesMut::new();
                    }
                    return Ok(p);
                }
                Attempt::Wait => {
                    // ErrorRecoveryLevel 2 logs a connection in, or the session ends.
                    let since = *waiting_since.get_or_insert_with(tokio::time::Instant::now);
                    if since.elapsed() > self.patience {
                        return Err(self.core.lost());
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Attempt::Again(why) => {
                    tries += 1;
                    if tries >= MAX_TRIES {
                        return Err(Error::ConnectionLost(ConnectionLoss::Local(
                            LocalClose::Unknown,
                        )));
                    }
                    tracing::debug!(tries, "command made again: {why}");
                }
            }
        }
    }

    /// Sealed: waits, in arrival order, until the session's window has room for one more
    /// command (issue 28). A sealed command's connection is chosen when it is picked, and its
    /// data sealed for that connection; picked while the window is shut, it waited on that
    /// connection (chosen on what the sockets held then) for as long as the window stayed
    /// shut, and with more commands queued than the target's window takes (256 against 128)
    /// that was a whole window's time: a connection a loss had slowed meanwhile kept its
    /// share, and every later command waited behind it at the target (CmdSN order, RFC 7143
    /// §4.2.2.1; docs/results/mcs-depth). Here it picks when it can go. Plain sessions pass:
    /// the engine places their commands when the window lets them go. `limit`: a timed
    /// command still waiting this long ends as the engine's would ([`Error::CommandTimedOut`]).
    async fn window_turn(
        &self,
        limit: Option<Duration>,
        abort: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<Turn<'_>> {
        let mut turn = Turn {
            core: &self.core,
            through: false,
        };
        if !self.core.sealed {
            // Plain sessions pass without taking the lock.
            return Ok(turn);
        }
        // The plain lock, not `McsCore::with`: nothing of the engine changes here, and after
        // every change the gate was opened as far as the window allows (so a command finding
        // others waiting finds no room either).
        let rx = {
            let mut g = self.core.lock()?;
            if let Some(e) = &g.ended {
                return Err(Error::ConnectionLost(e.clone()));
            }
            if g.gate.is_empty() && g.session.free_slots() > g.let_through {
                // Room now: the slot is this command's until it picks (`Turn::settle`, under
                // the pick's lock). Not taken, another command passing here before this one
                // picked (another worker thread, the lock let go in between) saw the same
                // room, and one of the two waited on its connection with the window shut.
                g.let_through += 1;
                turn.through = true;
                None
            } else {
                let (tx, rx) = oneshot::channel();
                g.gate.push_back(tx);
                McsCore::open_gate(&mut g);
                Some(rx)
            }
        };
        let Some(mut rx) = rx else {
            return Ok(turn);
        };
        let expired = async {
            match limit {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        let cancelled = async {
            match abort {
                Some(a) => a.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = &mut rx => {
                if r.is_err() {
                    // The session ended (the gate was cleared).
                    return Err(self.core.lost());
                }
                turn.through = true;
                Ok(turn)
            }
            () = expired => {
                // Let through just now: the slot goes back (`Turn`'s drop).
                turn.through = rx.try_recv().is_ok();
                Err(Error::CommandTimedOut(limit.unwrap_or_default()))
            }
            () = cancelled => {
                turn.through = rx.try_recv().is_ok();
                Err(Error::TaskAborted("ABORT TASK".into()))
            }
        }
    }

    /// One try of [`McsSession::exchange`], under a fresh ITT.
    async fn exchange_once(
        &self,
        lun: u64,
        cdb: [u8; 16],
        dir: DataDir,
        timed: bool,
        abort: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<Attempt> {
        // Sealed: the connection first (its data is made for it, under its keys), counting
        // the command as its own from the pick to the submission (`Reserved`): sealing runs on
        // a crypto worker, and commands picked meanwhile must see this one there. Plain: the
        // engine places the command when the window lets it go, on the load of that moment.
        let len = match &dir {
            DataDir::None => 0,
            DataDir::Write(p) => p.len(),
            DataDir::Read(_, len) | DataDir::Discard(len) => *len,
        };
        let limit = self.command_timeout.filter(|_| timed);
        let mut turn = self.window_turn(limit, abort).await?;
        let picked = self.core.with(false, |g| {
            turn.settle(g);
            if let Some(e) = &g.ended {
                return Err(Error::ConnectionLost(e.clone()));
            }
            if !g.sealed {
                return Ok(Some((None, g.session.alloc_itt(), None)));
            }
            let Some(p) = g.session.pick_for(u64::try_from(len).unwrap_or(u64::MAX)) else {
                if g.session.recovers_connections() && g.session.ended().is_none() {
                    // None open now: ErrorRecoveryLevel 2 logs one in.
                    return Ok(None);
                }
                return Err(Error::ConnectionLost(ConnectionLoss::Local(
                    LocalClose::Unknown,
                )));
            };
            let Some(t) = g
                .conns
                .iter()
                .find(|c| c.cid == p.cid)
                .and_then(|c| c.transform.clone())
            else {
                // Logged in again a moment ago, its driver side not started yet: never
                // unsealed, wait for it.
                g.session.unpick(p);
                return Ok(None);
            };
            Ok(Some((Some(p), g.session.alloc_itt(), Some(t))))
        })??;
        let Some((picked, itt, t)) = picked else {
            return Ok(Attempt::Wait);
        };
        let cid = picked.as_ref().map(|p| p.cid);
        let mut reserved = Reserved {
            core: &self.core,
            picked,
        };
        let info = CommandInfo::of(lun, itt, &cdb);
        let mut plain = None;
        // Sealed, a discarded read is received and opened as a read's (`exchange` drops its
        // data after): what is dropped was checked.
        let dir = match dir {
            DataDir::Discard(len) if t.is_some() => DataDir::Read(BytesMut::new(), len),
            d => d,
        };
        let (data, read_len) = match dir {
            DataDir::None => (engine::Data::None, None),
            DataDir::Write(p) => {
                let wire = match &t {
                    Some(t) => {
                        plain = Some(p.clone());
                        super::sealed::wire_data(&**t, info, p).await?
                    }
                    None => engine::Data::Write(p),
                };
                (wire, None)
            }
            DataDir::Discard(len) => (
                engine::Data::Discard {
                    len: u32::try_from(len)
                        .map_err(|_| Error::InvalidRequest("read too large".into()))?,
                },
                None,
            ),
            DataDir::Read(buf, len) => {
                let wire_len = match &t {
                    Some(t) => t.wire_len(len).ok_or_else(|| {
                        Error::InvalidRequest(format!(
                            "{len} bytes cannot be carried by the transform"
                        ))
                    })?,
                    None => len,
                };
                let wire_len = u32::try_from(wire_len)
                    .map_err(|_| Error::InvalidRequest("read too large".into()))?;
                (engine::Data::Read { buf, len: wire_len }, Some(len))
            }
        };
        let cmd = engine::Command {
            lun,
            cdb,
            data,
            timed,
        };
        let (tx, rx) = oneshot::channel();
        let picked = reserved.take();
        let submitted = self.core.with(true, |g| {
            if let Some(p) = picked {
                // From here the connection counts it as submitted (or it is not).
                g.session.unpick(p);
            }
            let now = Instant::now();
            let recovering = g.session.recovers_connections()
                && g.session.ended().is_none()
                && g.ended.is_none();
            let r = match cid {
                Some(cid) => g.session.submit_on(now, cid, itt, cmd),
                None => g.session.submit_as(now, itt, cmd),
            };
            match r {
                Ok(_) => {
                    if cid.is_some() && g.session.allegiance(itt).is_none() {
                        g.waited_pinned += 1;
                    }
                }
                // The connection it was sealed for stopped taking commands while it was
                // sealed: made again for another.
                Err(mcs::SubmitError::Invalid) if cid.is_some() && recovering => {
                    return Ok(false);
                }
                Err(mcs::SubmitError::Closed(e)) => {
                    return Err(Error::ConnectionLost(
                        g.ended
                            .clone()
                            .unwrap_or_else(|| ConnectionLoss::from_engine(e)),
                    ))
                }
                Err(e) => return Err(Error::InvalidRequest(format!("submit: {e}"))),
            }
            if let (Some(p), true) = (plain, recovering) {
                // ErrorRecoveryLevel 2 seals it again if it is reassigned.
                g.plain.insert(itt, (info, p));
            }
            g.waiters.insert(itt, tx);
            Ok::<_, Error>(true)
        })??;
        if !submitted {
            return Ok(Attempt::Again(
                "its connection was lost while it was sealed",
            ));
        }
        let r = match abort {
            None => rx.await,
            Some(a) => {
                let mut rx = rx;
                tokio::select! {
                    biased;
                    r = &mut rx => r,
                    () = a.cancelled() => {
                        // The engine ends the task when the target confirms the abort; a
                        // refused abort leaves it to its own answer.
                        tracing::debug!(itt, "ABORT TASK asked by the caller");
                        self.core.with(true, |g| g.session.abort(Instant::now(), itt))?;
                        rx.await
                    }
                }
            }
        }
        .map_err(|_| self.core.lost())?;
        let c = match r.result {
            Ok(c) => c,
            Err(TaskError::ConnectionLost(_)) if r.never_left && self.recovering() => {
                // Sealed for a connection that failed before it left (never sent).
                return Ok(Attempt::Again("its connection failed before it left"));
            }
            Err(e) => return Err(self.task_error(e)),
        };
        let mut p = Passthrough {
            status: c.status,
            sense: c.sense,
            data: c.data,
            residual: c.residual,
        };
        if let (Some(t), Some(_)) = (&t, read_len) {
            // Whatever the status: data that came is sealed (a status without data has none),
            // under the keys of the connection it came on (reassigned: the new one's).
            if !p.data.is_empty() {
                let keys = r.transform.as_ref().unwrap_or(t);
                if r.adopted {
                    return Ok(match open_adopted(info, p.data, keys, t).await {
                        Adopted::Opened(d) => {
                            p.data = d;
                            Attempt::Done(p)
                        }
                        Adopted::Stale => {
                            tracing::debug!(
                                itt = info.itt,
                                "seal: a reassigned read's Data-In was sealed for its failed connection (stale, not forged): read again"
                            );
                            Attempt::Again(
                                "a reassigned read's data was sealed for the failed connection",
                            )
                        }
                        Adopted::Forged => {
                            tracing::warn!(
                                itt = info.itt,
                                "seal: data-in refused: a reassigned read's Data-In opened under neither its connection's keys nor its failed connection's"
                            );
                            Attempt::Again("a reassigned read's data did not open")
                        }
                    });
                }
                p.data = keys.inbound(info, p.data).await?;
            }
        }
        Ok(Attempt::Done(p))
    }

    /// ErrorRecoveryLevel 2 is on and the session goes on.
    fn recovering(&self) -> bool {
        self.core.lock().is_ok_and(|g| {
            g.session.recovers_connections() && g.session.ended().is_none() && g.ended.is_none()
        })
    }

    fn task_error(&self, e: TaskError) -> Error {
        match e {
            TaskError::IscsiResponse(r) => Error::IscsiResponse(r),
            TaskError::Rejected(r) => Error::Rejected(r.0),
            TaskError::Aborted(AbortedBy::LunReset) => {
                Error::TaskAborted("LOGICAL UNIT RESET".into())
            }
            TaskError::Aborted(AbortedBy::AbortTask) => Error::TaskAborted("ABORT TASK".into()),
            TaskError::Violation(v) => Error::TargetViolation(v),
            TaskError::TimedOut { after, .. } => Error::CommandTimedOut(after),
            TaskError::ConnectionLost(e) => Error::ConnectionLost(
                self.core
                    .lock()
                    .ok()
                    .and_then(|g| g.ended.clone())
                    .unwrap_or_else(|| ConnectionLoss::from_engine(e)),
            ),
            _ => self.core.lost(),
        }
    }

    /// READ(16) of `blocks` blocks at `lba`, into a fresh buffer.
    pub async fn read(&self, lba: u64, blocks: u32) -> Result<BytesMut> {
        self.read_into(lba, blocks, BytesMut::new()).await
    }

    /// READ(16) of `blocks` blocks at `lba`, reusing `buf`.
    pub async fn read_into(&self, lba: u64, blocks: u32, buf: BytesMut) -> Result<BytesMut> {
        let len = io::read_len(&self.capacity, blocks)?;
        let c = self
            .command(scsi::read16(lba, blocks), DataDir::Read(buf, len))
            .await?;
        io::read_data(c, len)
    }

    /// READ(16) of `blocks` blocks at `lba` whose data is dropped ([`DataDir::Discard`]).
    pub async fn read_discard(&self, lba: u64, blocks: u32) -> Result<()> {
        let len = io::read_len(&self.capacity, blocks)?;
        let c = self
            .command(scsi::read16(lba, blocks), DataDir::Discard(len))
            .await?;
        io::discarded(&c, len)
    }

    /// WRITE(16) of `data` (a whole number of blocks) at `lba`.
    pub async fn write(&self, lba: u64, data: Bytes) -> Result<()> {
        let blocks = io::write_blocks(&self.capacity, &data)?;
        self.command(scsi::write16(lba, blocks, false), DataDir::Write(data))
            .await?;
        Ok(())
    }

    /// Standard INQUIRY.
    pub async fn inquiry(&self) -> Result<Inquiry> {
        let c = self
            .command(scsi::inquiry(96), DataDir::Read(BytesMut::new(), 96))
            .await?;
        io::inquiry_data(&c)
    }

    /// READ CAPACITY(16); remembers the block length for read/write.
    pub async fn read_capacity(&self) -> Result<Capacity> {
        let c = self
            .command(scsi::read_capacity16(), DataDir::Read(BytesMut::new(), 32))
            .await?;
        io::remember_capacity(&self.capacity, Capacity::parse16(&c.data))
    }
}
