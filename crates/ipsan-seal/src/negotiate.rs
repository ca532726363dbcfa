//! Sans-IO Seal negotiation in the operational stage of login (RFC 7143 §6 text negotiation,
//! §13 operational keys), carried in vendor-specific `X-` keys (RFC 7143 §6.1). The key
//! schedule is in [`crate::schedule`]; the whole protocol is specified in `docs/seal.md`.
//!
//! ```text
//! initiator                                            target
//!   X-org.ipsan.Seal=aes-256-gcm,chacha20-poly1305  ->  (list: target picks the first it accepts,
//!   X-org.ipsan.SealChunk=65536                     ->   RFC 7143 §6.2.1)
//!   X-org.ipsan.SealNonce=0x<32 random bytes>       ->
//!   X-org.ipsan.SealShare=0x<CPace Ya, 32 bytes>    ->
//!                                                   <-  X-org.ipsan.Seal=aes-256-gcm
//!                                                   <-  X-org.ipsan.SealChunk=65536 (minimum)
//!                                                   <-  X-org.ipsan.SealNonce=0x<32 random bytes>
//!                                                   <-  X-org.ipsan.SealShare=0x<CPace Yb>
//!                                                   <-  X-org.ipsan.SealConfirm=0x<HMAC> (T=0)
//!   X-org.ipsan.SealConfirm=0x<HMAC>                ->  verified before the target sets T=1
//! ```
//! Compression (docs/seal.md §4b) rides with the offer when the initiator asks for it:
//! `X-org.ipsan.Compression=lz4,none`, answered `lz4` when the target is configured to
//! compress and `none` otherwise (RFC 7143 §6.2.1 list rule); off unless both ends ask. Like
//! every login key it is bound by the key confirmations (the login transcript), so a relay
//! that strips or edits it fails the login.
//! The pre-shared secret is CPace's password ([`crate::cpace`]): the keys come from the CPace
//! output, so neither a recorded login nor the target's answer to a probe lets anyone test a
//! guess offline; a prober learns only whether the one secret it used for its share was right,
//! at the cost of a refused login. No round trip is added: the shares ride with the offer and
//! the answer. The initiator verifies the target's confirmation (the target knows the secret
//! and saw the offer unaltered); the target verifies the initiator's before it lets the login
//! reach full feature phase, so a wrong pre-shared secret fails the LOGIN with "Authorization
//! failure" (0x0202), not the first write. Keys and values are plain `(String, String)` pairs;
//! the login engine carries them without interpreting them.

use aws_lc_rs::rand::{SecureRandom, SystemRandom};

use crate::cipher::Cipher;
use crate::compress::Compression;
pub use crate::compress::KEY_COMPRESSION;
use crate::cpace::{Party, SHARE_LEN};
use crate::error::NegotiationError;
use crate::frame::Framing;
use crate::record::LoginTranscript;
use crate::schedule::{self, Psk, SessionIds, Transcript, TranscriptHash, NONCE_LEN};
use crate::session::{Role, SealSession};

/// Offer: the initiator's cipher preference list; answer: the chosen cipher or `Reject`.
pub const KEY_SEAL: &str = "X-org.ipsan.Seal";
/// Chunk size in bytes (numeric, minimum-function negotiation like MaxBurstLength).
pub const KEY_CHUNK: &str = "X-org.ipsan.SealChunk";
/// Each side's fresh 32-byte random value, as an RFC 7143 §6.1 hex-constant.
pub const KEY_NONCE: &str = "X-org.ipsan.SealNonce";
/// Each side's CPace share (a 32-byte ristretto255 element), as a hex-constant.
pub const KEY_SHARE: &str = "X-org.ipsan.SealShare";
/// Key confirmation: HMAC-SHA256 under the derived confirmation key, hex-constant.
pub const KEY_CONFIRM: &str = "X-org.ipsan.SealConfirm";

/// Default chunk size (64 KiB).
pub const DEFAULT_CHUNK: u32 = 65536;
/// Smallest negotiable chunk size.
pub const MIN_CHUNK: u32 = 512;
pub use crate::cipher::MAX_CHUNK;

/// Key/value pairs as carried in a login text segment.
pub type TextPairs = Vec<(String, String)>;

