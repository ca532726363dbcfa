//! The one LU interface the driver calls: a command whose data phase is over goes to a
//! [`Unit`] with [`Unit::submit`] and comes back as a [`Done`], whether the unit is an
//! emulated LU served here (ipsan-scsi's device server over a backend) or a pass-through to a
//! remote target's LUN (remote.rs, a gateway). Data-out arrives in plaintext and data-in
//! leaves in plaintext: Seal and the residual rules stay in `execute.rs`, the same for both.
//!
//! An emulated LU gets the typed command decoded when the command was sized
//! ([`ipsan_scsi::CommandInfo`], `luns.rs`) and never parses the CDB again; every question
//! asked here (REPORT LUNS?, async?, inline?) reads it. A pass-through forwards the CDB as the
//! host sent it, unparsed.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use ipsan_scsi::cdb::{self, op, Command};
use ipsan_scsi::{
    no_such_lun, report_luns, report_luns_decoded, CommandInfo, LogicalUnit, NexusId, OwnedRequest,
    ResetKind, ScsiRequest, ScsiResponse, Sense, SenseKey, Whole,
};
use iscsi_proto::engine::target as engine;
use iscsi_wire::header::TmfResponse;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::registry::Target;
use crate::remote::{ForwardError, RemoteNexus, RemoteSpec};

/// Who runs a command.
#[derive(Clone, Debug)]
pub(super) enum Unit {
    /// An emulated LU, and whether its backend works at memory speed (`mem`, `null`): small
    /// reads and writes then run inline instead of hopping to the blocking pool, which is most
    /// of a depth-1 command's latency on loopback.
    Emulated(Arc<LogicalUnit>, bool),
    /// A remote iSCSI LUN (remote.rs): the command is forwarded with its CDB and data, and
    /// the remote status, sense, data and residual come back unchanged. The remote LUN number.
    Remote(Arc<RemoteSpec>, u64),
    /// No such LUN: LOGICAL UNIT NOT SUPPORTED (REPORT LUNS and INQUIRY answered).
    Missing,
}

/// One command for a unit.
#[derive(Debug)]
pub(super) struct Submit<'a> {
    pub itt: u32,
    /// The LUN as this target numbers it.
    pub lun: u64,
    pub cdb: &'a [u8],
    /// The typed command of `cdb` (decoded once, when the command was sized): what an
    /// emulated LU executes. `None` for a unit that does not parse CDBs.
    pub info: Option<CommandInfo>,
    /// Data-out in plaintext, already cut to what the device server takes.
    pub data_out: Bytes,
    pub nexus: &'a NexusId,
    /// Room to seal a READ's buffer in place (sealed sessions).
    pub tailroom: bool,
    /// For a pass-through: bytes of data-out the host sent (0: none), the plaintext bytes
    /// of data-in the host takes, the R and W bits, and the host's abort of this task.
    pub forward: Forward<'a>,
}

/// What a pass-through forwards besides the CDB and data ([`Submit::forward`]).
#[derive(Debug)]
pub(super) struct Forward<'a> {
    pub need: u64,
    pub read_len: usize,
    pub read: bool,
    pub write: bool,
    pub abort: Option<&'a CancellationToken>,
    /// This host's sessions on the remote targets.
    pub remote: Option<&'a Arc<RemoteNexus>>,
}

/// A unit's answer.
#[derive(Debug)]
pub(super) struct Done {
    pub resp: engine::Response,
    /// The residual to report when the unit decided it (a remote target's); `None`: the
    /// engine and the residual rules decide.
    pub residual: Option<i64>,
    /// The remote session is gone: the host's session ends after this answer (RFC 7143
    /// §6.3.5; its initiator logs in again as after a path failure).
    pub lost: bool,
}

impl Done {
    fn local(r: ScsiResponse) -> Self {
        Self {
            resp: super::engine_response(r),
            residual: None,
            lost: false,
        }
    }
}

