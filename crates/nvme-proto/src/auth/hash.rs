//! The hash functions of DH-HMAC-CHAP (TP 8006: HashID 01h SHA-256, 02h SHA-384, 03h SHA-512),
//! HMAC over them, and the three computations both roles share: the key transformation of a
//! DHHC-1 secret, the augmented challenge of a DH exchange, and the response value.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha384, Sha512};
use zeroize::Zeroizing;

/// A hash function identifier of DH-HMAC-CHAP (TP 8006 HashID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum HashId {
    /// 01h.
    Sha256 = 0x01,
    /// 02h.
    Sha384 = 0x02,
    /// 03h.
    Sha512 = 0x03,
}

impl HashId {
    /// Every hash, in identifier order.
    pub const ALL: [HashId; 3] = [HashId::Sha256, HashId::Sha384, HashId::Sha512];

    /// The hash with identifier `id`; `None` for a reserved one.
    #[must_use]
    pub fn from_id(id: u8) -> Option<Self> {
        match id {
            0x01 => Some(Self::Sha256),
            0x02 => Some(Self::Sha384),
            0x03 => Some(Self::Sha512),
            _ => None,
        }
    }

    /// The identifier on the wire.
    #[must_use]
    pub fn id(self) -> u8 {
        self as u8
    }

    /// The digest length in bytes: the HL of the messages and the length of every challenge
    /// and response.
    #[must_use]
    #[allow(clippy::len_without_is_empty)]
    pub fn len(self) -> usize {
        match self {
            Self::Sha256 => 32,
            Self::Sha384 => 48,
            Self::Sha512 => 64,
        }
    }

    /// The name Linux and nvme-cli use (`hmac(sha256)` …).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Sha256 => "hmac(sha256)",
            Self::Sha384 => "hmac(sha384)",
            Self::Sha512 => "hmac(sha512)",
        }
    }

    /// HMAC with this hash over the concatenation of `parts`.
    pub(crate) fn hmac(self, key: &[u8], parts: &[&[u8]]) -> Zeroizing<Vec<u8>> {
        macro_rules! run {
            ($d:ty) => {{
                // HMAC takes keys of any length (RFC 2104 §2): longer ones are hashed first.
                let mut mac = match <Hmac<$d> as Mac>::new_from_slice(key) {
                    Ok(mac) => mac,
                    Err(_) => unreachable!("HMAC accepts keys of any length"),
                };
                for part in parts {
                    mac.update(part);
                }
                Zeroizing::new(mac.finalize().into_bytes().to_vec())
            }};
        }
        match self {
            Self::Sha256 => run!(Sha256),
            Self::Sha384 => run!(Sha384),
            Self::Sha512 => run!(Sha512),
        }
    }

    /// The plain digest of `data`.
    pub(crate) fn digest(self, data: &[u8]) -> Zeroizing<Vec<u8>> {
        Zeroizing::new(match self {
            Self::Sha256 => Sha256::digest(data).to_vec(),
            Self::Sha384 => Sha384::digest(data).to_vec(),
            Self::Sha512 => Sha512::digest(data).to_vec(),
        })
    }
}

/// The augmented challenge of a DH exchange (TP 8006): `Ca = HMAC(H(g^xy mod p), C)`, the
/// session key hashed and used as the HMAC key over the challenge, as Linux's
/// `nvme_auth_augmented_challenge` computes it.
pub(crate) fn augmented_challenge(
    hash: HashId,
    session_key: &[u8],
    challenge: &[u8],
) -> Zeroizing<Vec<u8>> {
    let hashed = hash.digest(session_key);
    hash.hmac(&hashed, &[challenge])
}

/// The two NQNs a transaction is bound to (the Connect command's HOSTNQN and SUBNQN).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Nqns {
    pub(crate) host: String,
    pub(crate) subsystem: String,
}

/// Which side a response value proves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// The host's response R1 to C1 (the string "HostHost", then NQNh, 00h, NQNc).
    Host,
    /// The controller's response R2 to C2 (the string "Controller", then NQNc, 00h, NQNh).
    Controller,
}

/// A response value (TP 8006): `HMAC(Kx, C || le32(seqnum) || le16(T_ID) || 00h || role ||
/// NQN1 || 00h || NQN2)` with the transformed key of the side that answers and the (augmented)
/// challenge it answers, byte for byte as Linux's `nvme_auth_dhchap_setup_host_response` and
/// `_ctrl_response` feed it (the 00h after T_ID is the SC_C of a transaction without secure
/// channel concatenation).
pub(crate) fn response(
    hash: HashId,
    transformed_key: &[u8],
    challenge: &[u8],
    seqnum: u32,
    t_id: u16,
    role: Role,
    nqns: &Nqns,
) -> Zeroizing<Vec<u8>> {
    let (tag, first, second): (&[u8], &str, &str) = match role {
        Role::Host => (b"HostHost", &nqns.host, &nqns.subsystem),
        Role::Controller => (b"Controller", &nqns.subsystem, &nqns.host),
    };
    hash.hmac(
        transformed_key,
        &[
            challenge,
            &seqnum.to_le_bytes(),
            &t_id.to_le_bytes(),
            &[0],
            tag,
            first.as_bytes(),
            &[0],
            second.as_bytes(),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc4231_case_2() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        let out = HashId::Sha256.hmac(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        assert_eq!(
            hex(&out),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        let out = HashId::Sha384.hmac(b"Jefe", &[b"what do ya want for nothing?"]);
        assert!(hex(&out).starts_with("af45d2e376484031617f78d2b58a6b1b"));
        let out = HashId::Sha512.hmac(b"Jefe", &[b"what do ya want for nothing?"]);
        assert!(hex(&out).starts_with("164b7a7bfcf819e2e395fbe73b56e0a3"));
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }
}