/// The target's Seal policy (`--seal off|allowed|required`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SealPolicy {
    /// Never seal; an offer is answered `Reject` (plaintext session).
    Off,
    /// Seal when the initiator offers it and a secret is configured; otherwise plaintext.
    #[default]
    Allowed,
    /// Every login must negotiate a protecting cipher (not `none`) or fail with
    /// Authorization failure.
    Required,
}

impl std::str::FromStr for SealPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" => Ok(SealPolicy::Off),
            "allowed" => Ok(SealPolicy::Allowed),
            "required" => Ok(SealPolicy::Required),
            other => Err(format!(
                "unknown seal policy {other:?} (expected off, allowed or required)"
            )),
        }
    }
}

fn get<'a>(keys: &'a [(String, String)], key: &str) -> Option<&'a str> {
    keys.iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

fn valid_chunk(c: u32) -> bool {
    (MIN_CHUNK..=MAX_CHUNK).contains(&c) && c % 512 == 0
}

fn parse_chunk(v: Option<&str>) -> Result<u32, NegotiationError> {
    let v = v.ok_or(NegotiationError::MissingKey(KEY_CHUNK))?;
    let c: u32 = v.parse().map_err(|_| NegotiationError::Malformed {
        key: KEY_CHUNK,
        why: "not a decimal number",
    })?;
    if !valid_chunk(c) {
        return Err(NegotiationError::Malformed {
            key: KEY_CHUNK,
            why: "must be a multiple of 512 between 512 and 16777216",
        });
    }
    Ok(c)
}

fn parse_nonce(v: Option<&str>) -> Result<[u8; NONCE_LEN], NegotiationError> {
    let v = v.ok_or(NegotiationError::MissingKey(KEY_NONCE))?;
    let bytes = schedule::from_hex_constant(v).ok_or(NegotiationError::Malformed {
        key: KEY_NONCE,
        why: "not a 0x hex-constant",
    })?;
    bytes.try_into().map_err(|_| NegotiationError::Malformed {
        key: KEY_NONCE,
        why: "must be 32 bytes",
    })
}

fn parse_share(v: Option<&str>) -> Result<[u8; SHARE_LEN], NegotiationError> {
    let v = v.ok_or(NegotiationError::MissingKey(KEY_SHARE))?;
    let bytes = schedule::from_hex_constant(v).ok_or(NegotiationError::Malformed {
        key: KEY_SHARE,
        why: "not a 0x hex-constant",
    })?;
    bytes.try_into().map_err(|_| NegotiationError::Malformed {
        key: KEY_SHARE,
        why: "must be 32 bytes",
    })
}

const INVALID_SHARE: NegotiationError = NegotiationError::Malformed {
    key: KEY_SHARE,
    why: "not a valid ristretto255 element, or the identity",
};

/// One side of CPace for this login: the PSK is the password, `sid` the initiator's nonce.
fn cpace_party(
    psk: &Psk,
    ids: &SessionIds,
    nonce_i: &[u8; NONCE_LEN],
) -> Result<Party, NegotiationError> {
    Ok(Party::new(
        psk.expose(),
        &schedule::cpace_ci(ids),
        nonce_i,
        fresh_nonce()?,
    ))
}

fn fresh_nonce() -> Result<[u8; NONCE_LEN], NegotiationError> {
    let mut n = [0u8; NONCE_LEN];
    SystemRandom::new()
        .fill(&mut n)
        .map_err(|_| NegotiationError::Crypto)?;
    Ok(n)
}

/// Initiator side: build with [`SealOffer::new`], send [`SealOffer::keys`] in the first
/// operational-stage Login Request, feed the target's answer to [`SealOffer::handle_answer`].
#[derive(Debug)]
pub struct SealOffer {
    ciphers: Vec<Cipher>,
    offer: String,
    chunk: u32,
    nonce: [u8; NONCE_LEN],
    /// This login's CPace scalar and share (the PSK itself is not kept).
    cpace: Party,
    ids: SessionIds,
    /// Whether to offer `X-org.ipsan.Compression=lz4,none`.
    compress: bool,
}

