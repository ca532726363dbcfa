//! The originator's security stage (RFC 7143 §6.3.1, §12.1.3): AuthMethod, our answer to
//! the target's CHAP challenge and the target's answer to ours (mutual CHAP), and a relayed
//! login whose CHAP answer comes from elsewhere (a gateway's remote leg).

use std::collections::HashMap;

use iscsi_wire::header::Stage;

use super::{
    ChapState, LoginMachine, LoginNext, LoginOptions, LoginReply, LoginStep, OriginatorError,
    OriginatorExtension, Phase, Result, SessionKind, KEY_AUTH,
};
use crate::chap;
use crate::chap::ChapAlgorithm;
use crate::login::Authenticated;

impl<X: ?Sized + OriginatorExtension> LoginMachine<X> {
    /// Start a login whose CHAP is relayed (a gateway's remote leg, docs/gateway.md): we offer
    /// `opts.chap_algorithms` (the host's CHAP_A list) and hold no secret; the target's
    /// challenge comes out as [`LoginNext::RelayChallenge`], the host's answer goes in through
    /// [`Self::relay_response`], and the target's acceptance (with its mutual CHAP answer, if
    /// the host asked for one) is [`Self::take_relay_verdict`]. A target that does not
    /// require CHAP fails the login: relaying nothing would authenticate nobody.
    pub fn start_relayed(mut opts: LoginOptions, kind: SessionKind) -> (Self, LoginStep) {
        opts.chap = None;
        opts.mutual_chap = None;
        let (mut m, mut step) = Self::start(opts, kind);
        m.relay = true;
        step.transit = false;
        for (k, v) in &mut step.keys {
            if k == KEY_AUTH {
                *v = "CHAP".into();
            }
        }
        (m, step)
    }

    /// Relayed CHAP: the answer to the challenge [`LoginNext::RelayChallenge`] gave (CHAP_N,
    /// CHAP_R and, for mutual CHAP, the host's CHAP_I and CHAP_C); returns the request.
    pub fn relay_response(
        &mut self,
        name: &str,
        response: &[u8],
        mutual: Option<(u8, Vec<u8>)>,
    ) -> Result<LoginStep> {
        let ChapState::RelayAwaitResponse { alg } =
            std::mem::replace(&mut self.chap, ChapState::Done)
        else {
            return Err(OriginatorError::Auth(
                "relayed CHAP response out of sequence".into(),
            ));
        };
        let mut keys = vec![
            ("CHAP_N".to_owned(), name.to_owned()),
            ("CHAP_R".to_owned(), chap::encode_binary(response)),
        ];
        let (our_id, our_challenge) = match mutual {
            Some((id, c)) => {
                keys.push(("CHAP_I".to_owned(), id.to_string()));
                keys.push(("CHAP_C".to_owned(), chap::encode_binary(&c)));
                (Some(id), Some(c))
            }
            None => (None, None),
        };
        self.chap_algorithm = Some(alg.0);
        self.chap = ChapState::SentResponse {
            alg,
            our_id,
            our_challenge,
        };
        Ok(LoginStep {
            csg: Stage::SECURITY_NEGOTIATION,
            nsg: Stage::LOGIN_OPERATIONAL_NEGOTIATION,
            transit: true,
            keys,
        })
    }

    /// Relayed CHAP: `Some` once the target accepted the relayed response (taken once), with
    /// its CHAP_N and CHAP_R when the host asked for mutual CHAP.
    pub fn take_relay_verdict(&mut self) -> Option<Option<(String, Vec<u8>)>> {
        self.relay_verdict.take()
    }

