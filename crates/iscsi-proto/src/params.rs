//! Login/text key negotiation (RFC 7143 §6.2, §13): the key table, the result functions, and
//! the values a session ends up with.
//!
//! Both sides use the same table: a responder calls [`respond`] for each key the originator
//! offers; an originator checks each answer with [`check_answer`]. Both fold the outcome into
//! [`SessionParams`] with [`SessionParams::apply`].

use std::fmt;

/// How a key's value is negotiated (RFC 7143 §6.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Each side states its own value; nothing to agree (§6.2, "declarative").
    Declarative,
    /// The responder picks the first value of the originator's list it supports (§6.2.1).
    List,
    /// Boolean, result is the AND of both values (§6.2.2).
    And,
    /// Boolean, result is the OR of both values (§6.2.2).
    Or,
    /// Numerical, result is the minimum, within `[lo, hi]` (§6.2.2).
    Min { lo: u32, hi: u32 },
    /// Numerical, result is the maximum, within `[lo, hi]`.
    Max { lo: u32, hi: u32 },
}

/// Where a key may be negotiated (RFC 7143 §13: "LO" = leading connection only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// Initialize only (login), any connection.
    Initialize,
    /// Leading-only: the session-wide operational keys.
    LeadingOnly,
    /// Login or full feature phase (Text requests).
    Any,
}

/// One row of the key table.
#[derive(Clone, Copy, Debug)]
pub struct KeySpec {
    pub name: &'static str,
    pub kind: Kind,
    pub usage: Use,
    /// Whether the key only makes sense in a Normal session (irrelevant in Discovery).
    pub normal_only: bool,
}

const fn key(name: &'static str, kind: Kind, usage: Use, normal_only: bool) -> KeySpec {
    KeySpec {
        name,
        kind,
        usage,
        normal_only,
    }
}

/// The operational and security keys of RFC 7143 §13 (and iSCSIProtocolLevel from RFC 7144).
pub const KEYS: &[KeySpec] = &[
    key("HeaderDigest", Kind::List, Use::Initialize, false),
    key("DataDigest", Kind::List, Use::Initialize, false),
    key(
        "MaxConnections",
        Kind::Min { lo: 1, hi: 65535 },
        Use::LeadingOnly,
        true,
    ),
    key("SendTargets", Kind::Declarative, Use::Any, false),
    key("TargetName", Kind::Declarative, Use::Initialize, false),
    key("InitiatorName", Kind::Declarative, Use::Initialize, false),
    key("TargetAlias", Kind::Declarative, Use::Any, false),
    key("InitiatorAlias", Kind::Declarative, Use::Any, false),
    key("TargetAddress", Kind::Declarative, Use::Any, false),
    key(
        "TargetPortalGroupTag",
        Kind::Declarative,
        Use::Initialize,
        false,
    ),
    key("InitialR2T", Kind::Or, Use::LeadingOnly, true),
    key("ImmediateData", Kind::And, Use::LeadingOnly, true),
    key(
        "MaxRecvDataSegmentLength",
        Kind::Declarative,
        Use::Any,
        false,
    ),
    key(
        "MaxBurstLength",
        Kind::Min {
            lo: 512,
            hi: 16_777_215,
        },
        Use::LeadingOnly,
        true,
    ),
    key(
        "FirstBurstLength",
        Kind::Min {
            lo: 512,
            hi: 16_777_215,
        },
        Use::LeadingOnly,
        true,
    ),
    key(
        "DefaultTime2Wait",
        Kind::Max { lo: 0, hi: 3600 },
        Use::LeadingOnly,
        false,
    ),
    key(
        "DefaultTime2Retain",
        Kind::Min { lo: 0, hi: 3600 },
        Use::LeadingOnly,
        false,
    ),
    key(
        "MaxOutstandingR2T",
        Kind::Min { lo: 1, hi: 65535 },
        Use::LeadingOnly,
        true,
    ),
    key("DataPDUInOrder", Kind::Or, Use::LeadingOnly, true),
    key("DataSequenceInOrder", Kind::Or, Use::LeadingOnly, true),
    key(
        "ErrorRecoveryLevel",
        Kind::Min { lo: 0, hi: 2 },
        Use::LeadingOnly,
        false,
    ),
    key("SessionType", Kind::Declarative, Use::LeadingOnly, false),
    key("AuthMethod", Kind::List, Use::Initialize, false),
    key(
        "iSCSIProtocolLevel",
        Kind::Min { lo: 0, hi: 31 },
        Use::LeadingOnly,
        false,
    ),
    // Obsoleted by RFC 7143 (markers were removed) but still sent by older initiators;
    // answered "No" as RFC 3720 required of implementations without markers.
    key("IFMarker", Kind::And, Use::Initialize, false),
    key("OFMarker", Kind::And, Use::Initialize, false),
];

