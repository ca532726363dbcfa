//! NVMe/TCP's TLS pre-shared keys (TP 8011, NVMe/TCP Transport 1.1 "PSK Interchange Format",
//! "Retained PSK", "TLS PSK", "PSK Identity"): the `NVMeTLSkey-1:` interchange format, the
//! derivations from a configured PSK to the key TLS 1.3 uses, the PSK identities, and the store
//! a target picks a key from by the identity a host offers. No I/O; the TLS itself is the
//! `nvme-tls` crate's.
//!
//! # The chain, and what Linux does in practice
//! 1. **Configured PSK**: what an operator types, `NVMeTLSkey-1:HH:<base64(key || crc32)>:`
//!    where `HH` is `00` (use the key as the retained PSK), `01` (transform it with SHA-256, a
//!    32-byte key) or `02` (SHA-384, 48 bytes), and the CRC-32 (zlib's) of the key is appended
//!    little-endian ([`ConfiguredPsk`]).
//! 2. **Retained PSK** = HKDF-Expand-Label(HKDF-Extract(0, configured), "HostNQN", NQNh, L)
//!    ([`ConfiguredPsk::retained`]).
//! 3. **PSK identity**: `NVMe0R0H <hostnqn> <subnqn>` (NVMe/TCP 1.0c) or
//!    `NVMe1R0H <hostnqn> <subnqn> <digest>` (TP 8011 / NVMe/TCP 1.1), where `H` is 1 for
//!    SHA-256 / TLS_AES_128_GCM_SHA256 and 2 for SHA-384 / TLS_AES_256_GCM_SHA384, and the
//!    digest is base64(HMAC(retained, hostnqn " " subnqn " " "NVMe-over-Fabrics"))
//!    ([`PskIdentity`], [`RetainedPsk::digest`]).
//! 4. **TLS PSK** = HKDF-Expand-Label(HKDF-Extract(0, retained), "nvme-tls-psk", context, L)
//!    with context = the whole identity for version 0 and `"0H <digest>"` for version 1
//!    ([`RetainedPsk::tls_psk`]). TLS 1.3 uses this as its external PSK.
//!
//! Linux 6.12 does none of steps 1–4 for a configured key: `nvme check-tls-key --insert` /
//! `nvme connect --tls-key` (libnvme) derive the TLS PSK in user space and put it into the
//! `.nvme` keyring under the identity as the key's description; the kernel (host:
//! `nvme_tls_psk_default`, preferring `NVMe1R02`, `NVMe1R01`, `NVMe0R02`, `NVMe0R01` in that
//! order, matching the description's prefix) hands the key's serial to `tlshd`, which offers
//! the description as the identity and the payload as the key (GnuTLS, psk_dhe_ke only, the
//! cipher suite by the key's length). A target's `tlshd` looks the offered identity up in
//! its keyring. So the keys both ends use are libnvme's.
//!
//! **The interop trap** (issue 30's "hosts and targets that derive different TLS keys"):
//! libnvme before 1.16 (so nvme-cli ≤ 2.15: Debian 13's 1.13, RHEL 9/10's) builds the HKDF
//! `info` of steps 2 and 4 wrongly — the 16-bit length little-endian and the label and
//! context without their length bytes: `le16(L) || "tls13 HostNQN" || hostnqn`. libnvme 1.16
//! ("TLS PSK derivation fixes") follows RFC 8446 §7.1's HkdfLabel and keeps the old form as
//! `--compat`. Both are here ([`Derivation::Libnvme`] and [`Derivation::Rfc8446`]); a version
//! 1 identity says which one its host used (its digest comes from the retained PSK, which
//! differs), a version 0 identity does not, so a [`PskStore`] tries the version 1 digest of
//! both and uses its configured default for version 0 (libnvme's, what Linux hosts in the
//! field insert).
//!
//! Secrets ([`ConfiguredPsk`], [`RetainedPsk`], [`TlsPsk`]) print `<redacted>` in Debug, are
//! zeroized on drop and compare in constant time.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::{Sha256, Sha384};
use subtle::ConstantTimeEq;
use zeroize::{Zeroize, Zeroizing};