    pub(super) fn handle_security(&mut self, reply: LoginReply) -> Result<LoginNext> {
        let keys: HashMap<&str, &str> = reply
            .keys
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        for (k, v) in &keys {
            if *v == "Reject" {
                return Err(OriginatorError::Negotiation(format!("target rejected {k}")));
            }
        }
        if let Some(v) = keys.get("TargetPortalGroupTag") {
            self.target_portal_group_tag = v.parse().ok();
        }
        if let Some(v) = keys.get("TargetAlias") {
            self.target_alias = Some((*v).to_owned());
        }
        match std::mem::replace(&mut self.chap, ChapState::Done) {
            ChapState::NotStarted => {
                match keys.get(KEY_AUTH).copied() {
                    Some("CHAP") => {
                        if self.opts.chap.is_none() && !self.relay {
                            return Err(OriginatorError::Auth(
                                "target requires CHAP but no credentials were given".into(),
                            ));
                        }
                        self.chap = ChapState::SentAlgorithms;
                        return Ok(LoginNext::Send(LoginStep {
                            csg: Stage::SECURITY_NEGOTIATION,
                            nsg: Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                            transit: false,
                            keys: vec![(
                                "CHAP_A".into(),
                                ChapAlgorithm::format_list(&self.opts.chap_algorithms),
                            )],
                        }));
                    }
                    Some("None") if self.relay => {
                        return Err(OriginatorError::Auth(
                            "relayed CHAP: the target chose no authentication".into(),
                        ));
                    }
                    Some("None") | None => {
                        if self.opts.mutual_chap.is_some() {
                            return Err(OriginatorError::Auth(
                                "mutual CHAP requested but the target chose no authentication"
                                    .into(),
                            ));
                        }
                        if !keys.contains_key(KEY_AUTH) && (self.opts.chap.is_some() || self.relay)
                        {
                            // Target ignored AuthMethod; keep waiting for it.
                            self.chap = ChapState::NotStarted;
                        } else {
                            // AuthMethod=None agreed (or never discussed without CHAP).
                            self.phase = Phase::Security(Some(Authenticated(())));
                        }
                    }
                    Some(other) => {
                        return Err(OriginatorError::Auth(format!(
                            "target chose an AuthMethod we did not offer: {other}"
                        )))
                    }
                }
            }
            ChapState::SentAlgorithms => return self.answer_challenge(&keys),
            ChapState::RelayAwaitResponse { .. } => {
                return Err(OriginatorError::Auth(
                    "a Login Response while the relayed CHAP response is pending".into(),
                ))
            }
            ChapState::SentResponse {
                our_id: Some(_), ..
            } if self.relay => {
                // Relayed mutual CHAP: the host, not us, checks the target's answer.
                let name = keys.get("CHAP_N").copied().ok_or_else(|| {
                    OriginatorError::Auth("mutual CHAP: target sent no CHAP_N".into())
                })?;
                let r = keys.get("CHAP_R").copied().ok_or_else(|| {
                    OriginatorError::Auth("mutual CHAP: target sent no CHAP_R".into())
                })?;
                self.relay_verdict = Some(Some((name.to_owned(), chap::decode_binary(r)?)));
                self.phase = Phase::Security(Some(Authenticated(())));
            }
            ChapState::SentResponse { .. } if self.relay => {
                self.relay_verdict = Some(None);
                self.phase = Phase::Security(Some(Authenticated(())));
            }
            ChapState::SentResponse {
                alg,
                our_id,
                our_challenge,
            } => {
                if let (Some(id), Some(ch), Some(m)) =
                    (our_id, our_challenge, self.opts.mutual_chap.as_ref())
                {
                    let name = keys.get("CHAP_N").copied().ok_or_else(|| {
                        OriginatorError::Auth("mutual CHAP: target sent no CHAP_N".into())
                    })?;
                    let r = keys.get("CHAP_R").copied().ok_or_else(|| {
                        OriginatorError::Auth("mutual CHAP: target sent no CHAP_R".into())
                    })?;
                    let r = chap::decode_binary(r)?;
                    if name != m.name || !chap::verify(alg, id, &m.secret, &ch, &r) {
                        return Err(OriginatorError::Auth(
                            "mutual CHAP: the target failed to authenticate".into(),
                        ));
                    }
                    self.target_authenticated = true;
                }
                // Our response was accepted (the target moved on) and any mutual answer holds.
                self.phase = Phase::Security(Some(Authenticated(())));
            }
            ChapState::Done => {}
        }
        if reply.transit {
            if reply.nsg == Stage::LOGIN_OPERATIONAL_NEGOTIATION {
                // The proof moves into the operational stage; without one there is none.
                let Phase::Security(Some(proof)) = std::mem::replace(&mut self.phase, Phase::Done)
                else {
                    return Err(OriginatorError::Auth(
                        "the target moved to operational negotiation before authentication".into(),
                    ));
                };
                self.phase = Phase::Operational(proof);
                return Ok(LoginNext::Send(self.operational_step()?));
            }
            if reply.nsg == Stage::FULL_FEATURE_PHASE {
                return Err(OriginatorError::SkippedOperational);
            }
        }
        // Still in the security stage: say we are ready to move on.
        Ok(LoginNext::Send(LoginStep {
            csg: Stage::SECURITY_NEGOTIATION,
            nsg: Stage::LOGIN_OPERATIONAL_NEGOTIATION,
            transit: matches!(self.chap, ChapState::Done),
            keys: Vec::new(),
        }))
    }