impl SealOffer {
    /// `ciphers` in preference order (must not be empty), `chunk` bytes per chunk.
    pub fn new(
        ciphers: Vec<Cipher>,
        chunk: u32,
        psk: Psk,
        ids: SessionIds,
    ) -> Result<SealOffer, NegotiationError> {
        Self::with_nonce(ciphers, chunk, psk, ids, fresh_nonce()?)
    }

    /// As [`SealOffer::new`] with a caller-chosen nonce (tests only: nonces must be fresh).
    #[doc(hidden)]
    pub fn with_nonce(
        ciphers: Vec<Cipher>,
        chunk: u32,
        psk: Psk,
        ids: SessionIds,
        nonce: [u8; NONCE_LEN],
    ) -> Result<SealOffer, NegotiationError> {
        if ciphers.is_empty() {
            return Err(NegotiationError::Malformed {
                key: KEY_SEAL,
                why: "empty cipher list",
            });
        }
        if !valid_chunk(chunk) {
            return Err(NegotiationError::Malformed {
                key: KEY_CHUNK,
                why: "must be a multiple of 512 between 512 and 16777216",
            });
        }
        let offer = ciphers
            .iter()
            .map(|c| c.name())
            .collect::<Vec<_>>()
            .join(",");
        let cpace = cpace_party(&psk, &ids, &nonce)?;
        Ok(SealOffer {
            ciphers,
            offer,
            chunk,
            nonce,
            cpace,
            ids,
            compress: false,
        })
    }

    /// Also offers compression (`X-org.ipsan.Compression=lz4,none`, docs/seal.md §4b).
    #[must_use]
    pub fn with_compression(mut self, on: bool) -> Self {
        self.compress = on;
        self
    }

    /// The keys to send.
    pub fn keys(&self) -> TextPairs {
        let mut keys = self.seal_keys();
        if self.compress {
            keys.push((KEY_COMPRESSION.to_owned(), "lz4,none".to_owned()));
        }
        keys
    }

    fn seal_keys(&self) -> TextPairs {
        vec![
            (KEY_SEAL.to_owned(), self.offer.clone()),
            (KEY_CHUNK.to_owned(), self.chunk.to_string()),
            (KEY_NONCE.to_owned(), schedule::to_hex_constant(&self.nonce)),
            (
                KEY_SHARE.to_owned(),
                schedule::to_hex_constant(self.cpace.share()),
            ),
        ]
    }

    /// Consumes the target's answer. On success returns the session and the keys to send in the
    /// next Login Request (the initiator's confirmation). [`NegotiationError::NotAgreed`] means
    /// the target answered without Seal: the caller decides whether a plaintext session is
    /// acceptable (the bench with `--seal` treats it as fatal).
    ///
    /// This form binds an empty login transcript (both sides must use it: tests, benchmarks,
    /// the lab's calibration). A real login uses [`SealOffer::handle_answer_bound`].
    pub fn handle_answer(
        self,
        answer: &[(String, String)],
    ) -> Result<(SealSession, TextPairs), NegotiationError> {
        let empty = LoginTranscript::new().hash();
        self.handle_answer_bound(answer, &empty, &empty)
    }

