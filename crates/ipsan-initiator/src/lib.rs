//! ipsan-initiator: a tokio iSCSI initiator (RFC 7143) that keeps many commands in flight on
//! one session, and the engine of `ipsan bench`.
//!
//! # Layout
//! - [`url`]: `iscsi://[user[%password]@]host[:port]/target-iqn/lun` URLs (libiscsi syntax).
//! - [`login`]: the originator's login state machine, sans-IO (RFC 7143 §6.3, §13), with CHAP
//!   and mutual CHAP from `iscsi_proto::chap`.
//! - [`session`]: the runtime: connect, login, SendTargets discovery, commands in flight up to
//!   the CmdSN window, R2T answering, Data-In reassembly, NOP-Out keepalive, logout.
//! - [`scsi`]: CDBs we build and the answers we decode (sense, INQUIRY, READ CAPACITY, ...).
//! - [`trace`]: the opt-in per-command event trace behind `ipsan bench --trace` and the lab's
//!   command timeline.
//! - [`transform`]: the payload hook where Seal encrypts writes and decrypts reads.
//! - [`autodepth`]: `--depth auto`, a sans-IO controller that adapts the depth from live
//!   throughput and latency.
//! - [`bench`]: workload generator, latency histogram, CPU accounting, `--verify` pattern and
//!   the JSON result schema of `ipsan bench` (documented in `docs/bench.md`).
//! - [`progress`]: the live progress display of `ipsan bench` (bar on a TTY, lines otherwise).
//! - [`error`]: typed errors by scope.

mod conn;

pub mod autodepth;
pub mod bench;
pub mod error;
pub mod login;
pub mod progress;
pub mod scsi;
pub mod seal;
pub mod session;
pub mod trace;
pub mod transform;
pub mod url;

pub use error::{Error, Result};
pub use iscsi_proto::chap::ChapSecret;
pub use login::{ChapCredentials, DigestChoice, LoginOptions, Negotiated, OriginatorExtension};
pub use session::{discover, DataDir, DiscoveredTarget, ExtensionFactory, Session, SessionConfig};
pub use transform::{CommandInfo, PayloadTransform, TransformFuture};
pub use url::IscsiUrl;