/// Why a key, an identity or a lookup was refused. Texts never hold key material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PskError {
    /// Not `NVMeTLSkey-1:HH:<base64>:` with HH 00, 01 or 02.
    #[error("not a TLS PSK in the NVMeTLSkey-1 interchange format: {0}")]
    Format(&'static str),
    /// The base64 decoded to a key whose CRC-32 does not match (a typo in the key).
    #[error("the TLS PSK's CRC-32 does not match its key (a mistyped key?)")]
    Crc,
    /// The key's length does not fit the hash its header names (32 bytes for 01, 48 for 02).
    #[error("a {len}-byte key does not fit hash indicator {hash:02}")]
    Length {
        /// Hash indicator from the header.
        hash: u8,
        /// Decoded key length.
        len: usize,
    },
    /// Not an NVMe PSK identity (`NVMe<v><R|G><hh> <hostnqn> <subnqn>[ <digest>]`).
    #[error("not an NVMe/TCP PSK identity: {0}")]
    Identity(&'static str),
    /// No key is configured for this host and subsystem.
    #[error("no TLS PSK configured for host {hostnqn} and subsystem {subnqn}")]
    UnknownHost {
        /// The host NQN the identity named.
        hostnqn: String,
        /// The subsystem NQN the identity named.
        subnqn: String,
    },
    /// The identity asks for another hash than the configured key has.
    #[error("identity asks for hash {asked:02}, the configured key is for {configured:02}")]
    HashMismatch {
        /// Hash indicator of the identity.
        asked: u8,
        /// Hash indicator of the configured key.
        configured: u8,
    },
    /// A version 1 identity whose digest matches neither derivation of the configured key: the
    /// host holds another key.
    #[error("the identity's PSK digest does not match the configured key")]
    DigestMismatch,
    /// Generated PSKs (`NVMe1G…`, from DH-HMAC-CHAP secure channel concatenation) are not
    /// supported.
    #[error("generated PSKs (secure channel concatenation) are not supported")]
    Generated,
}

/// The hash of a PSK: it fixes the key length, the HMAC/HKDF hash and the TLS 1.3 cipher
/// suite (TP 8011: SHA-256 ↔ TLS_AES_128_GCM_SHA256, SHA-384 ↔ TLS_AES_256_GCM_SHA384).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PskHash {
    /// Indicator 01: 32-byte keys, TLS_AES_128_GCM_SHA256.
    Sha256,
    /// Indicator 02: 48-byte keys, TLS_AES_256_GCM_SHA384.
    Sha384,
}

impl PskHash {
    /// The two-digit indicator (`01`, `02`) of keys and identities.
    pub fn id(self) -> u8 {
        match self {
            Self::Sha256 => 1,
            Self::Sha384 => 2,
        }
    }

    /// From the indicator; 0 and others are not a hash.
    pub fn from_id(id: u8) -> Option<Self> {
        match id {
            1 => Some(Self::Sha256),
            2 => Some(Self::Sha384),
            _ => None,
        }
    }

    /// The key (and digest output) length in bytes.
    pub fn key_len(self) -> usize {
        match self {
            Self::Sha256 => 32,
            Self::Sha384 => 48,
        }
    }

    /// The hash whose output length is `len`, as libnvme picks the cipher of an `00` key.
    pub fn for_len(len: usize) -> Option<Self> {
        match len {
            32 => Some(Self::Sha256),
            48 => Some(Self::Sha384),
            _ => None,
        }
    }