    /// As [`SealOffer::handle_answer`], binding the login transcript: `before` hashes every
    /// Login PDU before the response that carries the answer (the target's confirmation covers
    /// it), `through` every Login PDU up to and including that response (the initiator's
    /// confirmation covers it).
    pub fn handle_answer_bound(
        self,
        answer: &[(String, String)],
        before: &TranscriptHash,
        through: &TranscriptHash,
    ) -> Result<(SealSession, TextPairs), NegotiationError> {
        let chosen = get(answer, KEY_SEAL).unwrap_or("");
        let Some(cipher) = Cipher::from_name(chosen).filter(|c| self.ciphers.contains(c)) else {
            return Err(NegotiationError::NotAgreed(chosen.to_owned()));
        };
        let chunk = parse_chunk(get(answer, KEY_CHUNK))?;
        if chunk > self.chunk {
            return Err(NegotiationError::Malformed {
                key: KEY_CHUNK,
                why: "answer exceeds the offered chunk size",
            });
        }
        if chunk > cipher.max_chunk() {
            return Err(NegotiationError::Malformed {
                key: KEY_CHUNK,
                why: "answer exceeds the cipher's largest chunk (3DES: 4 MiB, one key epoch)",
            });
        }
        // Compression: on only when offered and answered `lz4`; `none`, `Reject` or no answer
        // leave it off; a codec that was not offered is a broken answer.
        let compression = match get(answer, KEY_COMPRESSION) {
            None | Some("Reject") => Compression::None,
            Some(v) => match Compression::from_name(v) {
                Some(Compression::None) => Compression::None,
                Some(c) if self.compress => c,
                _ => {
                    return Err(NegotiationError::Malformed {
                        key: KEY_COMPRESSION,
                        why: "answer names a codec that was not offered",
                    })
                }
            },
        };
        let nonce_t = parse_nonce(get(answer, KEY_NONCE))?;
        let share_t = parse_share(get(answer, KEY_SHARE))?;
        let confirm_t = get(answer, KEY_CONFIRM)
            .ok_or(NegotiationError::MissingKey(KEY_CONFIRM))
            .and_then(|v| {
                schedule::from_hex_constant(v).ok_or(NegotiationError::Malformed {
                    key: KEY_CONFIRM,
                    why: "not a 0x hex-constant",
                })
            })?;
        let isk = self
            .cpace
            .initiator_isk(&self.nonce, &share_t)
            .map_err(|_| INVALID_SHARE)?;
        let d = schedule::derive(
            &isk,
            &Transcript {
                cipher,
                chunk_size: chunk,
                ids: &self.ids,
                offer: &self.offer,
                nonce_i: &self.nonce,
                nonce_t: &nonce_t,
            },
        )?;
        if !schedule::confirm_matches(&d.confirm.target(before), &confirm_t) {
            return Err(NegotiationError::ConfirmationFailed);
        }
        let keys = vec![(
            KEY_CONFIRM.to_owned(),
            schedule::to_hex_constant(&*d.confirm.initiator(through)),
        )];
        let framing = Framing {
            cipher,
            chunk_size: chunk,
        };
        Ok((
            SealSession::new(framing, Role::Initiator, d.i2t, d.t2i, d.record)
                .with_compression(compression),
            keys,
        ))
    }
}

/// What the target does after reading the initiator's first operational keys.
#[derive(Debug)]
pub enum AnswerOutcome {
    /// Plaintext session. Send these keys (a `Reject` answer if Seal was offered, nothing if
    /// it was not) and continue the login normally.
    Plain {
        /// Keys to send.
        keys: TextPairs,
        /// Why Seal was not agreed (for a debug/info log line), if it was offered.
        reason: Option<String>,
    },
    /// Seal agreed: send [`SealPending::keys`] with T=0, then feed the initiator's next keys
    /// to [`SealPending::handle_confirm`] before allowing the transition to full feature phase.
    Pending(Box<SealPending>),
}

/// Target-side configuration for answering offers.
#[derive(Debug, Clone)]
pub struct TargetSealConfig {
    /// `--seal off|allowed|required`.
    pub policy: SealPolicy,
    /// Ciphers this target accepts (default: all four; `none` is never accepted under
    /// `Required`).
    pub accept: Vec<Cipher>,
    /// Largest chunk this target accepts.
    pub max_chunk: u32,
    /// Whether this target agrees to compress (`--compress`, docs/seal.md §4b) when the
    /// initiator offers it.
    pub compress: bool,
}

impl Default for TargetSealConfig {
    fn default() -> Self {
        Self {
            policy: SealPolicy::Allowed,
            accept: Cipher::ALL.to_vec(),
            max_chunk: MAX_CHUNK,
            compress: false,
        }
    }
}

/// Target side of the negotiation.
#[derive(Debug)]
pub struct SealAnswer;

impl SealAnswer {
    /// Answers the initiator's operational keys. `psk_for` looks up the secret configured for
    /// this initiator (by InitiatorName) on this target.
    ///
    /// Errors are login failures: send a Login Response with
    /// [`NegotiationError::login_status`] and log the error (its text says why, no secrets).
    ///
    /// This form binds an empty login transcript (tests, benchmarks); a real login uses
    /// [`SealAnswer::handle_offer_bound`].
    pub fn handle_offer(
        config: &TargetSealConfig,
        offer: &[(String, String)],
        ids: &SessionIds,
        psk_for: impl FnOnce(&str) -> Option<Psk>,
    ) -> Result<AnswerOutcome, NegotiationError> {
        let empty = LoginTranscript::new().hash();
        Self::handle_offer_bound(config, offer, ids, psk_for, &empty)
    }