/// How a LOGICAL UNIT RESET of a unit ends ([`Unit::lun_reset`]).
pub(super) enum Reset {
    /// Done here: the TMF response.
    Now(TmfResponse),
    /// Forwarded to the remote LU: the response once the remote target answered.
    Forwarded(Pin<Box<dyn Future<Output = TmfResponse> + Send>>),
}

/// The largest READ/WRITE run inline on a memory-speed backend.
const INLINE_MAX_BYTES: u64 = 1 << 20;

/// Writes at least this long offer their data as a whole buffer ([`whole_write`]); a
/// shorter one is a slice of the receive buffer anyway.
const WHOLE_MIN: usize = 64 << 10;

/// A block write's data as a [`Whole`] buffer when it is one: the only handle on all of its
/// allocation (the buffer the engine received the write into, not cut by the residual rules,
/// not a slice of the receive buffer). Otherwise the data as it was, and `None`.
fn whole_write(data: Bytes, info: Option<&CommandInfo>) -> (Bytes, Option<Whole>) {
    if data.len() < WHOLE_MIN || !info.is_some_and(|i| i.family().is_block_write()) {
        return (data, None);
    }
    match Whole::from_bytes(data) {
        Ok(w) => (Bytes::new(), Some(w)),
        Err(data) => (data, None),
    }
}

impl Unit {
    /// The unit LUN `lun` of `target` is, for `cdb`: REPORT LUNS goes to the remote target
    /// only when this target mirrors it; otherwise it lists this target's LUNs, local and
    /// remote (SPC-4 §6.33). (A remote route's CDB is never decoded here: its opcode byte
    /// is the only thing read of it.)
    pub(super) fn resolve(target: Option<&Target>, lun: u64, cdb: &[u8]) -> Self {
        let Some(t) = target else {
            return Self::Missing;
        };
        if let Some(lu) = t.luns.get(&lun) {
            let fast = t
                .backends
                .iter()
                .any(|(id, b)| *id == lun && b.engine() == ipsan_scsi::Engine::Inline);
            return Self::Emulated(lu.clone(), fast);
        }
        match t
            .remote_route(lun)
            .filter(|_| !cdb::is_report_luns(cdb) || t.mirrored_remote().is_some())
        {
            Some((spec, remote_lun)) => Self::Remote(spec, remote_lun),
            None => Self::Missing,
        }
    }

    /// The emulated LU, the unit that parses its CDBs.
    pub(super) fn lu(&self) -> Option<&Arc<LogicalUnit>> {
        match self {
            Self::Emulated(lu, _) => Some(lu),
            Self::Remote(..) | Self::Missing => None,
        }
    }

    /// Whether commands are forwarded to another target.
    pub(super) fn is_remote(&self) -> bool {
        matches!(self, Self::Remote(..))
    }

    /// The block size the residual rules cut a write to, for a unit that parses its CDBs
    /// (a pass-through forwards what the host sent and the remote target applies them).
    pub(super) fn block_size(&self) -> Option<u32> {
        match self {
            Self::Emulated(lu, _) => Some(lu.block_size()),
            Self::Remote(..) | Self::Missing => None,
        }
    }

    /// The answer to a block write whose EDTL covers no whole block: nothing to write, but
    /// unit attentions, CDB checks and reservations still apply (SPC-4 §5.13), so an
    /// initiator without access gets its RESERVATION CONFLICT rather than GOOD.
    pub(super) fn checks_only(
        &self,
        nexus: &NexusId,
        cdb: &[u8],
        info: Option<&CommandInfo>,
    ) -> ScsiResponse {
        match self {
            Self::Emulated(lu, _) => match info {
                Some(i) => lu.precheck_decoded(nexus, i),
                None => lu.precheck(nexus, cdb),
            }
            .unwrap_or_else(|| ScsiResponse::good(Bytes::new())),
            Self::Remote(..) => ScsiResponse::good(Bytes::new()),
            Self::Missing => no_such_lun(cdb),
        }
    }