    /// The TLS 1.3 cipher suite this PSK is used with (its IANA name).
    pub fn cipher_suite(self) -> &'static str {
        match self {
            Self::Sha256 => "TLS_AES_128_GCM_SHA256",
            Self::Sha384 => "TLS_AES_256_GCM_SHA384",
        }
    }

    fn hmac(self, key: &[u8], parts: &[&[u8]]) -> Zeroizing<Vec<u8>> {
        fn run<M: Mac + hmac::digest::KeyInit>(key: &[u8], parts: &[&[u8]]) -> Zeroizing<Vec<u8>> {
            // HMAC takes keys of any length, so `new_from_slice` cannot fail.
            let mut mac = match <M as hmac::digest::KeyInit>::new_from_slice(key) {
                Ok(m) => m,
                Err(_) => return Zeroizing::new(Vec::new()),
            };
            for p in parts {
                mac.update(p);
            }
            Zeroizing::new(mac.finalize().into_bytes().to_vec())
        }
        match self {
            Self::Sha256 => run::<Hmac<Sha256>>(key, parts),
            Self::Sha384 => run::<Hmac<Sha384>>(key, parts),
        }
    }

    /// HKDF-Extract with no salt (a hash-length string of zeros), then HKDF-Expand with `info`
    /// to `len` bytes (RFC 5869).
    fn hkdf(self, ikm: &[u8], info: &[u8], len: usize) -> Zeroizing<Vec<u8>> {
        let mut out = Zeroizing::new(vec![0u8; len]);
        // `len` is at most 48, far below 255 hash lengths, so expand cannot fail.
        let ok = match self {
            Self::Sha256 => hkdf::Hkdf::<Sha256>::new(None, ikm)
                .expand(info, &mut out)
                .is_ok(),
            Self::Sha384 => hkdf::Hkdf::<Sha384>::new(None, ikm)
                .expand(info, &mut out)
                .is_ok(),
        };
        debug_assert!(ok);
        out
    }
}

/// Which HKDF `info` layout derives the retained and TLS PSKs (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Derivation {
    /// RFC 8446 §7.1's HkdfLabel (`be16(L) || len || "tls13 " label || len || context`), as
    /// TP 8011 specifies and libnvme ≥ 1.16 derives.
    Rfc8446,
    /// libnvme before 1.16 (nvme-cli ≤ 2.15: Debian 13, RHEL 9/10) and `--compat` after it:
    /// `le16(L) || "tls13 " label || context`, no length bytes. What Linux hosts and targets
    /// configured with today's distributions' `nvme` tool use, hence the default.
    #[default]
    Libnvme,
}

impl Derivation {
    /// Both, the default first.
    pub const ALL: [Derivation; 2] = [Derivation::Libnvme, Derivation::Rfc8446];

    fn info(self, len: usize, label: &str, context: &[&[u8]]) -> Vec<u8> {
        let ctx_len: usize = context.iter().map(|c| c.len()).sum();
        let mut info = Vec::with_capacity(4 + 6 + label.len() + ctx_len);
        let len = u16::try_from(len).unwrap_or(u16::MAX);
        match self {
            Self::Rfc8446 => {
                info.extend_from_slice(&len.to_be_bytes());
                // Labels and contexts here are < 256 bytes (an NQN is at most 223).
                info.push(u8::try_from(6 + label.len()).unwrap_or(u8::MAX));
                info.extend_from_slice(b"tls13 ");
                info.extend_from_slice(label.as_bytes());
                info.push(u8::try_from(ctx_len).unwrap_or(u8::MAX));
            }
            Self::Libnvme => {
                info.extend_from_slice(&len.to_le_bytes());
                info.extend_from_slice(b"tls13 ");
                info.extend_from_slice(label.as_bytes());
            }
        }
        for c in context {
            info.extend_from_slice(c);
        }
        info
    }
}

macro_rules! secret_type {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Clone)]
        pub struct $name {
            hash: PskHash,
            key: Zeroizing<Vec<u8>>,
        }

        impl $name {
            /// The hash this key is for (its length, its HMAC, its cipher suite).
            pub fn hash(&self) -> PskHash {
                self.hash
            }

            /// The key bytes. Hand them to the TLS library only.
            pub fn expose(&self) -> &[u8] {
                &self.key
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("hash", &self.hash)
                    .field("key", &"<redacted>")
                    .finish()
            }
        }

        impl PartialEq for $name {
            fn eq(&self, other: &Self) -> bool {
                self.hash == other.hash && bool::from(self.key.as_slice().ct_eq(other.key.as_slice()))
            }
        }

        impl Eq for $name {}
    };
}