    /// As [`SealAnswer::handle_offer`]; the target's confirmation covers `transcript`, the hash
    /// of every Login PDU up to and including the request that carries the offer.
    pub fn handle_offer_bound(
        config: &TargetSealConfig,
        offer: &[(String, String)],
        ids: &SessionIds,
        psk_for: impl FnOnce(&str) -> Option<Psk>,
        transcript: &TranscriptHash,
    ) -> Result<AnswerOutcome, NegotiationError> {
        let required = config.policy == SealPolicy::Required;
        let compression_offered = get(offer, KEY_COMPRESSION);
        let reject = |reason: String| {
            let mut keys = vec![(KEY_SEAL.to_owned(), "Reject".to_owned())];
            if compression_offered.is_some() {
                keys.push((KEY_COMPRESSION.to_owned(), "Reject".to_owned()));
            }
            AnswerOutcome::Plain {
                keys,
                reason: Some(reason),
            }
        };
        let Some(offered) = get(offer, KEY_SEAL) else {
            if required {
                return Err(NegotiationError::RequiredNotOffered {
                    initiator: ids.initiator_name.clone(),
                });
            }
            return Ok(AnswerOutcome::Plain {
                keys: Vec::new(),
                reason: None,
            });
        };
        if config.policy == SealPolicy::Off {
            return Ok(reject("target policy is seal=off".to_owned()));
        }
        // RFC 7143 §6.2.1: the responder picks the first value of the list it supports.
        let choice = offered
            .split(',')
            .filter_map(Cipher::from_name)
            .find(|c| config.accept.contains(c) && (!required || c.protects()));
        let Some(cipher) = choice else {
            if required {
                return Err(NegotiationError::NoCommonCipher {
                    initiator: ids.initiator_name.clone(),
                    offered: offered.to_owned(),
                });
            }
            return Ok(reject(format!("no acceptable cipher in offer {offered:?}")));
        };
        let Some(psk) = psk_for(&ids.initiator_name) else {
            if required {
                return Err(NegotiationError::NoSecret {
                    initiator: ids.initiator_name.clone(),
                });
            }
            return Ok(reject(format!(
                "no pre-shared secret configured for initiator {:?}",
                ids.initiator_name
            )));
        };
        let chunk = parse_chunk(get(offer, KEY_CHUNK))?
            .min(config.max_chunk)
            .min(cipher.max_chunk());
        let nonce_i = parse_nonce(get(offer, KEY_NONCE))?;
        let share_i = parse_share(get(offer, KEY_SHARE))?;
        let nonce_t = fresh_nonce()?;
        let party = cpace_party(&psk, ids, &nonce_i)?;
        drop(psk);
        let isk = party
            .responder_isk(&nonce_i, &share_i)
            .map_err(|_| INVALID_SHARE)?;
        let d = schedule::derive(
            &isk,
            &Transcript {
                cipher,
                chunk_size: chunk,
                ids,
                offer: offered,
                nonce_i: &nonce_i,
                nonce_t: &nonce_t,
            },
        )?;
        // RFC 7143 §6.2.1: the first codec of the initiator's list this target supports
        // (`none` always; `lz4` when configured to compress), `Reject` when there is none.
        let compression = compression_offered.map(|list| {
            list.split(',')
                .filter_map(Compression::from_name)
                .find(|c| !c.is_on() || config.compress)
        });
        let mut keys = vec![
            (KEY_SEAL.to_owned(), cipher.name().to_owned()),
            (KEY_CHUNK.to_owned(), chunk.to_string()),
            (KEY_NONCE.to_owned(), schedule::to_hex_constant(&nonce_t)),
            (
                KEY_SHARE.to_owned(),
                schedule::to_hex_constant(party.share()),
            ),
            (
                KEY_CONFIRM.to_owned(),
                schedule::to_hex_constant(&*d.confirm.target(transcript)),
            ),
        ];
        if let Some(c) = compression {
            let answer = c.map_or("Reject", Compression::name);
            keys.push((KEY_COMPRESSION.to_owned(), answer.to_owned()));
        }
        let framing = Framing {
            cipher,
            chunk_size: chunk,
        };
        Ok(AnswerOutcome::Pending(Box::new(SealPending {
            keys,
            confirm: d.confirm,
            session: SealSession::new(framing, Role::Target, d.i2t, d.t2i, d.record)
                .with_compression(compression.flatten().unwrap_or_default()),
        })))
    }
}

