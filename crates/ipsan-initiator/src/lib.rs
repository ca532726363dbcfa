//! ipsan-initiator: a tokio iSCSI initiator (RFC 7143) that keeps many commands in flight on
//! one session. `ipsan bench` drives it from its own crate, `ipsan-bench`, and watches its
//! commands through the [`observe`] hook.
//!
//! # Layout
//! - [`url`]: `iscsi://[user[%password]@]host[:port]/target-iqn/lun` URLs (libiscsi syntax).
//! - [`login`]: the originator's login: iscsi-proto's state machine
//!   (`iscsi_proto::login::originator`, CHAP and mutual CHAP included; its PDUs built and
//!   read by `originator::LoginExchange`) with this initiator's extension trait (Seal's
//!   transform and record layer) and the [`Negotiated`] view `ipsan bench` reports;
//!   `session/login.rs` moves its PDUs over the socket.
//! - [`seal`]: Seal's login extension and the payload transform that seals and opens data.
//! - [`session`]: the tokio driver of iscsi-proto's sans-IO machines: sockets, timers,
//!   wake-ups. The engine (`engine::session` over `engine::initiator`) holds the task table,
//!   the CmdSN window, R2T answering, Data-In reassembly, keepalive, logout and which commands
//!   a recovered session sends again; `LoginExchange` and `iscsi_proto::discovery` build the
//!   login, SendTargets and discovery-logout PDUs. One concern per file: `session.rs` (types,
//!   event dispatch), `session/login.rs` (connect, login), `session/discover.rs`
//!   (SendTargets), `session/open.rs` (open, accessors, logout), `session/io.rs` (commands,
//!   the payload transform around them, SCSI helpers), `session/reconnect.rs` (recovery
//!   supervisor), `session/framed.rs` (reader, writer and timer tasks over
//!   `ipsan-transport`'s `FrameReader`/`FrameWriter`, the framing the target uses too) and
//!   `session/passthrough.rs`: [`Session::command_to`], any CDB to any LUN answered with the
//!   target's status, raw sense, data and residual unchanged (a gateway's remote leg);
//!   `session/mcs.rs`: [`McsSession`], a session of several connections (RFC 7143 §4.2,
//!   issue 28): the driver of `iscsi_proto::engine::mcs`, each sealed connection with its own
//!   Seal login; no session recovery yet, but ErrorRecoveryLevel 2's connection recovery
//!   (relogin, TASK REASSIGN); `command_to_abortable`/`lun_reset_to` for a gateway's remote
//!   leg. Under `session/mcs/`: `dispatch.rs` (the engine under its lock, its events, the
//!   timer), `command.rs` (commands, made again after a reassignment; SCSI helpers, task
//!   management), `conns.rs` (one reader and writer per connection), `relogin.rs` (ERL 2).
//! - [`recovery`]: session recovery's driver side (reconnect backoff, counters) and the
//!   engine's reissue policy re-exported (`is_idempotent`, the not-reissued sense;
//!   RFC 7143 §6.3.5).
//! - [`scsi`]: the CDBs we send (built by `ipsan_scsi::cdb::build`) and the answers we decode
//!   (sense, INQUIRY, READ CAPACITY, ...).
//! - [`observe`]: the opt-in per-command observer hook ([`CommandObserver`]); the benchmark's
//!   trace (`ipsan-bench`) is one observer.
//! - [`transform`]: the payload hook where Seal encrypts writes and decrypts reads.
//! - [`error`]: typed errors by scope.
//! - [`nvme`]: the NVMe/TCP host (issue 30): [`nvme::NvmeSession`] (admin queue bring-up,
//!   Keep Alive, N I/O queues of one TCP connection each), [`nvme::discover`] and
//!   [`nvme::NvmeUrl`] (`nvme+tcp://host[:port]/subsysnqn/nsid`); the driver of
//!   `nvme_proto::host`.

mod conn;

pub mod error;
pub mod login;
pub mod nvme;
pub mod observe;
pub mod recovery;
pub mod scsi;
pub mod seal;
pub mod session;
pub mod transform;
pub mod url;

pub use error::{ConnectionLoss, Error, IoOp, LocalClose, Result};
pub use iscsi_proto::secret_file;

/// A Seal pre-shared secret file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum PskFileError {
    /// Readable or writable by someone other than its owner, or missing.
    #[error(transparent)]
    Mode(#[from] secret_file::SecretFileError),
    /// Unreadable or not a usable secret.
    #[error(transparent)]
    Secret(#[from] ipsan_seal::SecretError),
}

/// Reads a Seal pre-shared secret from `path`: the one loader every subcommand uses, so every
/// secret file passes the same mode check ([`secret_file::check_mode`]) before
/// [`ipsan_seal::Psk::from_file`] reads (and judges) it.
pub fn psk_from_file(path: &std::path::Path) -> std::result::Result<ipsan_seal::Psk, PskFileError> {
    secret_file::check_mode(path)?;
    Ok(ipsan_seal::Psk::from_file(path)?)
}
pub use iscsi_proto::chap::{ChapAlgorithm, ChapSecret};
pub use iscsi_proto::engine::mcs::Spread;
pub use login::{
    ChapCredentials, ChapRelay, DigestChoice, LoginOptions, Negotiated, OriginatorExtension,
    RelayedChallenge, RelayedResponse, RelayedVerdict,
};
pub use observe::{CommandEvent, CommandObserver};
pub use recovery::RecoveryStats;
pub use session::{
    discover, DataDir, DiscoveredTarget, ExtensionFactory, McsConfig, McsRecovery, McsSession,
    Passthrough, Session, SessionConfig,
};
pub use transform::{CommandInfo, PayloadTransform, TransformFuture};
pub use url::IscsiUrl;
