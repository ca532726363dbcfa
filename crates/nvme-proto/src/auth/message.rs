//! The DH-HMAC-CHAP messages Authentication Send and Receive carry (TP 8006; the layouts of
//! Linux's `struct nvmf_auth_dhchap_*_data`), all little endian:
//!
//! | message | AUTH_TYPE | AUTH_ID | length |
//! |---|---|---|---|
//! | AUTH_Negotiate | 00h | 00h | 8 + 64 × NAPD |
//! | DH-HMAC-CHAP_Challenge | 01h | 01h | 16 + HL + DHVLEN |
//! | DH-HMAC-CHAP_Reply | 01h | 02h | 16 + 2 × HL + DHVLEN |
//! | DH-HMAC-CHAP_Success1 | 01h | 03h | 16 (+ HL when RVALID) |
//! | DH-HMAC-CHAP_Success2 | 01h | 04h | 16 |
//! | AUTH_Failure2 | 00h | F0h | 8 |
//! | AUTH_Failure1 | 00h | F1h | 8 |
//!
//! Every message starts with AUTH_TYPE, AUTH_ID, two reserved bytes and T_ID (the transaction
//! identifier the host chose in its Negotiate). [`Message::decode`] is strict: a message must be
//! exactly its length (an Authentication Send's transfer length); [`Message::decode_padded`]
//! also accepts zero bytes after it, as an Authentication Receive's data is as long as the
//! host's allocation length and Linux's target zero-fills the rest.

use bytes::{BufMut, Bytes, BytesMut};

use super::dh::DhGroup;
use super::hash::HashId;

/// AUTH_TYPE 00h: common authentication messages (Negotiate, Failure1/2).
pub const AUTH_TYPE_COMMON: u8 = 0x00;
/// AUTH_TYPE 01h: DH-HMAC-CHAP messages.
pub const AUTH_TYPE_DHCHAP: u8 = 0x01;

/// AUTH_ID values.
pub const ID_NEGOTIATE: u8 = 0x00;
pub const ID_CHALLENGE: u8 = 0x01;
pub const ID_REPLY: u8 = 0x02;
pub const ID_SUCCESS1: u8 = 0x03;
pub const ID_SUCCESS2: u8 = 0x04;
pub const ID_FAILURE2: u8 = 0xf0;
pub const ID_FAILURE1: u8 = 0xf1;

/// AUTHID of the DH-HMAC-CHAP protocol descriptor in a Negotiate.
pub const AUTHID_DHCHAP: u8 = 0x01;
/// Length of one protocol descriptor (AUTHID, reserved, HALEN, DHLEN, 60 identifiers).
pub const DESCRIPTOR_LEN: usize = 64;
/// Hash identifiers a descriptor can list (IDLIST bytes 0..30); DH group IDs follow at 30..60.
pub const MAX_HASH_IDS: usize = 30;
/// DH group identifiers a descriptor can list.
pub const MAX_DH_IDS: usize = 30;
/// Length of the common header shared by every message.
const HEADER_LEN: usize = 6;

/// Reason Code Explanation of a Failure1/Failure2 (TP 8006; the reason code itself is always
/// 01h, "authentication failure").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureReason {
    /// 01h: authentication failed (a response did not verify).
    Failed,
    /// 02h: authentication protocol not usable.
    NotUsable,
    /// 03h: secure channel concatenation mismatch.
    ConcatMismatch,
    /// 04h: hash function not usable.
    HashUnusable,
    /// 05h: DH group not usable.
    DhGroupUnusable,
    /// 06h: incorrect payload.
    IncorrectPayload,
    /// 07h: incorrect protocol message.
    IncorrectMessage,
    /// Another value from the peer.
    Other(u8),
}

impl FailureReason {
    /// The explanation code on the wire.
    #[must_use]
    pub fn code(self) -> u8 {
        match self {
            Self::Failed => 0x01,
            Self::NotUsable => 0x02,
            Self::ConcatMismatch => 0x03,
            Self::HashUnusable => 0x04,
            Self::DhGroupUnusable => 0x05,
            Self::IncorrectPayload => 0x06,
            Self::IncorrectMessage => 0x07,
            Self::Other(c) => c,
        }
    }

    /// The explanation with code `c`.
    #[must_use]
    pub fn from_code(c: u8) -> Self {
        match c {
            0x01 => Self::Failed,
            0x02 => Self::NotUsable,
            0x03 => Self::ConcatMismatch,
            0x04 => Self::HashUnusable,
            0x05 => Self::DhGroupUnusable,
            0x06 => Self::IncorrectPayload,
            0x07 => Self::IncorrectMessage,
            c => Self::Other(c),
        }
    }
}