/// Looks a key up in [`KEYS`].
#[must_use]
pub fn spec(name: &str) -> Option<&'static KeySpec> {
    KEYS.iter().find(|k| k.name == name)
}

/// Reserved answers a responder may give instead of a value (RFC 7143 §6.2).
pub const REJECT: &str = "Reject";
pub const IRRELEVANT: &str = "Irrelevant";
pub const NOT_UNDERSTOOD: &str = "NotUnderstood";

/// A value that is out of its key's range or unparsable: the responder answers `Reject` and
/// the key keeps its default (RFC 7143 §6.2.2, §6.2.1).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{key}={value}: {why}")]
pub struct BadValue {
    pub key: String,
    pub value: String,
    pub why: &'static str,
}

fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

fn fmt_bool(b: bool) -> &'static str {
    if b {
        "Yes"
    } else {
        "No"
    }
}

/// Parses a numerical value: decimal or `0x` hex (RFC 7143 §6.1 "numerical-value").
pub fn parse_number(v: &str) -> Option<u64> {
    if let Some(hex) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16).ok()
    } else if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) && v.len() <= 20 {
        v.parse().ok()
    } else {
        None
    }
}

/// Computes the responder's answer to `offered`, given what the responder itself would accept
/// (`ours`: a single value, or for list keys a comma-separated preference list).
pub fn resolve(spec: &KeySpec, offered: &str, ours: &str) -> Result<String, BadValue> {
    let bad = |why| BadValue {
        key: spec.name.into(),
        value: offered.into(),
        why,
    };
    match spec.kind {
        Kind::Declarative => Ok(ours.to_owned()),
        Kind::List => {
            let mine: Vec<&str> = ours.split(',').collect();
            if offered.is_empty() {
                return Err(bad("empty list"));
            }
            Ok(offered
                .split(',')
                .find(|o| mine.contains(o))
                .map_or_else(|| REJECT.to_owned(), str::to_owned))
        }
        Kind::And | Kind::Or => {
            let o = parse_bool(offered).ok_or_else(|| bad("expected Yes or No"))?;
            let m = parse_bool(ours).ok_or_else(|| bad("local value not boolean"))?;
            let r = if spec.kind == Kind::And {
                o && m
            } else {
                o || m
            };
            Ok(fmt_bool(r).to_owned())
        }
        Kind::Min { lo, hi } | Kind::Max { lo, hi } => {
            let o = parse_number(offered).ok_or_else(|| bad("not a number"))?;
            if o < u64::from(lo) || o > u64::from(hi) {
                return Err(bad("out of range"));
            }
            let m = parse_number(ours).ok_or_else(|| bad("local value not numeric"))?;
            let r = if matches!(spec.kind, Kind::Min { .. }) {
                o.min(m)
            } else {
                o.max(m)
            };
            Ok(r.to_string())
        }
    }
}

/// Checks a responder's answer against what this originator offered (RFC 7143 §6.2): a list
/// answer must be one of the offered values; a Min answer must not exceed the offer, a Max answer
/// must not be below it; an AND answer cannot turn our No into Yes, an OR answer cannot turn our
/// Yes into No. Returns the value in force.
pub fn check_answer(spec: &KeySpec, offered: &str, answer: &str) -> Result<String, BadValue> {
    let bad = |why| BadValue {
        key: spec.name.into(),
        value: answer.into(),
        why,
    };
    match spec.kind {
        Kind::Declarative => Ok(answer.to_owned()),
        Kind::List => {
            if offered.split(',').any(|o| o == answer) {
                Ok(answer.to_owned())
            } else {
                Err(bad("answer is not one of the offered values"))
            }
        }
        Kind::And | Kind::Or => {
            let o = parse_bool(offered).ok_or_else(|| bad("offer not boolean"))?;
            let a = parse_bool(answer).ok_or_else(|| bad("expected Yes or No"))?;
            let allowed = if spec.kind == Kind::And {
                a == o || !a
            } else {
                a == o || a
            };
            if allowed {
                Ok(answer.to_owned())
            } else {
                Err(bad("answer violates the key's result function"))
            }
        }
        Kind::Min { lo, hi } | Kind::Max { lo, hi } => {
            let o = parse_number(offered).ok_or_else(|| bad("offer not numeric"))?;
            let a = parse_number(answer).ok_or_else(|| bad("not a number"))?;
            if a < u64::from(lo) || a > u64::from(hi) {
                return Err(bad("out of range"));
            }
            let ok = if matches!(spec.kind, Kind::Min { .. }) {
                a <= o
            } else {
                a >= o
            };
            if ok {
                Ok(answer.to_owned())
            } else {
                Err(bad("answer violates the key's result function"))
            }
        }
    }
}