/// Seal agreed, waiting for the initiator's key confirmation.
pub struct SealPending {
    keys: TextPairs,
    confirm: schedule::ConfirmKey,
    session: SealSession,
}

impl std::fmt::Debug for SealPending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealPending")
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

impl SealPending {
    /// Keys to send in the Login Response (with T=0, so the initiator answers once more).
    pub fn keys(&self) -> &[(String, String)] {
        &self.keys
    }

    /// The negotiated framing (cipher, chunk size).
    pub fn framing(&self) -> Framing {
        self.session.framing()
    }

    /// Verifies the initiator's confirmation (constant time). On error, fail the login with
    /// Authorization failure and log the error.
    ///
    /// This form binds an empty login transcript; a real login uses
    /// [`SealPending::handle_confirm_bound`].
    pub fn handle_confirm(
        self,
        keys: &[(String, String)],
    ) -> Result<SealSession, NegotiationError> {
        let empty = LoginTranscript::new().hash();
        self.handle_confirm_bound(keys, &empty)
    }

    /// As [`SealPending::handle_confirm`]; the initiator's confirmation must cover
    /// `transcript`, the hash of every Login PDU before the request that carries it.
    pub fn handle_confirm_bound(
        self,
        keys: &[(String, String)],
        transcript: &TranscriptHash,
    ) -> Result<SealSession, NegotiationError> {
        let v = get(keys, KEY_CONFIRM).ok_or(NegotiationError::MissingKey(KEY_CONFIRM))?;
        let got = schedule::from_hex_constant(v).ok_or(NegotiationError::Malformed {
            key: KEY_CONFIRM,
            why: "not a 0x hex-constant",
        })?;
        if !schedule::confirm_matches(&self.confirm.initiator(transcript), &got) {
            return Err(NegotiationError::ConfirmationFailed);
        }
        Ok(self.session)
    }
}

/// Whether `key` is one of Seal's login keys (for the login engine's extension dispatch).
pub fn is_seal_key(key: &str) -> bool {
    matches!(
        key,
        KEY_SEAL | KEY_CHUNK | KEY_NONCE | KEY_SHARE | KEY_CONFIRM | KEY_COMPRESSION
    )
}

/// Looks up the pre-shared secret for an InitiatorName on this target.
pub type PskLookup = Box<dyn Fn(&str) -> Option<Psk> + Send + Sync>;

enum TargetState {
    /// Nothing offered yet.
    Idle,
    /// Offer answered, waiting for the initiator's confirmation.
    Pending(Box<SealPending>),
    /// Plaintext session agreed (offer rejected or never made).
    Plain,
    /// Confirmed.
    Sealed(Box<SealSession>),
    /// Session handed out with [`TargetNegotiation::take_session`].
    Taken,
}

/// The target's whole Seal negotiation across the Login Requests of one login, shaped for the
/// login engine's extension hook (`respond` per request that carries Seal keys, `finish` before
/// the final response):
///
/// 1. the initiator's first operational request carries the offer **with T=0**; `respond`
///    answers it (cipher, chunk, nonce, target confirmation);
/// 2. the initiator's next request carries `X-org.ipsan.SealConfirm` (and T=1); `respond`
///    verifies it;
/// 3. `finish` refuses the transition to full feature phase if policy requires Seal and it was
///    not offered, or if an agreed Seal was never confirmed (an initiator that asked to transit
///    together with its offer, or one without the secret).
///
/// Every error maps to a Login Response with [`NegotiationError::login_status`] and its text is
/// the log line that says why.
pub struct TargetNegotiation {
    config: TargetSealConfig,
    psk_for: PskLookup,
    state: TargetState,
}

