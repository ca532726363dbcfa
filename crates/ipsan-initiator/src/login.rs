//! The originator's login. The state machine is iscsi-proto's
//! (`iscsi_proto::login::originator`, next to the target's, negotiating into the same
//! `SessionParams`, its PDUs built by `originator::LoginExchange`); the tokio I/O that moves
//! them is `session::login`. This module adds what
//! only this initiator needs: the login extension trait with the payload transform it hands
//! to the session (Seal), and [`Negotiated`], the flat view of the values in force that
//! `ipsan bench` reports in its JSON.

use std::sync::Arc;

use iscsi_proto::login::originator::{self, Established};
use iscsi_proto::params::SessionParams;
use serde::Serialize;

use crate::error::Error;
use crate::transform::PayloadTransform;

pub use iscsi_proto::login::originator::{
    ChapCredentials, DigestChoice, LoginNext, LoginOptions, LoginReply, LoginStep, OriginatorError,
    SessionKind,
};

/// A login extension for vendor `X-` keys (RFC 7143 §13.5): iscsi-proto's
/// [`originator::OriginatorExtension`] (which also sees every Login PDU as
/// [`originator::LoginExchange`] sends and receives it: Seal binds the whole login,
/// docs/seal.md §3), plus what the session installs once the login succeeded: the payload
/// transform (docs/seal.md §2) and the record layer (§4a).
pub trait OriginatorExtension: originator::OriginatorExtension {
    /// After a successful login: the payload transform the session must apply to every
    /// command's data from its first command on (Seal's sealing), if any.
    fn transform(&mut self) -> Option<Arc<dyn PayloadTransform>> {
        None
    }
    /// After a successful login: the record protection every PDU of the connection must go
    /// through (Seal, docs/seal.md §4a), if any.
    fn record_layer(&mut self) -> Option<std::result::Result<RecordLayer, String>> {
        None
    }
}

/// The remote leg's end of relayed CHAP ([`crate::Session::connect_relayed`], a gateway,
/// docs/gateway.md): the host's CHAP_A offer, and channels that carry the target's challenge
/// out, the host's answer in and the target's verdict out. The session holds no secret.
#[derive(Debug)]
pub struct ChapRelay {
    /// The host's CHAP_A offer, in its order: what this login offers the target.
    pub algorithms: Vec<iscsi_proto::chap::ChapAlgorithm>,
    /// Gets the target's CHAP_A, CHAP_I and CHAP_C.
    pub challenge: Option<tokio::sync::oneshot::Sender<RelayedChallenge>>,
    /// Gives the host's answer.
    pub response: Option<tokio::sync::oneshot::Receiver<RelayedResponse>>,
    /// Gets the target's acceptance: its CHAP_N and CHAP_R when the host asked for mutual
    /// CHAP. Dropped unsent when the target refused (the login then fails with its status).
    pub accepted: Option<tokio::sync::oneshot::Sender<RelayedVerdict>>,
}

/// The target's CHAP_A, CHAP_I and CHAP_C, relayed to the host.
pub type RelayedChallenge = (iscsi_proto::chap::ChapAlgorithm, u8, Vec<u8>);

/// The target accepted the relayed response: its CHAP_N and CHAP_R if the host asked for
/// mutual CHAP.
pub type RelayedVerdict = Option<(String, Vec<u8>)>;

/// The host's answer to a relayed challenge: CHAP_N, CHAP_R and, for mutual CHAP, its
/// CHAP_I and CHAP_C.
#[derive(Debug, Clone)]
pub struct RelayedResponse {
    pub name: String,
    pub response: Vec<u8>,
    pub mutual: Option<(u8, Vec<u8>)>,
}

/// A connection's record protection: the sealer for the framed write, the opener for the
/// framed read.
pub type RecordLayer = (ipsan_seal::RecordSealer, ipsan_seal::RecordOpener);

/// The originator's login state machine with this initiator's extensions.
pub type LoginMachine = originator::LoginMachine<dyn OriginatorExtension>;