secret_type!(
    /// The retained PSK (step 2), from which the TLS PSK of each identity is derived.
    RetainedPsk
);
secret_type!(
    /// The key TLS 1.3 uses as its external PSK (step 4).
    TlsPsk
);

/// A configured PSK (step 1), as parsed from the `NVMeTLSkey-1:` interchange format.
#[derive(Clone)]
pub struct ConfiguredPsk {
    /// `None` for indicator 00: the configured PSK is the retained PSK.
    transform: Option<PskHash>,
    key: Zeroizing<Vec<u8>>,
}

impl fmt::Debug for ConfiguredPsk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConfiguredPsk")
            .field("transform", &self.transform)
            .field("key", &"<redacted>")
            .finish()
    }
}

impl PartialEq for ConfiguredPsk {
    fn eq(&self, other: &Self) -> bool {
        self.transform == other.transform
            && bool::from(self.key.as_slice().ct_eq(other.key.as_slice()))
    }
}

impl Eq for ConfiguredPsk {}

impl ConfiguredPsk {
    /// A configured PSK from raw key bytes: `transform` `None` (indicator 00) takes 32 or 48
    /// bytes, otherwise the length must be the hash's.
    pub fn new(transform: Option<PskHash>, key: &[u8]) -> Result<Self, PskError> {
        let ok = match transform {
            None => PskHash::for_len(key.len()).is_some(),
            Some(h) => key.len() == h.key_len(),
        };
        if !ok {
            return Err(PskError::Length {
                hash: transform.map_or(0, PskHash::id),
                len: key.len(),
            });
        }
        Ok(Self {
            transform,
            key: Zeroizing::new(key.to_vec()),
        })
    }

    /// Parses `NVMeTLSkey-1:HH:<base64(key || le32 crc32(key))>:` (NVMe/TCP 1.1 "PSK
    /// Interchange Format"); surrounding whitespace (a key file's newline) is ignored.
    pub fn parse(text: &str) -> Result<Self, PskError> {
        let text = text.trim();
        let rest = text
            .strip_prefix("NVMeTLSkey-1:")
            .ok_or(PskError::Format("does not start with NVMeTLSkey-1:"))?;
        let (hh, rest) = rest
            .split_once(':')
            .ok_or(PskError::Format("no ':' after the hash indicator"))?;
        let b64 = rest
            .strip_suffix(':')
            .ok_or(PskError::Format("does not end with ':'"))?;
        if hh.len() != 2 || !hh.bytes().all(|b| b.is_ascii_digit()) {
            return Err(PskError::Format("the hash indicator is not two digits"));
        }
        let transform = match hh {
            "00" => None,
            "01" => Some(PskHash::Sha256),
            "02" => Some(PskHash::Sha384),
            _ => return Err(PskError::Format("unknown hash indicator (00, 01, 02)")),
        };
        let raw = Zeroizing::new(
            B64.decode(b64)
                .map_err(|_| PskError::Format("the key is not base64"))?,
        );
        if raw.len() < 4 {
            return Err(PskError::Format("the key is too short"));
        }
        let (key, crc) = raw.split_at(raw.len() - 4);
        let stated = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
        if crc32fast::hash(key) != stated {
            return Err(PskError::Crc);
        }
        Self::new(transform, key)
    }

    /// The interchange format of this key (what `nvme gen-tls-key` prints).
    pub fn encode(&self) -> Zeroizing<String> {
        let mut raw = Zeroizing::new(Vec::with_capacity(self.key.len() + 4));
        raw.extend_from_slice(&self.key);
        raw.extend_from_slice(&crc32fast::hash(&self.key).to_le_bytes());
        let mut out = Zeroizing::new(format!(
            "NVMeTLSkey-1:{:02}:",
            self.transform.map_or(0, PskHash::id)
        ));
        let mut b = Zeroizing::new(B64.encode(raw.as_slice()));
        out.push_str(&b);
        out.push(':');
        b.zeroize();
        out
    }

    /// The transform hash (`None` for indicator 00).
    pub fn transform(&self) -> Option<PskHash> {
        self.transform
    }

