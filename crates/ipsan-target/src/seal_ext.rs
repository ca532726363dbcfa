//! Seal's login keys as an [`Extension`] of the login state machine (docs/seal.md §2).
//!
//! The target named in the login decides the policy and the pre-shared secret, so the
//! negotiation is created on first use; discovery sessions never seal.
//!
//! Every Seal offer is one online guess of the pre-shared secret (CPace, docs/seal.md §2-§3):
//! a running lockout refuses it before the target answers, and a login that received the
//! target's answer but never proved the secret (refused, or abandoned by a prober that takes
//! the answer and disconnects) counts as an authentication failure ([`GuessSlot`], conn/login.rs).

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use ipsan_seal::negotiate::KEY_SEAL;
use ipsan_seal::{
    is_seal_key, LoginTranscript, SealPolicy, SealSession, SessionIds, TargetNegotiation,
    TargetSealConfig,
};
use iscsi_proto::login::{Extension, ExtensionContext, LoginFailure, LoginStatus};
use tracing::warn;

use crate::config::SealSecret;
use crate::registry::Registry;

/// The confirmed Seal session of a login, handed to the connection once it reaches full
/// feature phase.
pub type SealSlot = Arc<Mutex<Option<SealSession>>>;

/// Every Login PDU of this login, added by the connection as it reads and writes them
/// (docs/seal.md §3: the key confirmations and the record keys bind the whole login).
pub type TranscriptSlot = Arc<Mutex<LoginTranscript>>;

/// Which configured secret this login's Seal negotiation was keyed with (set when the
/// initiator's offer is answered; it proves something only once [`SealSlot`] holds the
/// confirmed session). Registry strength checks read it (registry.rs, `Authentication`).
pub type SecretUsedSlot = Arc<Mutex<Option<SealSecret>>>;

/// The initiator name while the target's Seal answer is out and the initiator has not proven
/// the secret: if the login ends so, it was a failed guess and counts toward the lockout.
pub type GuessSlot = Arc<Mutex<Option<String>>>;

pub struct SealExtension {
    registry: Arc<Registry>,
    neg: Option<TargetNegotiation>,
    slot: SealSlot,
    transcript: TranscriptSlot,
    used: SecretUsedSlot,
    /// The initiator's address (lockouts are per name and address, limits.rs).
    peer: Option<IpAddr>,
    guess: GuessSlot,
    /// Agree to compression when the initiator offers it (`--compress`, docs/seal.md §4b).
    compress: bool,
}

impl std::fmt::Debug for SealExtension {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealExtension")
            .field("negotiation", &self.neg)
            .finish_non_exhaustive()
    }
}

impl SealExtension {
    pub fn new(registry: Arc<Registry>, slot: SealSlot, transcript: TranscriptSlot) -> Self {
        Self {
            registry,
            neg: None,
            slot,
            transcript,
            used: SecretUsedSlot::default(),
            peer: None,
            guess: GuessSlot::default(),
            compress: false,
        }
    }

    /// Agrees to compress Seal data when an initiator offers it (docs/seal.md §4b).
    #[must_use]
    pub fn with_compression(mut self, on: bool) -> Self {
        self.compress = on;
        self
    }

    /// Records in `used` which secret the negotiation is keyed with.
    #[must_use]
    pub fn recording_secret(mut self, used: SecretUsedSlot) -> Self {
        self.used = used;
        self
    }

    /// Subjects Seal offers from `peer` to the authentication lockout and reports unproven
    /// answers in `guess`.
    #[must_use]
    pub fn with_guess_limit(mut self, peer: IpAddr, guess: GuessSlot) -> Self {
        self.peer = Some(peer);
        self.guess = guess;
        self
    }

    /// Whether the login's target would answer a Seal offer.
    fn seals(&self, ctx: &ExtensionContext<'_>) -> bool {
        ctx.target_name
            .and_then(|n| self.registry.target(n))
            .is_some_and(|t| t.seal.policy != SealPolicy::Off)
    }

    fn negotiation(&mut self, ctx: &ExtensionContext<'_>) -> &mut TargetNegotiation {
        let registry = self.registry.clone();
        let target = ctx.target_name.and_then(|n| registry.target(n));
        let used = self.used.clone();
        let compress = self.compress;
        self.neg.get_or_insert_with(|| {
            let (policy, settings) = match &target {
                Some(t) => (t.seal.policy, Some(t.seal.clone())),
                None => (SealPolicy::Off, None),
            };
            let config = TargetSealConfig {
                policy,
                compress,
                ..TargetSealConfig::default()
            };
            TargetNegotiation::new(
                config,
                Box::new(move |ini| {
                    let (psk, which) = settings.as_ref()?.secret_for(ini)?;
                    *crate::lock(&used) = Some(which);
                    Some(psk)
                }),
            )
        })
    }
}

fn ids(ctx: &ExtensionContext<'_>) -> SessionIds {
    SessionIds {
        initiator_name: ctx.initiator_name.to_owned(),
        target_name: ctx.target_name.unwrap_or_default().to_owned(),
        isid: ctx.isid,
    }
}

fn failure(e: &ipsan_seal::NegotiationError) -> LoginFailure {
    let (class, detail) = e.login_status();
    warn!("{e}");
    LoginFailure::new(
        LoginStatus(u16::from(class) << 8 | u16::from(detail)),
        e.to_string(),
    )
}

impl Extension for SealExtension {
    fn handles(&self, key: &str) -> bool {
        is_seal_key(key)
    }

    fn respond(
        &mut self,
        keys: &[(String, String)],
        ctx: &ExtensionContext<'_>,
    ) -> Result<Vec<(String, String)>, LoginFailure> {
        let ids = ids(ctx);
        if let Some(peer) = self.peer {
            if keys.iter().any(|(k, _)| k == KEY_SEAL) && self.seals(ctx) {
                // An offer is a guess: a running lockout refuses it before any answer.
                self.registry.check_lockout(ctx.initiator_name, peer)?;
            }
        }
        let transcript = crate::lock(&self.transcript).clone();
        let guess = self.guess.clone();
        let neg = self.negotiation(ctx);
        let out = neg
            .respond(keys, &ids, &transcript)
            .map_err(|e| failure(&e))?;
        // Answered (share and confirmation sent): a guess until the initiator confirms.
        *crate::lock(&guess) = neg
            .awaiting_confirmation()
            .then(|| ids.initiator_name.clone());
        Ok(out)
    }

    fn finish(
        &mut self,
        ctx: &ExtensionContext<'_>,
    ) -> Result<Vec<(String, String)>, LoginFailure> {
        let ids = ids(ctx);
        let neg = self.negotiation(ctx);
        neg.finish(&ids).map_err(|e| failure(&e))?;
        if let Some(mut s) = neg.take_session() {
            if let Some(limit) = self.registry.limits.seal_counter_limit {
                s = s.with_counter_range_for_test(0, limit);
            }
            *crate::lock(&self.slot) = Some(s);
        }
        Ok(Vec::new())
    }
}
