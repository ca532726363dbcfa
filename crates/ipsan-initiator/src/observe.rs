//! The session's observer hook: what happened to each command and when, for whoever wants to
//! watch (the benchmark's trace, `ipsan-bench`'s `trace` module, is one such observer; the
//! file format lives there, not here).
//!
//! Zero cost when off: the session holds an `OnceLock<Arc<dyn CommandObserver>>` that is empty
//! unless [`crate::Session::set_observer`] was called, and every hook is one `Option` check.
//! "Sent" means queued to the connection's writer task, which writes what is queued in its
//! next batch.

use std::sync::Arc;

/// What happened to a command, in the order a command lives through them. Serialized (the
/// benchmark's trace file, `ipsan-trace/1`) under the snake_case names [`CommandEvent::name`]
/// gives.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum CommandEvent {
    /// The caller submitted the command (ITT assigned).
    Issued,
    /// The payload transform (Seal) started on the data-out.
    SealStart,
    /// The sealed data-out is ready.
    SealEnd,
    /// The SCSI Command PDU (with any immediate data, `len` bytes) was queued for sending,
    /// after any wait for the CmdSN window (RFC 7143 §4.2.2.1).
    CmdSent,
    /// An R2T arrived asking for `len` bytes at `offset` (RFC 7143 §11.8).
    R2t,
    /// Data-Out PDUs for `len` bytes at `offset` were queued: unsolicited data or the answer
    /// to one R2T (RFC 7143 §11.7).
    DataOut,
    /// The first Data-In PDU of the command arrived.
    DataInFirst,
    /// The Data-In PDU completing the expected transfer arrived.
    DataInLast,
    /// The payload transform started opening the reassembled data-in.
    OpenStart,
    /// The data-in is open (plaintext handed to the caller).
    OpenEnd,
    /// The status arrived (SCSI Response, or Data-In with the S bit).
    Status,
    /// The command completed successfully, as the caller sees it.
    Completed,
    /// The command completed with an error.
    Failed,
}

impl CommandEvent {
    /// The event's name in files and reports (its serialized form).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Issued => "issued",
            Self::SealStart => "seal_start",
            Self::SealEnd => "seal_end",
            Self::CmdSent => "cmd_sent",
            Self::R2t => "r2t",
            Self::DataOut => "data_out",
            Self::DataInFirst => "data_in_first",
            Self::DataInLast => "data_in_last",
            Self::OpenStart => "open_start",
            Self::OpenEnd => "open_end",
            Self::Status => "status",
            Self::Completed => "completed",
            Self::Failed => "failed",
        }
    }
}

/// Watches the commands of a session. Called on the session's tasks, inline with the I/O:
/// implementations must be quick and must not block (a short mutex-held push at most).
pub trait CommandObserver: Send + Sync + std::fmt::Debug {
    /// `event` happened to the command with Initiator Task Tag `itt`; `offset` and `len` are
    /// the bytes concerned (see [`CommandEvent`]), 0 otherwise.
    fn on_event(&self, itt: u32, event: CommandEvent, offset: u64, len: u64);
}

/// The session's observer, if one was set.
pub(crate) type Observer = Arc<dyn CommandObserver>;

/// Report to an optional observer (the session's hooks: one branch when nobody watches).
#[inline]
pub(crate) fn note(o: Option<&Observer>, itt: u32, event: CommandEvent, offset: u64, len: u64) {
    if let Some(o) = o {
        o.on_event(itt, event, offset, len);
    }
}

/// An observed command in progress: reports `Issued` when made and `Failed` when dropped
/// before [`Pending::finish`] (a `?` on the way out), so every observed command has an end.
pub(crate) struct Pending<'a> {
    o: Option<&'a Observer>,
    itt: u32,
}

impl<'a> Pending<'a> {
    pub(crate) fn issued(o: Option<&'a Observer>, itt: u32) -> Self {
        note(o, itt, CommandEvent::Issued, 0, 0);
        Self { o, itt }
    }

    /// Report how the command ended and pass its result through.
    pub(crate) fn finish<T, E>(mut self, r: Result<T, E>) -> Result<T, E> {
        if let Some(o) = self.o.take() {
            let e = if r.is_ok() {
                CommandEvent::Completed
            } else {
                CommandEvent::Failed
            };
            o.on_event(self.itt, e, 0, 0);
        }
        r
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some(o) = self.o.take() {
            o.on_event(self.itt, CommandEvent::Failed, 0, 0);
        }
    }
}
