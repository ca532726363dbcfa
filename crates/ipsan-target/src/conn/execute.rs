//! One command whose data phase is over, from the engine's [`engine::Execute`] to its
//! answer: Seal opens data-out before the unit sees it, the overflow and underflow rules
//! (`iscsi_proto::engine::residual`, RFC 7143 §11.4.5.1) apply in plaintext bytes, the same
//! for every session and every unit, the [`Unit`] runs it, and Seal seals data-in after.
//!
//! The CDB was parsed once, when the engine sized the command (`luns.rs`); its typed command
//! ([`ipsan_scsi::CommandInfo`]) comes back here with the engine's task and answers every question about the
//! command (Seal's binding extent, the WRITE's count field, the metrics kind) and is what the
//! LU executes. Only a pass-through's CDB, which nothing here decodes, is read as bytes.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ipsan_scsi::{
    cdb as scsi_cdb, decode_lun, CommandInfo, ScsiResponse, ScsiStatus, Sense, SenseKey,
};
use ipsan_seal::SealSession;
use iscsi_proto::engine::residual;
use iscsi_proto::engine::target as engine;
use tracing::{info, warn};

use super::unit::{Forward, Submit, Unit};
use super::{engine_response, Session, LOGOUT_WAIT_SECS};
use crate::lock;
use crate::metrics::Op;

/// CHECK CONDITION, ABORTED COMMAND / SECURITY ERROR (0Bh/74h/00h): the answer when this
/// side cannot seal data-in, or when data-out's Seal counters run past the session's limit.
fn seal_security_error() -> ScsiResponse {
    ScsiResponse::check(Sense::new(SenseKey::ABORTED_COMMAND, 0x74, 0x00))
}

/// The answer to data-out whose Seal counters run past the session's limit
/// ([`seal_security_error`]); `None` for other open failures.
fn seal_limit_response(e: &ipsan_seal::OpenError) -> Option<ScsiResponse> {
    matches!(e, ipsan_seal::OpenError::CounterLimit { .. }).then(seal_security_error)
}

/// INVALID FIELD IN COMMAND INFORMATION UNIT: an overflow nothing is written for, or an
/// EDTL that is no sealed length.
fn refused() -> ScsiResponse {
    let (k, asc, ascq) = residual::REFUSED_SENSE;
    ScsiResponse::check(Sense::new(SenseKey(k), asc, ascq))
}