    /// The hash of the PSKs derived from this key: the transform's, or for 00 the one the key
    /// length implies (libnvme's `default_hmac`).
    pub fn hash(&self) -> PskHash {
        self.transform
            .or_else(|| PskHash::for_len(self.key.len()))
            .unwrap_or(PskHash::Sha256)
    }

    /// Step 2: the retained PSK for `hostnqn`.
    pub fn retained(&self, hostnqn: &str, derivation: Derivation) -> RetainedPsk {
        let hash = self.hash();
        let key = match self.transform {
            None => self.key.clone(),
            Some(h) => {
                let info = derivation.info(self.key.len(), "HostNQN", &[hostnqn.as_bytes()]);
                h.hkdf(&self.key, &info, self.key.len())
            }
        };
        RetainedPsk { hash, key }
    }

    /// Steps 2–4 for a host: the identity it offers and the TLS PSK for it.
    pub fn tls_psk(
        &self,
        hostnqn: &str,
        subnqn: &str,
        version: IdentityVersion,
        derivation: Derivation,
    ) -> (PskIdentity, TlsPsk) {
        let retained = self.retained(hostnqn, derivation);
        let identity = retained.identity(version, hostnqn, subnqn);
        let psk = retained.tls_psk(&identity, derivation);
        (identity, psk)
    }
}

impl RetainedPsk {
    /// The PSK digest of a version 1 identity: base64(HMAC-hash(retained, hostnqn || " " ||
    /// subnqn || " " || "NVMe-over-Fabrics")).
    pub fn digest(&self, hostnqn: &str, subnqn: &str) -> String {
        let mac = self.hash.hmac(
            &self.key,
            &[
                hostnqn.as_bytes(),
                b" ",
                subnqn.as_bytes(),
                b" ",
                b"NVMe-over-Fabrics",
            ],
        );
        B64.encode(mac.as_slice())
    }

    /// Step 3: the retained (`R`) identity of `version` for this key.
    pub fn identity(&self, version: IdentityVersion, hostnqn: &str, subnqn: &str) -> PskIdentity {
        PskIdentity {
            version,
            hash: self.hash,
            hostnqn: hostnqn.to_owned(),
            subnqn: subnqn.to_owned(),
            digest: match version {
                IdentityVersion::V0 => None,
                IdentityVersion::V1 => Some(self.digest(hostnqn, subnqn)),
            },
        }
    }

    /// Step 4: the TLS PSK for `identity` (its hash must be this key's; the caller checks).
    pub fn tls_psk(&self, identity: &PskIdentity, derivation: Derivation) -> TlsPsk {
        let len = self.key.len();
        let key = match (identity.version, &identity.digest) {
            (IdentityVersion::V1, Some(d)) => {
                let prefix = format!("{:02} ", identity.hash.id());
                let info = derivation.info(len, "nvme-tls-psk", &[prefix.as_bytes(), d.as_bytes()]);
                self.hash.hkdf(&self.key, &info, len)
            }
            _ => {
                let text = identity.to_string();
                let info = derivation.info(len, "nvme-tls-psk", &[text.as_bytes()]);
                self.hash.hkdf(&self.key, &info, len)
            }
        };
        TlsPsk {
            hash: self.hash,
            key,
        }
    }
}

impl TlsPsk {
    /// A TLS PSK from raw bytes (32 or 48), e.g. one read out of a Linux keyring.
    pub fn from_bytes(key: &[u8]) -> Result<Self, PskError> {
        let hash = PskHash::for_len(key.len()).ok_or(PskError::Length {
            hash: 0,
            len: key.len(),
        })?;
        Ok(Self {
            hash,
            key: Zeroizing::new(key.to_vec()),
        })
    }
}

/// The format of a PSK identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdentityVersion {
    /// `NVMe0R0H <hostnqn> <subnqn>` (NVMe/TCP 1.0c); what `nvme check-tls-key --insert` and
    /// `gen-tls-key --insert` use unless `--identity=1`.
    V0,
    /// `NVMe1R0H <hostnqn> <subnqn> <digest>` (TP 8011); Linux's host prefers it when the
    /// keyring holds one, and `nvme connect --tls-key` (libnvme 1.13) files keys under it.
    V1,
}