/// The parameters in force after login, as the target agreed them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Negotiated {
    pub header_digest: bool,
    pub data_digest: bool,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub first_burst_length: u32,
    pub max_burst_length: u32,
    /// What we declared: the largest Data-In segment the target may send us.
    pub max_recv_data_segment_length: u32,
    /// What the target declared: the largest Data-Out/immediate segment we may send.
    pub target_max_recv_data_segment_length: u32,
    pub max_outstanding_r2t: u32,
    pub error_recovery_level: u32,
    pub data_pdu_in_order: bool,
    pub data_sequence_in_order: bool,
    pub max_connections: u32,
    pub tsih: u16,
    pub target_portal_group_tag: Option<u16>,
    pub target_alias: Option<String>,
    /// The CHAP algorithm used, if CHAP ran.
    pub chap_algorithm: Option<u32>,
    /// Whether the target proved its identity (mutual CHAP).
    pub target_authenticated: bool,
}

impl Negotiated {
    /// The view of a completed login.
    #[must_use]
    pub fn from_login(e: &Established) -> Self {
        let mut n = Self::from_params(&e.params);
        n.tsih = e.tsih;
        n.target_portal_group_tag = e.target_portal_group_tag;
        n.target_alias.clone_from(&e.target_alias);
        n.chap_algorithm = e.chap_algorithm;
        n.target_authenticated = e.target_authenticated;
        n
    }

    /// The RFC 7143 §13 defaults, before anything is negotiated.
    #[must_use]
    pub fn rfc_defaults() -> Self {
        Self::from_params(&SessionParams::default())
    }

    fn from_params(p: &SessionParams) -> Self {
        Self {
            header_digest: p.header_digest,
            data_digest: p.data_digest,
            initial_r2t: p.initial_r2t,
            immediate_data: p.immediate_data,
            first_burst_length: p.first_burst_length,
            max_burst_length: p.max_burst_length,
            max_recv_data_segment_length: p.initiator_max_recv_data_segment_length,
            target_max_recv_data_segment_length: p.target_max_recv_data_segment_length,
            max_outstanding_r2t: p.max_outstanding_r2t,
            error_recovery_level: p.error_recovery_level,
            data_pdu_in_order: p.data_pdu_in_order,
            data_sequence_in_order: p.data_sequence_in_order,
            max_connections: p.max_connections,
            tsih: 0,
            target_portal_group_tag: None,
            target_alias: None,
            chap_algorithm: None,
            target_authenticated: false,
        }
    }
}

impl From<OriginatorError> for Error {
    /// A refusal keeps its status; a CHAP value error stays a CHAP error; a response out of
    /// sequence is a protocol error; everything else failed the negotiation on our side.
    fn from(e: OriginatorError) -> Self {
        match e {
            OriginatorError::Refused { class, detail } => Error::LoginRefused {
                class,
                detail,
                message: crate::error::login_status_message(class, detail),
            },
            OriginatorError::Chap(c) => Error::Chap(c),
            OriginatorError::Text(w) => Error::Wire(w),
            e @ (OriginatorError::WrongStage { .. }
            | OriginatorError::SkippedOperational
            | OriginatorError::UnexpectedPdu { .. }
            | OriginatorError::TextTooLong { .. }) => Error::Protocol(e.to_string()),
            other => Error::Login(other.to_string()),
        }
    }
}

impl From<iscsi_proto::discovery::DiscoveryError> for Error {
    /// A rejected request keeps its reason, text that does not parse is a wire error; every
    /// other bad answer broke the protocol.
    fn from(e: iscsi_proto::discovery::DiscoveryError) -> Self {
        use iscsi_proto::discovery::DiscoveryError;
        match e {
            DiscoveryError::Rejected(r) => Error::Rejected(r),
            DiscoveryError::Text(w) => Error::Wire(w),
            other => Error::Protocol(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiated_view_starts_at_rfc_defaults() {
        let n = Negotiated::rfc_defaults();
        assert!(n.initial_r2t && n.immediate_data);
        assert_eq!((n.first_burst_length, n.max_burst_length), (65536, 262_144));
        assert_eq!(
            (
                n.max_recv_data_segment_length,
                n.target_max_recv_data_segment_length
            ),
            (8192, 8192)
        );
        assert_eq!((n.max_outstanding_r2t, n.tsih), (1, 0));
    }

    #[test]
    fn refusals_keep_their_status_and_bad_answers_fail_the_login() {
        let e: Error = OriginatorError::Refused {
            class: 2,
            detail: 1,
        }
        .into();
        assert!(
            matches!(e, Error::LoginRefused { class: 2, detail: 1, message } if message == "authentication failure")
        );
        let e: Error =
            OriginatorError::Negotiation("target answered MaxBurstLength=1".into()).into();
        assert!(
            matches!(e, Error::Login(ref m) if m.contains("MaxBurstLength")),
            "{e}"
        );
    }
}