impl Session {
    /// Runs one command whose data phase is over and hands its answer to the engine: the one
    /// place a command reaches a logical unit.
    pub(super) async fn execute(self: Arc<Self>, x: engine::Execute<CommandInfo>) {
        let itt = x.itt;
        let lun = decode_lun(x.lun.to_be_bytes());
        // One registry lookup per command, not one per question.
        let target = self.target();
        let timer = self.stats.start(lun);
        let unit = Unit::resolve(target.as_deref(), lun, &x.cdb);
        let remote = unit.is_remote();
        // The residual when the unit or the rules decide it (None: the engine measures it).
        let mut residual: Option<i64> = None;
        let mut cdb = x.cdb;
        let mut data_out = x.data_out;
        let mut pre: Option<ScsiResponse> = None;
        let mut early = x.early;
        // The typed command `Luns::size` decoded, carried by the engine's task; a unit that
        // parses no CDB has none. An LU that appeared after the command was sized decodes it
        // now.
        let kept = x.decoded;
        let mut info = None;
        if let (Some(lu), None) = (unit.lu(), &early) {
            match kept.map_or_else(|| lu.command_info(&cdb), Ok) {
                Ok(i) => info = Some(i),
                Err(sense) => pre = Some(ScsiResponse::check(sense)),
            }
        }
        // Bound to the command as the initiator sent it, before an overflow rewrites it.
        let (opcode, extent) = match &info {
            Some(i) => (i.opcode, i.extent),
            None => (scsi_cdb::opcode(&cdb).unwrap_or(0), scsi_cdb::extent(&cdb)),
        };
        let seal = self.seal.clone().map(|s| {
            (
                s,
                self.shared.pool.clone(),
                ipsan_seal::Binding::of_command(x.lun, itt, opcode, extent),
            )
        });
        // A Seal counter at its hard limit: this command fails, then the connection closes.
        let mut seal_exhausted = false;
        let sealed_write = seal.is_some() && early.is_none() && !data_out.is_empty();
        if let (Some((session, pool, binding)), None, false) = (&seal, &early, data_out.is_empty())
        {
            // Verify and decrypt before anything reaches the backend (docs/seal.md §5): in
            // place when the write buffer is uniquely owned, else out of place from the
            // receive buffer it shares (no copy first; `CryptoPool::open_shared`).
            let sealed = std::mem::take(&mut data_out);
            match Box::pin(pool.open_shared(session, *binding, sealed)).await {
                Ok(plain) => data_out = plain,
                Err(e) => {
                    self.stats.seal_open_failed(&e);
                    warn!(
                        itt,
                        lun,
                        lba = binding.lba,
                        blocks = binding.blocks,
                        opcode = binding.opcode,
                        "seal: data-out refused: {e}"
                    );
                    pre = Some(ScsiResponse::check(Sense::new(
                        SenseKey(ipsan_seal::sense::SENSE_KEY),
                        ipsan_seal::sense::ASC,
                        ipsan_seal::sense::ASCQ,
                    )));
                    if let Some(r) = seal_limit_response(&e) {
                        pre = Some(r);
                        seal_exhausted = true;
                    }
                }
            }
        }
        // EDTL as the device server counts it: plaintext bytes in a Seal session; a data-out
        // command sent without the W bit has none. An EDTL that is no sealed length of any
        // plaintext is refused (for a local LU `Luns::size` refused it already).
        let edtl = if x.write_without_w {
            Some(0)
        } else {
            match &self.seal {
                // A compressed write carries its plaintext length in its (authenticated)
                // header, not in its EDTL: what opened is it (docs/seal.md §4b).
                Some(s) if s.compression().is_on() && sealed_write => Some(data_out.len() as u64),
                Some(s) => s.plain_len(x.edtl as usize).map(|n| n as u64),
                None => Some(u64::from(x.edtl)),
            }
        };
        let edtl = match edtl {
            Some(n) => n,
            None => {
                pre = pre.or_else(|| Some(refused()));
                0
            }
        };
        // The overflow and underflow rules (RFC 7143 §11.4.5.1), the same for every session:
        // for a unit that parses its CDBs (a pass-through's remote target applies its own).
        if let (Some(bs), None, None, true) = (unit.block_size(), &early, &pre, x.transfer > 0) {
            let transfer = usize::try_from(x.transfer).unwrap_or(usize::MAX);
            // Where a block write's TRANSFER LENGTH sits: the typed command's table entry.
            let count = info
                .filter(|i| i.family().is_block_write())
                .and_then(|i| i.op.field.count_bytes());
            match residual::fit_write(&mut cdb, count, bs, x.transfer, edtl) {
                residual::WriteFit::Whole => data_out.truncate(transfer),
                residual::WriteFit::Truncated { bytes } => {
                    data_out.truncate(bytes);
                    // The CDB now says fewer blocks: the typed command follows it, so the LU
                    // writes the whole blocks EDTL covers and no more.
                    match scsi_cdb::decode(&cdb, bs) {
                        Ok(i) => info = Some(i),
                        Err(sense) => pre = Some(ScsiResponse::check(sense)),
                    }
                }
                residual::WriteFit::NoBlocks => {
                    pre = Some(unit.checks_only(&self.nexus, &cdb, info.as_ref()));
                }
                residual::WriteFit::Refused => pre = Some(refused()),
            }
            residual = Some(residual::residual(x.transfer, edtl));
        }
        // A host's ABORT TASK may have come before this (registered cancelled).
        // The remote session is gone: this host's session ends after this answer.
        let mut lost = false;
        let abort = remote.then(|| lock(&self.core.forwarded).entry(itt).or_default().clone());
        let mut resp = match (early.take(), pre) {
            (Some(r), _) => r,
            (None, Some(r)) => engine_response(r),
            (None, None) => {
                let cmd = Submit {
                    itt,
                    lun,
                    cdb: &cdb,
                    info,
                    data_out,
                    nexus: &self.nexus,
                    // Room to seal in place, unless the data goes as it is (`none`): then
                    // a RAM store answers with its own memory, no copy (issue 27).
                    tailroom: self.seal.as_ref().is_some_and(|s| s.seals_in_buffer()),
                    forward: Forward {
                        need: x.need,
                        read_len: usize::try_from(edtl).unwrap_or(usize::MAX),
                        read: x.read,
                        write: x.write,
                        abort: abort.as_ref(),
                        remote: self.remote.as_ref(),
                    },
                };
                let done = unit.submit(cmd, target).await;
                if done.lost {
                    warn!(initiator = %self.params.initiator_name, "the remote session is lost; this session ends after this answer");
                }
                lost = done.lost;
                residual = done.residual.or(residual);
                done.resp
            }
        };
        if let (Some(_), true) = (&seal, !remote && x.transfer == 0) {
            // A sealed read answered here: the plaintext is cut to the plaintext EDTL before
            // it is sealed (sealed data cannot be cut after), and an overflow reported in
            // plaintext bytes. An underflow the engine measures in the bytes it sends, which
            // the initiator cuts its Data-In by. (A remote unit read only `read_len`.)
            let produced = resp.data_in.len() as u64;
            if produced > edtl {
                resp.data_in
                    .truncate(usize::try_from(edtl).unwrap_or(usize::MAX));
                residual = Some(residual::residual(produced, edtl));
            }
        }
        if let (Some((session, pool, binding)), false) = (&seal, resp.data_in.is_empty()) {
            // `none` changes no byte: the data goes as it is (a RAM store's own memory) and
            // its trailer in a Data-In of its own, no copy (issue 27). The device server
            // leaves room past the data (`read_tailroom`): seal its buffer in place, no copy.
            // Otherwise (shared, or too little room) seal a copy, encrypted out of place on
            // the crypto workers into a reused buffer.
            let plain = std::mem::take(&mut resp.data_in);
            let room = session.sealed_len(plain.len()).unwrap_or(usize::MAX);
            let sealed = match session.none_trailer(plain.len()) {
                Ok(Some(trailer)) => {
                    resp.data_in_trailer = trailer;
                    Ok(plain)
                }
                Ok(None) => match plain.try_into_mut() {
                    Ok(buf) if buf.capacity() >= room => {
                        Box::pin(pool.seal(session, *binding, buf)).await
                    }
                    Ok(buf) => Box::pin(pool.seal_copy(session, *binding, buf.freeze())).await,
                    Err(shared) => Box::pin(pool.seal_copy(session, *binding, shared)).await,
                },
                Err(e) => Err(e),
            };
            match sealed {
                Ok(sealed) => resp.data_in = sealed,
                Err(e) => {
                    warn!(itt, "seal: cannot seal data-in: {e}");
                    resp = engine_response(seal_security_error());
                    seal_exhausted = e == ipsan_seal::SealError::CounterExhausted;
                }
            }
        }
        let (op, blocks) = match &info {
            Some(i) => (Op::of_family(i.family()), i.extent.1),
            None => (Op::of(&cdb), scsi_cdb::extent(&cdb).1),
        };
        timer.done_as(
            op,
            blocks,
            ScsiStatus(resp.status),
            resp.sense
                .as_ref()
                .and_then(|s| s.get(2))
                .map(|k| SenseKey(k & 0x0f)),
        );
        let closed = {
            let mut e = self.engine();
            e.complete_with_residual(itt, resp, residual);
            if remote {
                // Under the engine lock: an abort sees the task running or the token gone.
                lock(&self.core.forwarded).remove(&itt);
            }
            if let Some((session, _, _)) = &seal {
                self.seal_counter_watch(&mut e, session, seal_exhausted);
            }
            if lost {
                e.close_locally();
            }
            e.closed().is_some()
        };
        self.wake_writer.notify_one();
        if closed {
            // Closed here (Seal limits, a lost remote session): the reader must see it.
            self.wake_reader.notify_one();
        }
    }

    /// After a sealed command: at the hard counter limit close the connection (the command has
    /// its CHECK CONDITION); past the high-water mark ask once for a logout with an
    /// Asynchronous Message, AsyncEvent 1 "target requests logout" (RFC 7143 §11.9.1), so the
    /// initiator logs in again and both sides derive fresh keys (docs/seal.md).
    fn seal_counter_watch(
        &self,
        e: &mut super::mcs::Eng<'_>,
        session: &SealSession,
        exhausted: bool,
    ) {
        let (sent, received) = session.counters_used();
        if exhausted {
            warn!(
                sent,
                received,
                limit = session.counter_limit(),
                "seal: counter limit reached; closing the connection"
            );
            e.close_locally();
            return;
        }
        if session.rekey_due() && !self.rekey_asked.swap(true, Ordering::AcqRel) {
            info!(
                sent,
                received,
                mark = session.rekey_mark(),
                "seal: counters past the re-key mark; asking the initiator to log out (AsyncEvent 1)"
            );
            e.request_logout(LOGOUT_WAIT_SECS);
        }
    }
}