impl std::fmt::Debug for TargetNegotiation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            TargetState::Idle => "idle",
            TargetState::Pending(_) => "awaiting confirmation",
            TargetState::Plain => "plain",
            TargetState::Sealed(_) => "sealed",
            TargetState::Taken => "taken",
        };
        f.debug_struct("TargetNegotiation")
            .field("policy", &self.config.policy)
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

impl TargetNegotiation {
    /// A fresh negotiation for one login.
    pub fn new(config: TargetSealConfig, psk_for: PskLookup) -> Self {
        Self {
            config,
            psk_for,
            state: TargetState::Idle,
        }
    }

    /// Answers the Seal keys of one Login Request (only those for which [`is_seal_key`] holds).
    /// `transcript` holds every Login PDU of this login so far, the current request included
    /// (the runtime adds each PDU as it reads or writes it).
    pub fn respond(
        &mut self,
        keys: &[(String, String)],
        ids: &SessionIds,
        transcript: &LoginTranscript,
    ) -> Result<TextPairs, NegotiationError> {
        match std::mem::replace(&mut self.state, TargetState::Taken) {
            TargetState::Idle | TargetState::Plain if get(keys, KEY_SEAL).is_some() => {
                match SealAnswer::handle_offer_bound(
                    &self.config,
                    keys,
                    ids,
                    |n| (self.psk_for)(n),
                    &transcript.hash(),
                )? {
                    AnswerOutcome::Plain { keys, reason } => {
                        if let Some(r) = reason {
                            tracing::info!(initiator = %ids.initiator_name, "seal: plaintext session: {r}");
                        }
                        self.state = TargetState::Plain;
                        Ok(keys)
                    }
                    AnswerOutcome::Pending(p) => {
                        let out = p.keys().to_vec();
                        self.state = TargetState::Pending(p);
                        Ok(out)
                    }
                }
            }
            TargetState::Pending(p) if get(keys, KEY_CONFIRM).is_some() => {
                let s = p.handle_confirm_bound(keys, &transcript.hash_before_last())?;
                tracing::info!(
                    initiator = %ids.initiator_name,
                    cipher = %s.cipher(),
                    chunk = s.chunk_size(),
                    compression = %s.compression(),
                    "seal: session keys confirmed"
                );
                self.state = TargetState::Sealed(Box::new(s));
                Ok(Vec::new())
            }
            TargetState::Pending(_) => Err(NegotiationError::MissingKey(KEY_CONFIRM)),
            _ => Err(NegotiationError::Malformed {
                key: KEY_SEAL,
                why: "Seal keys out of order",
            }),
        }
    }

    /// Called before the final Login Response: refuses the login if Seal is required but was
    /// never offered, or was agreed but not confirmed.
    pub fn finish(&mut self, ids: &SessionIds) -> Result<(), NegotiationError> {
        match &self.state {
            TargetState::Idle if self.config.policy == SealPolicy::Required => {
                Err(NegotiationError::RequiredNotOffered {
                    initiator: ids.initiator_name.clone(),
                })
            }
            TargetState::Pending(_) => Err(NegotiationError::MissingKey(KEY_CONFIRM)),
            TargetState::Taken => Err(NegotiationError::Malformed {
                key: KEY_SEAL,
                why: "Seal negotiation failed earlier in this login",
            }),
            _ => Ok(()),
        }
    }

    /// Whether this target has answered an offer (sent its CPace share and confirmation) and
    /// the initiator has not yet proven the secret: a login that ends in this state, refused or
    /// abandoned, was a password guess and must count toward the lockout (docs/seal.md §2).
    pub fn awaiting_confirmation(&self) -> bool {
        matches!(self.state, TargetState::Pending(_))
    }

    /// The confirmed session after a successful login (`None`: plaintext session).
    pub fn take_session(&mut self) -> Option<SealSession> {
        match std::mem::replace(&mut self.state, TargetState::Taken) {
            TargetState::Sealed(s) => Some(*s),
            other => {
                self.state = other;
                None
            }
        }
    }
}

enum InitiatorState {
    /// Nothing sent yet.
    Idle,
    /// Offer sent, waiting for the target's answer.
    Offered(Box<SealOffer>),
    /// Answer verified, confirmation sent.
    Confirmed(Box<SealSession>),
    /// Failed, or session handed out.
    Done,
}