/// A PSK identity (step 3), as offered in the TLS ClientHello.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PskIdentity {
    /// Identity format.
    pub version: IdentityVersion,
    /// The hash (and so the cipher suite) of the PSK.
    pub hash: PskHash,
    /// The host's NQN.
    pub hostnqn: String,
    /// The subsystem's NQN.
    pub subnqn: String,
    /// The PSK digest (version 1 only).
    pub digest: Option<String>,
}

impl fmt::Display for PskIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = match self.version {
            IdentityVersion::V0 => 0,
            IdentityVersion::V1 => 1,
        };
        write!(
            f,
            "NVMe{v}R{:02} {} {}",
            self.hash.id(),
            self.hostnqn,
            self.subnqn
        )?;
        if let Some(d) = &self.digest {
            write!(f, " {d}")?;
        }
        Ok(())
    }
}

impl PskIdentity {
    /// Whether this identity names `hostnqn` and `subnqn`: a target keyed a connection for
    /// this identity accepts only a Fabrics Connect with these NQNs on it (TP 8011: the PSK
    /// authenticates the host the identity names, not whichever host the Connect claims).
    pub fn names(&self, hostnqn: &str, subnqn: &str) -> bool {
        self.hostnqn == hostnqn && self.subnqn == subnqn
    }

    /// Parses an identity as a host offers it. NQNs hold no spaces (NVMe Base 2.0 "NVMe
    /// Qualified Names": printable ASCII without spaces in practice; Linux splits on them too).
    pub fn parse(text: &[u8]) -> Result<Self, PskError> {
        let text = std::str::from_utf8(text).map_err(|_| PskError::Identity("not UTF-8"))?;
        let mut words = text.split(' ');
        let head = words.next().unwrap_or_default();
        let b = head.as_bytes();
        if b.len() != 8 || !head.starts_with("NVMe") {
            return Err(PskError::Identity("does not start with NVMe<v><R|G><hh>"));
        }
        let version = match b[4] {
            b'0' => IdentityVersion::V0,
            b'1' => IdentityVersion::V1,
            _ => return Err(PskError::Identity("unknown version")),
        };
        match b[5] {
            b'R' => {}
            b'G' => return Err(PskError::Generated),
            _ => return Err(PskError::Identity("neither R nor G")),
        }
        let hash = match &b[6..8] {
            b"01" => PskHash::Sha256,
            b"02" => PskHash::Sha384,
            _ => return Err(PskError::Identity("unknown hash")),
        };
        let hostnqn = words.next().filter(|w| !w.is_empty());
        let subnqn = words.next().filter(|w| !w.is_empty());
        let (Some(hostnqn), Some(subnqn)) = (hostnqn, subnqn) else {
            return Err(PskError::Identity("no host and subsystem NQN"));
        };
        let digest = words.next().filter(|w| !w.is_empty()).map(str::to_owned);
        if words.next().is_some() {
            return Err(PskError::Identity("extra words"));
        }
        match (version, &digest) {
            (IdentityVersion::V0, Some(_)) => {
                return Err(PskError::Identity("a version 0 identity has no digest"))
            }
            (IdentityVersion::V1, None) => {
                return Err(PskError::Identity("a version 1 identity needs a digest"))
            }
            _ => {}
        }
        Ok(Self {
            version,
            hash,
            hostnqn: hostnqn.to_owned(),
            subnqn: subnqn.to_owned(),
            digest,
        })
    }
}

/// What a target knows about a host's key: the configured PSK and the derivation assumed for
/// version 0 identities (version 1 identities say theirs through their digest).
#[derive(Debug, Clone)]
struct Entry {
    key: ConfiguredPsk,
    v0_derivation: Derivation,
}