    pub(super) fn answer_challenge(&mut self, keys: &HashMap<&str, &str>) -> Result<LoginNext> {
        if self.relay {
            return self.relay_challenge(keys);
        }
        if self.opts.chap.is_none() {
            return Err(OriginatorError::Auth("no CHAP credentials".into()));
        }
        let (alg, id, challenge) = self.target_challenge(keys)?;
        let creds = self
            .opts
            .chap
            .as_ref()
            .ok_or_else(|| OriginatorError::Auth("no CHAP credentials".into()))?;
        let r = chap::response(alg, id, &creds.secret, &challenge)?;
        let mut out = vec![
            ("CHAP_N".to_owned(), creds.name.clone()),
            ("CHAP_R".to_owned(), chap::encode_binary(&r)),
        ];
        let (mut our_id, mut our_challenge) = (None, None);
        if let Some(m) = &self.opts.mutual_chap {
            if m.secret.ct_eq(&creds.secret) {
                return Err(OriginatorError::Auth(
                    "mutual CHAP: the two directions must use different secrets (RFC 7143 §12.1.3)"
                        .into(),
                ));
            }
            let len = alg.digest_len().unwrap_or(16).max(16);
            let c = self.record.issue(alg, len)?;
            out.push(("CHAP_I".to_owned(), c.id.to_string()));
            out.push(("CHAP_C".to_owned(), chap::encode_binary(&c.challenge)));
            our_id = Some(c.id);
            our_challenge = Some(c.challenge);
        }
        self.chap_algorithm = Some(alg.0);
        self.chap = ChapState::SentResponse {
            alg,
            our_id,
            our_challenge,
        };
        Ok(LoginNext::Send(LoginStep {
            csg: Stage::SECURITY_NEGOTIATION,
            nsg: Stage::LOGIN_OPERATIONAL_NEGOTIATION,
            transit: true,
            keys: out,
        }))
    }

    /// The target's CHAP challenge (RFC 7143 §12.1.3): the one algorithm it chose, which must
    /// be one we offered and can compute, its identifier, and a challenge that is not a
    /// reflection of one we issued. Shared by the answering and the relaying paths.
    pub(super) fn target_challenge(
        &mut self,
        keys: &HashMap<&str, &str>,
    ) -> Result<(ChapAlgorithm, u8, Vec<u8>)> {
        let a = keys
            .get("CHAP_A")
            .ok_or_else(|| OriginatorError::Auth("target sent no CHAP_A".into()))?;
        let algorithm = match ChapAlgorithm::parse_list(a)?.as_slice() {
            [one] if self.opts.chap_algorithms.contains(one) && one.is_supported() => *one,
            _ => {
                return Err(OriginatorError::Auth(format!(
                    "target chose CHAP_A={a}, which we did not offer"
                )))
            }
        };
        let id = chap::parse_identifier(
            keys.get("CHAP_I")
                .ok_or_else(|| OriginatorError::Auth("target sent no CHAP_I".into()))?,
        )?;
        let challenge = chap::decode_binary(
            keys.get("CHAP_C")
                .ok_or_else(|| OriginatorError::Auth("target sent no CHAP_C".into()))?,
        )?;
        self.record.accept_incoming(&challenge)?;
        Ok((algorithm, id, challenge))
    }

    /// Relayed CHAP: the target's challenge, checked as ours would be, goes to the driver.
    pub(super) fn relay_challenge(&mut self, keys: &HashMap<&str, &str>) -> Result<LoginNext> {
        let (algorithm, id, challenge) = self.target_challenge(keys)?;
        self.chap = ChapState::RelayAwaitResponse { alg: algorithm };
        Ok(LoginNext::RelayChallenge {
            algorithm,
            id,
            challenge,
        })
    }
}