/// The initiator's whole Seal negotiation across one login, shaped for an originator-side
/// extension hook (`offer` for the first operational request, `on_answer` per response,
/// `finish` before full feature phase):
///
/// 1. `offer` returns the keys for the first operational Login Request, which **must be sent
///    with T=0** (the target needs a second request to receive the confirmation);
/// 2. `on_answer` verifies the target's answer and confirmation and returns
///    `X-org.ipsan.SealConfirm` for the next request (which may set T=1);
/// 3. `finish` refuses full feature phase if Seal was offered but not agreed (the caller asked
///    for Seal: a plaintext session would be a silent downgrade).
pub struct InitiatorNegotiation {
    ciphers: Vec<Cipher>,
    chunk: u32,
    psk: Option<Psk>,
    state: InitiatorState,
    compress: bool,
}

impl std::fmt::Debug for InitiatorNegotiation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            InitiatorState::Idle => "idle",
            InitiatorState::Offered(_) => "offered",
            InitiatorState::Confirmed(_) => "confirmed",
            InitiatorState::Done => "done",
        };
        f.debug_struct("InitiatorNegotiation")
            .field("ciphers", &self.ciphers)
            .field("chunk", &self.chunk)
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

impl InitiatorNegotiation {
    /// One per login attempt (nonces are fresh per offer).
    pub fn new(ciphers: Vec<Cipher>, chunk: u32, psk: Psk) -> Self {
        Self {
            ciphers,
            chunk,
            psk: Some(psk),
            state: InitiatorState::Idle,
            compress: false,
        }
    }

    /// Also offers compression (docs/seal.md §4b); it is on only if the target agrees.
    #[must_use]
    pub fn with_compression(mut self, on: bool) -> Self {
        self.compress = on;
        self
    }

    /// Keys for the first operational Login Request (send it with T=0).
    pub fn offer(&mut self, ids: &SessionIds) -> Result<TextPairs, NegotiationError> {
        let psk = self.psk.take().ok_or(NegotiationError::Malformed {
            key: KEY_SEAL,
            why: "Seal offered twice in one login",
        })?;
        let offer = SealOffer::new(self.ciphers.clone(), self.chunk, psk, ids.clone())?
            .with_compression(self.compress);
        let keys = offer.keys();
        self.state = InitiatorState::Offered(Box::new(offer));
        Ok(keys)
    }

    /// Handles the Seal keys of a Login Response; returns keys for the next request.
    /// `transcript` holds every Login PDU of this login so far, this response included.
    pub fn on_answer(
        &mut self,
        keys: &[(String, String)],
        transcript: &LoginTranscript,
    ) -> Result<TextPairs, NegotiationError> {
        match std::mem::replace(&mut self.state, InitiatorState::Done) {
            InitiatorState::Offered(offer) => {
                let (session, confirm) = offer.handle_answer_bound(
                    keys,
                    &transcript.hash_before_last(),
                    &transcript.hash(),
                )?;
                tracing::info!(
                    cipher = %session.cipher(),
                    chunk = session.chunk_size(),
                    compression = %session.compression(),
                    "seal: target confirmed; session keys agreed"
                );
                self.state = InitiatorState::Confirmed(Box::new(session));
                Ok(confirm)
            }
            _ => Err(NegotiationError::Malformed {
                key: KEY_SEAL,
                why: "Seal answer without an offer",
            }),
        }
    }

    /// Before full feature phase: Seal must have been agreed if it was offered.
    pub fn finish(&self) -> Result<(), NegotiationError> {
        match &self.state {
            InitiatorState::Confirmed(_) | InitiatorState::Idle => Ok(()),
            InitiatorState::Offered(_) => Err(NegotiationError::NotAgreed(String::new())),
            InitiatorState::Done => Err(NegotiationError::Malformed {
                key: KEY_SEAL,
                why: "Seal negotiation failed earlier in this login",
            }),
        }
    }

    /// The agreed session after the login (`None` if none was agreed).
    pub fn take_session(&mut self) -> Option<SealSession> {
        match std::mem::replace(&mut self.state, InitiatorState::Done) {
            InitiatorState::Confirmed(s) => Some(*s),
            other => {
                self.state = other;
                None
            }
        }
    }
}