    /// Runs the command. `target` answers REPORT LUNS for the whole target, whichever LUN
    /// it addressed (SPC-4 §6.33).
    pub(super) async fn submit(self, cmd: Submit<'_>, target: Option<Arc<Target>>) -> Done {
        match self {
            // Boxed (as every rarely taken sub-future here): an inline future would make
            // every command's task as large as the largest path, copied at each spawn.
            Self::Remote(spec, remote_lun) => Box::pin(forward(&spec, remote_lun, cmd)).await,
            // An async backend (RBD) completes data-path commands through callbacks: the task
            // awaits them and holds no thread (ipsan_scsi::aio).
            Self::Emulated(lu, _)
                if cmd
                    .info
                    .is_some_and(|i| i.opcode != op::REPORT_LUNS && lu.runs_async_decoded(&i)) =>
            {
                let req = OwnedRequest {
                    cdb: cmd.cdb.to_vec(),
                    data_out: cmd.data_out,
                    nexus: cmd.nexus.clone(),
                    lun: cmd.lun,
                    tag: u64::from(cmd.itt),
                };
                Done::local(match cmd.info {
                    Some(info) => Box::pin(lu.execute_async_decoded(req, &info)).await,
                    None => Box::pin(lu.execute_async(req)).await,
                })
            }
            unit => {
                let info = cmd.info;
                if unit.runs_inline(info.as_ref()) {
                    // On this task: the request borrows the command, nothing is copied. A
                    // long write's data that is a buffer of its own (the one the engine
                    // received it into) goes to the LU as that buffer, which a RAM store
                    // keeps as a chunk rather than copy it (issue 27).
                    let (data_out, whole) = whole_write(cmd.data_out, info.as_ref());
                    let req = ScsiRequest {
                        cdb: cmd.cdb,
                        data_out: whole.as_ref().map_or(&data_out[..], Whole::as_bytes),
                        nexus: cmd.nexus,
                        lun: cmd.lun,
                        tailroom: cmd.tailroom,
                    };
                    return Done::local(unit.run(&req, info, target.as_deref(), whole.as_ref()));
                }
                // The blocking pool takes what it runs by value.
                let cdb = cmd.cdb.to_vec();
                let nexus = cmd.nexus.clone();
                let (lun, tailroom, data_out) = (cmd.lun, cmd.tailroom, cmd.data_out);
                let run = move || {
                    let req = ScsiRequest {
                        cdb: &cdb,
                        data_out: &data_out,
                        nexus: &nexus,
                        lun,
                        tailroom,
                    };
                    unit.run(&req, info, target.as_deref(), None)
                };
                Done::local(tokio::task::spawn_blocking(run).await.unwrap_or_else(|_| {
                    ScsiResponse::check(Sense::new(SenseKey::HARDWARE_ERROR, 0x44, 0x00))
                }))
            }
        }
    }

    /// Runs a command that is not forwarded, on the calling thread: REPORT LUNS for the whole
    /// target, an emulated LU's command (its Data-Out handed over as a `whole` buffer when it
    /// is one, [`whole_write`]), or LOGICAL UNIT NOT SUPPORTED.
    fn run(
        &self,
        req: &ScsiRequest<'_>,
        info: Option<CommandInfo>,
        target: Option<&Target>,
        whole: Option<&Whole>,
    ) -> ScsiResponse {
        // A LUN without an LU (`Missing`) has no typed command: its opcode byte says.
        let report = info.map_or(cdb::is_report_luns(req.cdb), |i| {
            i.opcode == op::REPORT_LUNS
        });
        match self {
            _ if report => {
                let luns: Vec<u64> = target
                    .map(|t| t.luns.keys().chain(t.remotes.keys()).copied().collect())
                    .unwrap_or_default();
                match info.map(|i| i.command) {
                    Some(Command::ReportLuns { select, alloc }) => {
                        report_luns_decoded(&luns, select, alloc)
                    }
                    _ => report_luns(&luns, req.cdb),
                }
            }
            Self::Emulated(lu, _) => match (&info, whole) {
                (Some(i), Some(w)) => lu.execute_decoded_whole(req, i, w),
                (Some(i), None) => lu.execute_decoded(req, i),
                (None, _) => lu.execute(req),
            },
            Self::Remote(..) | Self::Missing => no_such_lun(req.cdb),
        }
    }