impl std::fmt::Display for FailureReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            Self::Failed => "authentication failed",
            Self::NotUsable => "authentication protocol not usable",
            Self::ConcatMismatch => "secure channel concatenation mismatch",
            Self::HashUnusable => "hash function not usable",
            Self::DhGroupUnusable => "DH group not usable",
            Self::IncorrectPayload => "incorrect payload",
            Self::IncorrectMessage => "incorrect protocol message",
            Self::Other(c) => return write!(f, "reason code explanation {c:#04x}"),
        };
        f.write_str(s)
    }
}

/// The Reason Code of Failure1/Failure2: 01h, authentication failure.
pub const REASON_AUTH_FAILURE: u8 = 0x01;

/// A message that could not be decoded, with the explanation a Failure message should carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed DH-HMAC-CHAP message: {what} ({reason})")]
pub struct MessageError {
    pub reason: FailureReason,
    pub what: &'static str,
}

fn payload(what: &'static str) -> MessageError {
    MessageError {
        reason: FailureReason::IncorrectPayload,
        what,
    }
}

/// AUTH_Negotiate: the host's transaction ID, SC_C, and the hashes and DH groups it offers.
/// Identifiers are kept raw, as a host may list ones this side does not know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiate {
    pub t_id: u16,
    /// Secure channel concatenation (00h none).
    pub sc_c: u8,
    /// HashIDs offered, in the host's order.
    pub hashes: Vec<u8>,
    /// DH group IDs offered, in the host's order.
    pub dh_groups: Vec<u8>,
}

/// DH-HMAC-CHAP_Challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    pub t_id: u16,
    pub hash: HashId,
    pub dh_group: DhGroup,
    /// S1.
    pub seqnum: u32,
    /// C1, HL bytes.
    pub challenge: Vec<u8>,
    /// The controller's DH public value, DHVLEN bytes (empty for the NULL group).
    pub dh_value: Vec<u8>,
}

/// DH-HMAC-CHAP_Reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub t_id: u16,
    /// R1, HL bytes.
    pub response: Vec<u8>,
    /// C2 when CVALID is set (bidirectional authentication).
    pub challenge: Option<Vec<u8>>,
    /// S2 (0 when not bidirectional).
    pub seqnum: u32,
    /// The host's DH public value.
    pub dh_value: Vec<u8>,
}

/// DH-HMAC-CHAP_Success1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Success1 {
    pub t_id: u16,
    /// HL: the negotiated hash's length.
    pub hash_len: u8,
    /// R2 when RVALID is set.
    pub response: Option<Vec<u8>>,
}

/// AUTH_Failure1 / AUTH_Failure2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    pub t_id: u16,
    /// Reason Code (01h).
    pub reason_code: u8,
    pub reason: FailureReason,
}

/// One DH-HMAC-CHAP message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Negotiate(Negotiate),
    Challenge(Challenge),
    Reply(Reply),
    Success1(Success1),
    Success2 { t_id: u16 },
    Failure1(Failure),
    Failure2(Failure),
}

