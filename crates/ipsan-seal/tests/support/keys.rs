//! Builds a negotiated initiator/target session pair through the real login exchange.
#![allow(dead_code)]

use ipsan_seal::{
    AnswerOutcome, Cipher, Psk, SealAnswer, SealOffer, SealPending, SealSession, SessionIds,
    TargetSealConfig,
};

pub fn ids() -> SessionIds {
    SessionIds {
        initiator_name: "iqn.2026-01.org.ipsan:test-initiator".into(),
        target_name: "iqn.2026-01.org.ipsan:test-target".into(),
        isid: [0x80, 0, 0, 0, 0x12, 0x34],
    }
}

pub fn psk(s: &str) -> Psk {
    Psk::new(s.as_bytes().to_vec()).unwrap()
}

pub const SECRET: &str = "a shared secret of 32 bytes.....";

/// Runs offer -> answer with the default target config: (the offer, the target's answer
/// waiting for confirmation).
pub fn offer_answer(cipher: Cipher, chunk: u32) -> (SealOffer, Box<SealPending>) {
    let offer = SealOffer::new(vec![cipher], chunk, psk(SECRET), ids()).unwrap();
    let AnswerOutcome::Pending(pending) =
        SealAnswer::handle_offer(&TargetSealConfig::default(), &offer.keys(), &ids(), |_| {
            Some(psk(SECRET))
        })
        .unwrap()
    else {
        panic!("target did not agree")
    };
    (offer, pending)
}

/// Runs offer -> answer -> confirm and returns (initiator, target).
pub fn pair(cipher: Cipher, chunk: u32) -> (SealSession, SealSession) {
    let (offer, pending) = offer_answer(cipher, chunk);
    let (init, confirm) = offer.handle_answer(pending.keys()).unwrap();
    let target = pending.handle_confirm(&confirm).unwrap();
    (init, target)
}
