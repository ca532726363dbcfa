//! Adapter from [`TargetNegotiation`] to the target login engine's vendor-key hook
//! ([`iscsi_proto::login::Extension`]), so the target runtime integrates Seal's login part with
//! one constructor call:
//!
//! ```ignore
//! let (ext, slot) = SealExtension::new(seal_config, psk_lookup);
//! let login = TargetLogin::new(offer, Some(Box::new(ext)));
//! // ... drive the login; after Outcome::FullFeature:
//! let seal: Option<Arc<SealSession>> = slot.take();
//! ```
//!
//! Discovery sessions (no TargetName) carry no SCSI data: Seal keys are answered `Irrelevant`
//! (RFC 7143 §6.2) and the policy is not enforced there.

use std::sync::{Arc, Mutex};

use iscsi_proto::login::{Extension, ExtensionContext, LoginFailure, LoginStatus};

use crate::error::NegotiationError;
use crate::negotiate::{is_seal_key, PskLookup, TargetNegotiation, TargetSealConfig, TextPairs};
use crate::schedule::SessionIds;
use crate::session::SealSession;

/// Where the confirmed session appears once the login reaches full feature phase.
#[derive(Clone, Default, Debug)]
pub struct SessionSlot(Arc<Mutex<Option<Arc<SealSession>>>>);

impl SessionSlot {
    /// The confirmed Seal session, if this login negotiated one (`None`: plaintext session).
    pub fn take(&self) -> Option<Arc<SealSession>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// [`TargetNegotiation`] as a login [`Extension`].
#[derive(Debug)]
pub struct SealExtension {
    neg: TargetNegotiation,
    slot: SessionSlot,
}

impl SealExtension {
    /// One per login. Keep the returned slot to collect the session after the login.
    pub fn new(config: TargetSealConfig, psk_for: PskLookup) -> (SealExtension, SessionSlot) {
        let slot = SessionSlot::default();
        (
            SealExtension {
                neg: TargetNegotiation::new(config, psk_for),
                slot: slot.clone(),
            },
            slot,
        )
    }
}

fn ids(ctx: &ExtensionContext<'_>) -> SessionIds {
    SessionIds {
        initiator_name: ctx.initiator_name.to_owned(),
        target_name: ctx.target_name.unwrap_or_default().to_owned(),
        isid: ctx.isid,
    }
}

/// Maps a negotiation error to the Login Response status and logs why (no secrets in `e`).
fn failure(e: NegotiationError, ctx: &ExtensionContext<'_>) -> LoginFailure {
    let (class, detail) = e.login_status();
    tracing::warn!(initiator = %ctx.initiator_name, "login refused: {e}");
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
    ) -> Result<TextPairs, LoginFailure> {
        if ctx.target_name.is_none() {
            return Ok(keys
                .iter()
                .map(|(k, _)| (k.clone(), "Irrelevant".to_owned()))
                .collect());
        }
        self.neg
            .respond(keys, &ids(ctx))
            .map_err(|e| failure(e, ctx))
    }

    fn finish(&mut self, ctx: &ExtensionContext<'_>) -> Result<TextPairs, LoginFailure> {
        if ctx.target_name.is_none() {
            return Ok(Vec::new());
        }
        self.neg.finish(&ids(ctx)).map_err(|e| failure(e, ctx))?;
        if let Some(s) = self.neg.take_session() {
            *self.slot.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(s));
        }
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::negotiate::{SealPolicy, KEY_SEAL};
    use crate::{Binding, Cipher, Psk, SealOffer};
    use bytes::BytesMut;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn ctx(target: Option<&str>) -> ExtensionContext<'_> {
        ExtensionContext {
            initiator_name: "iqn.2026-01.org.ipsan:i",
            target_name: target,
            isid: [1, 2, 3, 4, 5, 6],
            tsih: 0,
        }
    }

    fn ext(policy: SealPolicy) -> (Box<dyn Extension>, SessionSlot) {
        let (e, slot) = SealExtension::new(
            TargetSealConfig {
                policy,
                ..TargetSealConfig::default()
            },
            Box::new(|_| Some(Psk::new(SECRET.to_vec()).unwrap())),
        );
        (Box::new(e), slot)
    }

    #[test]
    fn accepts_a_sealed_login_through_the_extension_hook() {
        let (mut e, slot) = ext(SealPolicy::Required);
        let c = ctx(Some("iqn.2026-01.org.ipsan:t"));
        let offer = SealOffer::new(
            vec![Cipher::Aes256Gcm],
            65536,
            Psk::new(SECRET.to_vec()).unwrap(),
            ids(&c),
        )
        .unwrap();
        assert!(offer.keys().iter().all(|(k, _)| e.handles(k)));
        let answer = e.respond(&offer.keys(), &c).unwrap();
        let (init, confirm) = offer.handle_answer(&answer).unwrap();
        e.respond(&confirm, &c).unwrap();
        e.finish(&c).unwrap();
        let target = slot.take().unwrap();
        let b = Binding::default();
        let sealed = init.seal(&b, BytesMut::from(&[5u8; 100][..])).unwrap();
        assert_eq!(
            &target.open(&b, BytesMut::from(&sealed[..])).unwrap()[..],
            &[5u8; 100][..]
        );
    }

    #[test]
    fn rejects_unsealed_login_with_authorization_failure_when_required() {
        let (mut e, slot) = ext(SealPolicy::Required);
        let f = e.finish(&ctx(Some("iqn.2026-01.org.ipsan:t"))).unwrap_err();
        assert_eq!(f.status, LoginStatus::AUTHORIZATION_FAILURE);
        assert!(f.reason.contains("seal=required"), "{}", f.reason);
        assert!(slot.take().is_none());
    }

    #[test]
    fn discovery_sessions_answer_irrelevant_and_are_not_refused() {
        let (mut e, _) = ext(SealPolicy::Required);
        let c = ctx(None);
        let out = e
            .respond(&[(KEY_SEAL.to_owned(), "aes-256-gcm".to_owned())], &c)
            .unwrap();
        assert_eq!(out, vec![(KEY_SEAL.to_owned(), "Irrelevant".to_owned())]);
        e.finish(&c).unwrap();
    }
}