fn header(b: &mut BytesMut, auth_type: u8, auth_id: u8, t_id: u16) {
    b.put_u8(auth_type);
    b.put_u8(auth_id);
    b.put_u16_le(0);
    b.put_u16_le(t_id);
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Checks that `b` holds at least `len` bytes and, if `padded`, nothing but zeros after them
/// (else exactly `len`).
fn fits(b: &[u8], len: usize, padded: bool, what: &'static str) -> Result<(), MessageError> {
    if b.len() < len {
        return Err(payload(what));
    }
    if b.len() > len && (!padded || b[len..].iter().any(|&x| x != 0)) {
        return Err(payload(what));
    }
    Ok(())
}

impl Message {
    /// The message's T_ID.
    #[must_use]
    pub fn t_id(&self) -> u16 {
        match self {
            Self::Negotiate(m) => m.t_id,
            Self::Challenge(m) => m.t_id,
            Self::Reply(m) => m.t_id,
            Self::Success1(m) => m.t_id,
            Self::Success2 { t_id } => *t_id,
            Self::Failure1(m) | Self::Failure2(m) => m.t_id,
        }
    }

    /// The message's bytes.
    #[must_use]
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(self.encoded_len());
        match self {
            Self::Negotiate(m) => {
                header(&mut b, AUTH_TYPE_COMMON, ID_NEGOTIATE, m.t_id);
                b.put_u8(m.sc_c);
                b.put_u8(1);
                let hashes = &m.hashes[..m.hashes.len().min(MAX_HASH_IDS)];
                let groups = &m.dh_groups[..m.dh_groups.len().min(MAX_DH_IDS)];
                b.put_u8(AUTHID_DHCHAP);
                b.put_u8(0);
                b.put_u8(hashes.len() as u8);
                b.put_u8(groups.len() as u8);
                let mut ids = [0u8; MAX_HASH_IDS + MAX_DH_IDS];
                ids[..hashes.len()].copy_from_slice(hashes);
                ids[MAX_HASH_IDS..MAX_HASH_IDS + groups.len()].copy_from_slice(groups);
                b.put_slice(&ids);
            }
            Self::Challenge(m) => {
                header(&mut b, AUTH_TYPE_DHCHAP, ID_CHALLENGE, m.t_id);
                b.put_u8(m.challenge.len() as u8);
                b.put_u8(0);
                b.put_u8(m.hash.id());
                b.put_u8(m.dh_group.id());
                b.put_u16_le(m.dh_value.len() as u16);
                b.put_u32_le(m.seqnum);
                b.put_slice(&m.challenge);
                b.put_slice(&m.dh_value);
            }
            Self::Reply(m) => {
                header(&mut b, AUTH_TYPE_DHCHAP, ID_REPLY, m.t_id);
                b.put_u8(m.response.len() as u8);
                b.put_u8(0);
                b.put_u8(u8::from(m.challenge.is_some()));
                b.put_u8(0);
                b.put_u16_le(m.dh_value.len() as u16);
                b.put_u32_le(m.seqnum);
                b.put_slice(&m.response);
                match &m.challenge {
                    Some(c) => b.put_slice(c),
                    None => b.put_bytes(0, m.response.len()),
                }
                b.put_slice(&m.dh_value);
            }
            Self::Success1(m) => {
                header(&mut b, AUTH_TYPE_DHCHAP, ID_SUCCESS1, m.t_id);
                b.put_u8(m.hash_len);
                b.put_u8(0);
                b.put_u8(u8::from(m.response.is_some()));
                b.put_bytes(0, 7);
                if let Some(r) = &m.response {
                    b.put_slice(r);
                }
            }
            Self::Success2 { t_id } => {
                header(&mut b, AUTH_TYPE_DHCHAP, ID_SUCCESS2, *t_id);
                b.put_bytes(0, 10);
            }
            Self::Failure1(m) | Self::Failure2(m) => {
                let id = if matches!(self, Self::Failure1(_)) {
                    ID_FAILURE1
                } else {
                    ID_FAILURE2
                };
                header(&mut b, AUTH_TYPE_COMMON, id, m.t_id);
                b.put_u8(m.reason_code);
                b.put_u8(m.reason.code());
            }
        }
        b.freeze()
    }

    /// The length [`encode`](Self::encode) writes.
    #[must_use]
    pub fn encoded_len(&self) -> usize {
        match self {
            Self::Negotiate(_) => 8 + DESCRIPTOR_LEN,
            Self::Challenge(m) => 16 + m.challenge.len() + m.dh_value.len(),
            Self::Reply(m) => 16 + 2 * m.response.len() + m.dh_value.len(),
            Self::Success1(m) => 16 + m.response.as_ref().map_or(0, Vec::len),
            Self::Success2 { .. } => 16,
            Self::Failure1(_) | Self::Failure2(_) => 8,
        }
    }

    /// Decodes a message that fills `b` exactly (an Authentication Send's data).
    ///
    /// # Errors
    /// [`MessageError`] with the Failure explanation to send back.
    pub fn decode(b: &[u8]) -> Result<Self, MessageError> {
        Self::decode_inner(b, false)
    }

    /// Decodes a message followed by nothing but zero bytes (an Authentication Receive's data).
    ///
    /// # Errors
    /// As [`decode`](Self::decode).
    pub fn decode_padded(b: &[u8]) -> Result<Self, MessageError> {
        Self::decode_inner(b, true)
    }

    fn decode_inner(b: &[u8], padded: bool) -> Result<Self, MessageError> {
        if b.len() < HEADER_LEN {
            return Err(payload("shorter than the message header"));
        }
        let t_id = le16(b, 4);
        match (b[0], b[1]) {
            (AUTH_TYPE_COMMON, ID_NEGOTIATE) => {
                if b.len() < 8 {
                    return Err(payload("Negotiate shorter than 8 bytes"));
                }
                let napd = usize::from(b[7]);
                if napd != 1 {
                    // TP 8006 defines one protocol, DH-HMAC-CHAP; Linux sends one descriptor.
                    return Err(MessageError {
                        reason: FailureReason::NotUsable,
                        what: "Negotiate NAPD is not 1",
                    });
                }
                fits(b, 8 + DESCRIPTOR_LEN, padded, "Negotiate length")?;
                let d = &b[8..8 + DESCRIPTOR_LEN];
                if d[0] != AUTHID_DHCHAP {
                    return Err(MessageError {
                        reason: FailureReason::NotUsable,
                        what: "Negotiate descriptor is not DH-HMAC-CHAP",
                    });
                }
                let (halen, dhlen) = (usize::from(d[2]), usize::from(d[3]));
                if halen > MAX_HASH_IDS || dhlen > MAX_DH_IDS {
                    return Err(payload("Negotiate HALEN or DHLEN over 30"));
                }
                Ok(Self::Negotiate(Negotiate {
                    t_id,
                    sc_c: b[6],
                    hashes: d[4..4 + halen].to_vec(),
                    dh_groups: d[4 + MAX_HASH_IDS..4 + MAX_HASH_IDS + dhlen].to_vec(),
                }))
            }
            (AUTH_TYPE_DHCHAP, ID_CHALLENGE) => {
                if b.len() < 16 {
                    return Err(payload("Challenge shorter than 16 bytes"));
                }
                let hl = usize::from(b[6]);
                let hash = HashId::from_id(b[8]).ok_or(MessageError {
                    reason: FailureReason::HashUnusable,
                    what: "Challenge HashID unknown",
                })?;
                if hl != hash.len() {
                    return Err(MessageError {
                        reason: FailureReason::HashUnusable,
                        what: "Challenge HL is not the hash's length",
                    });
                }
                let dh_group = DhGroup::from_id(b[9]).ok_or(MessageError {
                    reason: FailureReason::DhGroupUnusable,
                    what: "Challenge DH group unknown",
                })?;
                let dhvlen = usize::from(le16(b, 10));
                if dhvlen != dh_group.value_len() {
                    return Err(payload("Challenge DHVLEN is not the group's value length"));
                }
                fits(b, 16 + hl + dhvlen, padded, "Challenge length")?;
                Ok(Self::Challenge(Challenge {
                    t_id,
                    hash,
                    dh_group,
                    seqnum: le32(b, 12),
                    challenge: b[16..16 + hl].to_vec(),
                    dh_value: b[16 + hl..16 + hl + dhvlen].to_vec(),
                }))
            }
            (AUTH_TYPE_DHCHAP, ID_REPLY) => {
                if b.len() < 16 {
                    return Err(payload("Reply shorter than 16 bytes"));
                }
                let hl = usize::from(b[6]);
                if HashId::ALL.iter().all(|h| h.len() != hl) {
                    return Err(payload("Reply HL is not a hash length"));
                }
                let cvalid = match b[8] {
                    0 => false,
                    1 => true,
                    _ => return Err(payload("Reply CVALID is not 0 or 1")),
                };
                let dhvlen = usize::from(le16(b, 10));
                fits(b, 16 + 2 * hl + dhvlen, padded, "Reply length")?;
                let c2 = &b[16 + hl..16 + 2 * hl];
                Ok(Self::Reply(Reply {
                    t_id,
                    seqnum: le32(b, 12),
                    response: b[16..16 + hl].to_vec(),
                    challenge: cvalid.then(|| c2.to_vec()),
                    dh_value: b[16 + 2 * hl..16 + 2 * hl + dhvlen].to_vec(),
                }))
            }
            (AUTH_TYPE_DHCHAP, ID_SUCCESS1) => {
                if b.len() < 16 {
                    return Err(payload("Success1 shorter than 16 bytes"));
                }
                let hl = usize::from(b[6]);
                let rvalid = match b[8] {
                    0 => false,
                    1 => true,
                    _ => return Err(payload("Success1 RVALID is not 0 or 1")),
                };
                let len = if rvalid { 16 + hl } else { 16 };
                fits(b, len, padded, "Success1 length")?;
                Ok(Self::Success1(Success1 {
                    t_id,
                    hash_len: b[6],
                    response: rvalid.then(|| b[16..16 + hl].to_vec()),
                }))
            }
            (AUTH_TYPE_DHCHAP, ID_SUCCESS2) => {
                fits(b, 16, padded, "Success2 length")?;
                Ok(Self::Success2 { t_id })
            }
            (AUTH_TYPE_COMMON, id @ (ID_FAILURE1 | ID_FAILURE2)) => {
                fits(b, 8, padded, "Failure length")?;
                let f = Failure {
                    t_id,
                    reason_code: b[6],
                    reason: FailureReason::from_code(b[7]),
                };
                Ok(if id == ID_FAILURE1 {
                    Self::Failure1(f)
                } else {
                    Self::Failure2(f)
                })
            }
            _ => Err(MessageError {
                reason: FailureReason::IncorrectMessage,
                what: "unknown AUTH_TYPE/AUTH_ID",
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Message> {
        vec![
            Message::Negotiate(Negotiate {
                t_id: 7,
                sc_c: 0,
                hashes: vec![1, 2, 3],
                dh_groups: vec![0, 1, 2, 3, 4, 5],
            }),
            Message::Challenge(Challenge {
                t_id: 7,
                hash: HashId::Sha384,
                dh_group: DhGroup::Ffdhe2048,
                seqnum: 0x0102_0304,
                challenge: vec![0xaa; 48],
                dh_value: vec![0x55; 256],
            }),
            Message::Reply(Reply {
                t_id: 7,
                response: vec![1; 32],
                challenge: Some(vec![2; 32]),
                seqnum: 9,
                dh_value: vec![],
            }),
            Message::Reply(Reply {
                t_id: 7,
                response: vec![1; 64],
                challenge: None,
                seqnum: 0,
                dh_value: vec![3; 1024],
            }),
            Message::Success1(Success1 {
                t_id: 7,
                hash_len: 32,
                response: Some(vec![4; 32]),
            }),
            Message::Success1(Success1 {
                t_id: 7,
                hash_len: 32,
                response: None,
            }),
            Message::Success2 { t_id: 7 },
            Message::Failure1(Failure {
                t_id: 7,
                reason_code: REASON_AUTH_FAILURE,
                reason: FailureReason::Failed,
            }),
            Message::Failure2(Failure {
                t_id: 7,
                reason_code: REASON_AUTH_FAILURE,
                reason: FailureReason::HashUnusable,
            }),
        ]
    }

    #[test]
    fn accepts_every_message_it_encodes() {
        for m in samples() {
            let b = m.encode();
            assert_eq!(b.len(), m.encoded_len());
            assert_eq!(Message::decode(&b).unwrap(), m);
            let mut padded = b.to_vec();
            padded.resize(4096, 0);
            assert_eq!(Message::decode_padded(&padded).unwrap(), m);
        }
    }

    #[test]
    fn negotiate_layout_matches_linux() {
        let b = samples()[0].encode();
        assert_eq!(b.len(), 72);
        assert_eq!(&b[..8], &[0, 0, 0, 0, 7, 0, 0, 1]);
        assert_eq!(&b[8..15], &[1, 0, 3, 6, 1, 2, 3]);
        assert_eq!(&b[42..48], &[0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn rejects_truncated_and_extended_messages() {
        for m in samples() {
            let b = m.encode();
            for cut in 0..b.len() {
                assert!(Message::decode(&b[..cut]).is_err(), "{m:?} cut at {cut}");
            }
            let mut long = b.to_vec();
            long.push(0);
            assert!(Message::decode(&long).is_err(), "{m:?} with a byte more");
            long.pop();
            long.resize(b.len() + 8, 0);
            *long.last_mut().unwrap() = 1;
            assert!(
                Message::decode_padded(&long).is_err(),
                "{m:?} non-zero padding"
            );
        }
    }

    #[test]
    fn rejects_unknown_ids_with_the_right_explanation() {
        let mut b = samples()[1].encode().to_vec();
        b[8] = 9;
        assert_eq!(
            Message::decode(&b).unwrap_err().reason,
            FailureReason::HashUnusable
        );
        b[8] = 2;
        b[9] = 6;
        assert_eq!(
            Message::decode(&b).unwrap_err().reason,
            FailureReason::DhGroupUnusable
        );
        assert_eq!(
            Message::decode(&[1, 9, 0, 0, 0, 0, 0, 0])
                .unwrap_err()
                .reason,
            FailureReason::IncorrectMessage
        );
    }
}