/// Normal or Discovery session (RFC 7143 §13.21).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SessionType {
    #[default]
    Normal,
    Discovery,
}

/// The operational values in force for a session and its connection, starting from the RFC
/// defaults (RFC 7143 §13).
#[derive(Clone, PartialEq, Eq)]
pub struct SessionParams {
    pub session_type: SessionType,
    pub initiator_name: String,
    pub initiator_alias: Option<String>,
    pub target_name: Option<String>,
    pub header_digest: bool,
    pub data_digest: bool,
    pub max_connections: u32,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    /// What the initiator declared it can receive: limits the target's Data-In PDUs.
    pub initiator_max_recv_data_segment_length: u32,
    /// What the target declared it can receive: limits the initiator's Data-Out PDUs.
    pub target_max_recv_data_segment_length: u32,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub default_time2wait: u32,
    pub default_time2retain: u32,
    pub max_outstanding_r2t: u32,
    pub data_pdu_in_order: bool,
    pub data_sequence_in_order: bool,
    pub error_recovery_level: u32,
    /// Vendor keys (`X-…`) agreed by an extension such as seal, in negotiation order.
    pub extensions: Vec<(String, String)>,
}

impl Default for SessionParams {
    fn default() -> Self {
        Self {
            session_type: SessionType::Normal,
            initiator_name: String::new(),
            initiator_alias: None,
            target_name: None,
            header_digest: false,
            data_digest: false,
            max_connections: 1,
            initial_r2t: true,
            immediate_data: true,
            initiator_max_recv_data_segment_length: 8192,
            target_max_recv_data_segment_length: 8192,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            default_time2wait: 2,
            default_time2retain: 20,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
            extensions: Vec::new(),
        }
    }
}

impl fmt::Debug for SessionParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionParams")
            .field("session_type", &self.session_type)
            .field("initiator_name", &self.initiator_name)
            .field("target_name", &self.target_name)
            .field("header_digest", &self.header_digest)
            .field("data_digest", &self.data_digest)
            .field("initial_r2t", &self.initial_r2t)
            .field("immediate_data", &self.immediate_data)
            .field(
                "initiator_mrdsl",
                &self.initiator_max_recv_data_segment_length,
            )
            .field("target_mrdsl", &self.target_max_recv_data_segment_length)
            .field("max_burst_length", &self.max_burst_length)
            .field("first_burst_length", &self.first_burst_length)
            .field("max_outstanding_r2t", &self.max_outstanding_r2t)
            .field("error_recovery_level", &self.error_recovery_level)
            // Extension values may carry nonces and confirmations: names only.
            .field(
                "extensions",
                &self.extensions.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// Which side declared a declarative value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Initiator,
    Target,
}

impl SessionParams {
    /// Records a key's value in force. `from` says who declared it, for keys whose meaning
    /// depends on the sender (MaxRecvDataSegmentLength). Unknown keys are ignored.
    pub fn apply(&mut self, key: &str, value: &str, from: Side) {
        let num = || parse_number(value).and_then(|n| u32::try_from(n).ok());
        let yes = value == "Yes";
        match key {
            "HeaderDigest" => self.header_digest = value == "CRC32C",
            "DataDigest" => self.data_digest = value == "CRC32C",
            "MaxConnections" => self.max_connections = num().unwrap_or(self.max_connections),
            "InitialR2T" => self.initial_r2t = yes,
            "ImmediateData" => self.immediate_data = yes,
            "MaxRecvDataSegmentLength" => {
                if let Some(n) = num().filter(|n| (512..=16_777_215).contains(n)) {
                    match from {
                        Side::Initiator => self.initiator_max_recv_data_segment_length = n,
                        Side::Target => self.target_max_recv_data_segment_length = n,
                    }
                }
            }
            "MaxBurstLength" => self.max_burst_length = num().unwrap_or(self.max_burst_length),
            "FirstBurstLength" => {
                self.first_burst_length = num().unwrap_or(self.first_burst_length);
            }
            "DefaultTime2Wait" => self.default_time2wait = num().unwrap_or(self.default_time2wait),
            "DefaultTime2Retain" => {
                self.default_time2retain = num().unwrap_or(self.default_time2retain);
            }
            "MaxOutstandingR2T" => {
                self.max_outstanding_r2t = num().unwrap_or(self.max_outstanding_r2t);
            }
            "DataPDUInOrder" => self.data_pdu_in_order = yes,
            "DataSequenceInOrder" => self.data_sequence_in_order = yes,
            "ErrorRecoveryLevel" => {
                self.error_recovery_level = num().unwrap_or(self.error_recovery_level);
            }
            "InitiatorName" => self.initiator_name = value.to_owned(),
            "InitiatorAlias" => self.initiator_alias = Some(value.to_owned()),
            "TargetName" => self.target_name = Some(value.to_owned()),
            "SessionType" => {
                self.session_type = if value == "Discovery" {
                    SessionType::Discovery
                } else {
                    SessionType::Normal
                };
            }
            _ => {}
        }
    }