/// A target's keys: (host NQN, subsystem NQN) → configured PSK, and host NQN → a key for every
/// subsystem (the discovery subsystem included: `nvme discover --tls` offers an identity for
/// `nqn.2014-08.org.nvmexpress.discovery`). Cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct PskStore {
    entries: Arc<HashMap<(String, String), Entry>>,
    hosts: Arc<HashMap<String, Entry>>,
}

/// The key a [`PskStore`] chose for an offered identity.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The identity as offered (parsed).
    pub identity: PskIdentity,
    /// The derivation that matched (for version 0: the configured one).
    pub derivation: Derivation,
    /// The TLS PSK for it.
    pub psk: TlsPsk,
}

impl PskStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) the key of `hostnqn` for `subnqn`; version 0 identities are
    /// assumed to be keyed the [`Derivation::default`] way.
    pub fn insert(&mut self, hostnqn: &str, subnqn: &str, key: ConfiguredPsk) {
        self.insert_with(hostnqn, subnqn, key, Derivation::default());
    }

    /// Adds a key with the derivation its host uses for version 0 identities.
    pub fn insert_with(
        &mut self,
        hostnqn: &str,
        subnqn: &str,
        key: ConfiguredPsk,
        v0_derivation: Derivation,
    ) {
        Arc::make_mut(&mut self.entries).insert(
            (hostnqn.to_owned(), subnqn.to_owned()),
            Entry { key, v0_derivation },
        );
    }

    /// Adds (or replaces) the key of `hostnqn` for every subsystem without a key of its own;
    /// the TLS PSK is still derived for the subsystem the identity names.
    pub fn insert_host(&mut self, hostnqn: &str, key: ConfiguredPsk, v0_derivation: Derivation) {
        Arc::make_mut(&mut self.hosts).insert(hostnqn.to_owned(), Entry { key, v0_derivation });
    }

    /// Whether `hostnqn` has a key for `subnqn` (its own for that subsystem, or one for every
    /// subsystem): a TLS connection for that pair can be keyed.
    pub fn has_key(&self, hostnqn: &str, subnqn: &str) -> bool {
        self.hosts.contains_key(hostnqn)
            || self
                .entries
                .contains_key(&(hostnqn.to_owned(), subnqn.to_owned()))
    }

    /// Number of keys (per subsystem and host-wide).
    pub fn len(&self) -> usize {
        self.entries.len() + self.hosts.len()
    }

    /// Whether the store holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The TLS PSK for an identity a host offered (the raw bytes of the ClientHello's
    /// PskIdentity), or why there is none.
    pub fn resolve(&self, offered: &[u8]) -> Result<Resolved, PskError> {
        let identity = PskIdentity::parse(offered)?;
        let entry = self
            .entries
            .get(&(identity.hostnqn.clone(), identity.subnqn.clone()))
            .or_else(|| self.hosts.get(&identity.hostnqn))
            .ok_or_else(|| PskError::UnknownHost {
                hostnqn: identity.hostnqn.clone(),
                subnqn: identity.subnqn.clone(),
            })?;
        let configured = entry.key.hash();
        if configured != identity.hash {
            return Err(PskError::HashMismatch {
                asked: identity.hash.id(),
                configured: configured.id(),
            });
        }
        let derivation = match &identity.digest {
            None => entry.v0_derivation,
            Some(offered_digest) => {
                // The digest is public (it is in the identity); which derivation produces it
                // tells how the host derived its keys.
                let mut order = vec![entry.v0_derivation];
                order.extend(
                    Derivation::ALL
                        .iter()
                        .filter(|d| **d != entry.v0_derivation),
                );
                *order
                    .iter()
                    .find(|d| {
                        let r = entry.key.retained(&identity.hostnqn, **d);
                        let ours = r.digest(&identity.hostnqn, &identity.subnqn);
                        bool::from(ours.as_bytes().ct_eq(offered_digest.as_bytes()))
                    })
                    .ok_or(PskError::DigestMismatch)?
            }
        };
        let psk = entry
            .key
            .retained(&identity.hostnqn, derivation)
            .tls_psk(&identity, derivation);
        Ok(Resolved {
            identity,
            derivation,
            psk,
        })
    }
}