    /// LOGICAL UNIT RESET (SAM-5 §7.7). An emulated LU resets now. A remote LU is reset
    /// through this host's remote session: its tasks for this host end (their answers here
    /// are suppressed by the engine), other hosts get their unit attention from the remote
    /// target, and the response says how the remote reset went (RFC 7143 §11.6.1).
    pub(super) fn lun_reset(self, nexus: &NexusId, remote: Option<&Arc<RemoteNexus>>) -> Reset {
        match (self, remote) {
            (Self::Emulated(lu, _), _) => {
                lu.reset(ResetKind::LogicalUnit, nexus);
                Reset::Now(TmfResponse::FUNCTION_COMPLETE)
            }
            (Self::Remote(spec, remote_lun), Some(r)) => {
                let r = r.clone();
                Reset::Forwarded(Box::pin(
                    async move { r.lun_reset(&spec, remote_lun).await },
                ))
            }
            _ => Reset::Now(TmfResponse::LUN_DOES_NOT_EXIST),
        }
    }

    /// Whether the (typed) command is a READ/WRITE small enough to run on the network task.
    fn runs_inline(&self, info: Option<&CommandInfo>) -> bool {
        let (Self::Emulated(lu, true), Some(i)) = (self, info) else {
            return false;
        };
        let (_, blocks) = i.extent;
        i.family().is_read_or_write()
            && u64::from(blocks) * u64::from(lu.block_size()) <= INLINE_MAX_BYTES
    }
}

/// A command to a remote LUN: forwarded with its CDB and data-out (plaintext), answered with
/// the remote target's status, sense, data and residual.
async fn forward(spec: &Arc<RemoteSpec>, remote_lun: u64, cmd: Submit<'_>) -> Done {
    let f = cmd.forward;
    let (Some(nexus), Some(abort)) = (f.remote, f.abort) else {
        return Done::local(no_such_lun(cmd.cdb));
    };
    let cdb = cmd.cdb;
    // A READ sent with the W bit (libiscsi's Read*Invalid): ipsan's initiator carries no
    // bidirectional command, and Data-In for a write would end the remote connection;
    // forwarded as the read it is, its data-out dropped (a target reads no data for it).
    let (need, data_out, read, write) = if f.write && cdb::family(cdb) == cdb::Family::Read {
        (0, Bytes::new(), true, false)
    } else {
        (f.need, cmd.data_out, f.read, f.write)
    };
    let read_len = if need > 0 { 0 } else { f.read_len };
    match nexus
        .forward(
            (spec, remote_lun),
            cdb,
            data_out,
            read_len,
            (read, write),
            abort,
        )
        .await
    {
        Ok(p) => Done {
            // A write's residual and a read's overflow are the remote target's. A read's
            // underflow the engine measures from the Data-In it sends: in a sealed session
            // (here or on the remote leg) the remote's count is in other units.
            residual: (need > 0 || p.residual < 0).then_some(p.residual),
            resp: engine::Response {
                status: p.status,
                sense: p.sense,
                data_in: p.data.freeze(),
                data_in_trailer: Bytes::new(),
            },
            lost: false,
        },
        Err(e) => {
            let lost = matches!(e, ForwardError::Lost(_));
            warn!(lun = remote_lun, remote = %spec.target_key(), opcode = cdb::opcode(cdb).unwrap_or(0), "{e}");
            let sense = match e {
                // LOGICAL UNIT COMMUNICATION FAILURE: retryable, the host decides.
                ForwardError::Lost(_) | ForwardError::Aborted(_) => {
                    Sense::new(SenseKey::ABORTED_COMMAND, 0x08, 0x00)
                }
                // INVALID COMMAND OPERATION CODE (a CDB the remote leg cannot carry).
                ForwardError::Refused(_) => Sense::new(SenseKey::ILLEGAL_REQUEST, 0x20, 0x00),
            };
            Done {
                resp: super::engine_response(ScsiResponse::check(sense)),
                residual: None,
                lost,
            }
        }
    }
}