    /// Enforces the cross-key rule of RFC 7143 §13.14: FirstBurstLength never exceeds
    /// MaxBurstLength.
    pub fn finish(&mut self) {
        if self.first_burst_length > self.max_burst_length {
            self.first_burst_length = self.max_burst_length;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(name: &str) -> &'static KeySpec {
        spec(name).unwrap()
    }

    #[test]
    fn list_picks_first_offered_we_support() {
        assert_eq!(
            resolve(s("HeaderDigest"), "CRC32C,None", "None,CRC32C").unwrap(),
            "CRC32C"
        );
        assert_eq!(
            resolve(s("HeaderDigest"), "None,CRC32C", "CRC32C,None").unwrap(),
            "None"
        );
        assert_eq!(
            resolve(s("AuthMethod"), "SRP,KRB5", "CHAP,None").unwrap(),
            REJECT
        );
    }

    #[test]
    fn booleans_follow_and_or() {
        assert_eq!(resolve(s("ImmediateData"), "Yes", "No").unwrap(), "No");
        assert_eq!(resolve(s("ImmediateData"), "Yes", "Yes").unwrap(), "Yes");
        assert_eq!(resolve(s("InitialR2T"), "No", "No").unwrap(), "No");
        assert_eq!(resolve(s("InitialR2T"), "Yes", "No").unwrap(), "Yes");
        assert!(resolve(s("InitialR2T"), "maybe", "No").is_err());
    }

    #[test]
    fn numbers_follow_min_max_and_ranges() {
        assert_eq!(
            resolve(s("MaxBurstLength"), "16776192", "1048576").unwrap(),
            "1048576"
        );
        assert_eq!(
            resolve(s("MaxBurstLength"), "0x1000", "1048576").unwrap(),
            "4096"
        );
        assert_eq!(resolve(s("DefaultTime2Wait"), "0", "2").unwrap(), "2");
        assert!(
            resolve(s("MaxBurstLength"), "100", "1048576").is_err(),
            "below 512"
        );
        assert!(resolve(s("ErrorRecoveryLevel"), "3", "0").is_err());
        assert!(resolve(s("MaxOutstandingR2T"), "12a", "16").is_err());
    }

    #[test]
    fn originator_checks_answers() {
        assert!(check_answer(s("MaxBurstLength"), "65536", "262144").is_err());
        assert!(check_answer(s("MaxBurstLength"), "262144", "65536").is_ok());
        assert!(check_answer(s("ImmediateData"), "No", "Yes").is_err());
        assert!(check_answer(s("InitialR2T"), "Yes", "No").is_err());
        assert!(check_answer(s("HeaderDigest"), "None", "CRC32C").is_err());
        assert!(check_answer(s("DefaultTime2Wait"), "2", "1").is_err());
    }

    #[test]
    fn params_apply_and_clamp_first_burst() {
        let mut p = SessionParams::default();
        p.apply("MaxRecvDataSegmentLength", "262144", Side::Initiator);
        p.apply("MaxRecvDataSegmentLength", "65536", Side::Target);
        p.apply("MaxBurstLength", "16384", Side::Target);
        p.apply("FirstBurstLength", "65536", Side::Target);
        p.apply("HeaderDigest", "CRC32C", Side::Target);
        p.finish();
        assert_eq!(p.initiator_max_recv_data_segment_length, 262_144);
        assert_eq!(p.target_max_recv_data_segment_length, 65_536);
        assert_eq!(p.first_burst_length, 16_384);
        assert!(p.header_digest);
    }
}
