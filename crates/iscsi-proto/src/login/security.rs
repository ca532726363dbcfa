//! The target's login up to its proof of authentication: the first Login Request checked
//! (version, InitiatorName, SessionType, TargetName; the target looked up, RFC 7143 §6.3.1)
//! and the security stage: AuthMethod, CHAP (§12.1.3) and relayed CHAP ([`super::Auth::Relay`]).

use iscsi_wire::header::Stage;

use super::{
    Auth, Authenticated, Directory, LoginFailure, LoginStatus, Outcome, RelayAnswer, RelayRequest,
    Reply, SecurityState, State, TargetLogin,
};
use crate::chap::ChapAlgorithm;
use crate::params::{SessionType, Side, REJECT};
use crate::{chap, params};

impl TargetLogin {
    /// Continues a login that returned [`Outcome::Relay`] with the driver's answer; returns
    /// the reply to send for the Login Request that raised it.
    pub fn relay_answer(&mut self, answer: RelayAnswer, dir: &mut dyn Directory) -> Reply {
        let Some((req, mut out)) = self.deferred.take() else {
            // A driver bug, not the initiator's: nothing pending to answer.
            self.state = State::Done;
            let f = LoginFailure::new(LoginStatus::TARGET_ERROR, "no relayed CHAP step pending");
            let mut header = self.bare_header(self.isid, 0, Stage::SECURITY_NEGOTIATION);
            header.status_class = f.status.class();
            header.status_detail = f.status.detail();
            return Reply {
                header,
                data: Vec::new(),
                outcome: Outcome::Failed(f),
            };
        };
        let step = match (answer, std::mem::replace(&mut self.state, State::Done)) {
            (
                RelayAnswer::Challenge {
                    algorithm,
                    id,
                    challenge,
                },
                State::Security(SecurityState::RelayAwaitChallenge { offered }),
            ) => {
                if !offered.contains(&algorithm) || !algorithm.is_supported() {
                    Err(LoginFailure::new(
                        LoginStatus::AUTHENTICATION_FAILURE,
                        "relayed CHAP: the remote target chose an algorithm the initiator did not offer",
                    ))
                } else {
                    out.push(("CHAP_A".into(), algorithm.0.to_string()));
                    out.push(("CHAP_I".into(), id.to_string()));
                    out.push(("CHAP_C".into(), chap::encode_binary(&challenge)));
                    self.state = State::Security(SecurityState::RelayExpectResponse);
                    self.conclude(&req, out, dir)
                }
            }
            (
                RelayAnswer::Verified { mutual },
                State::Security(SecurityState::RelayAwaitVerdict { mutual: asked }),
            ) => match (asked, mutual) {
                (true, Some((name, r))) => {
                    out.push(("CHAP_N".into(), name));
                    out.push(("CHAP_R".into(), chap::encode_binary(&r)));
                    self.state = State::Security(SecurityState::Verified(Authenticated(())));
                    self.conclude(&req, out, dir)
                }
                (false, None) => {
                    self.state = State::Security(SecurityState::Verified(Authenticated(())));
                    self.conclude(&req, out, dir)
                }
                _ => Err(LoginFailure::new(
                    LoginStatus::AUTHENTICATION_FAILURE,
                    "relayed CHAP: mutual CHAP answer missing or unasked",
                )),
            },
            (RelayAnswer::Refused(f), _) => Err(f),
            _ => Err(LoginFailure::new(
                LoginStatus::TARGET_ERROR,
                "relayed CHAP: answer out of sequence",
            )),
        };
        match step {
            Ok(r) => r,
            Err(f) => self.fail(&req, f),
        }
    }

    /// InitiatorName, TargetName and SessionType are fixed by the first request, which the
    /// directory checked; a later PDU may repeat them but not change them (RFC 7143 §6.2: a
    /// redeclaration gets a login reject, initiator error). Issue 8: changing TargetName after
    /// the check bound the session to a target whose policy was never applied.
    pub(super) fn check_identity(&self, key: &str, value: &str) -> Result<(), LoginFailure> {
        let same = match key {
            "InitiatorName" => self.params.initiator_name == value,
            "TargetName" => self.params.target_name.as_deref() == Some(value),
            "SessionType" => match self.params.session_type {
                SessionType::Normal => value == "Normal",
                SessionType::Discovery => value == "Discovery",
            },
            _ => true,
        };
        if same {
            Ok(())
        } else {
            Err(LoginFailure::new(
                LoginStatus::INITIATOR_ERROR,
                format!("{key} redeclared during login"),
            ))
        }
    }

    pub(super) fn requires_no_auth(&self) -> bool {
        matches!(self.policy.as_ref().map(|p| &p.auth), Some(Auth::None))
    }

    /// First PDU: InitiatorName, SessionType and TargetName decide the policy (RFC 7143 §6.3).
    pub(super) fn first_request(
        &mut self,
        keys: &[(String, String)],
        dir: &mut dyn Directory,
        out: &mut Vec<(String, String)>,
    ) -> Result<(), LoginFailure> {
        let get = |k: &str| {
            keys.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        let initiator = get("InitiatorName").ok_or_else(|| {
            LoginFailure::new(LoginStatus::MISSING_PARAMETER, "InitiatorName missing")
        })?;
        if initiator.is_empty() {
            return Err(LoginFailure::new(
                LoginStatus::MISSING_PARAMETER,
                "InitiatorName empty",
            ));
        }
        self.params.initiator_name = initiator.to_owned();
        let session_type = match get("SessionType") {
            None | Some("Normal") => SessionType::Normal,
            Some("Discovery") => SessionType::Discovery,
            Some(other) => {
                return Err(LoginFailure::new(
                    LoginStatus::SESSION_TYPE_NOT_SUPPORTED,
                    format!("SessionType={other}"),
                ))
            }
        };
        self.params.session_type = session_type;
        let policy = match session_type {
            SessionType::Discovery => dir.discovery(initiator)?,
            SessionType::Normal => {
                let target = get("TargetName").ok_or_else(|| {
                    LoginFailure::new(LoginStatus::MISSING_PARAMETER, "TargetName missing")
                })?;
                self.params.target_name = Some(target.to_owned());
                dir.target(target, initiator)?
            }
        };
        if session_type == SessionType::Normal && !self.sent_tpgt {
            // RFC 7143 §13.9: returned in the first Login Response of a Normal session.
            self.sent_tpgt = true;
            out.push((
                "TargetPortalGroupTag".into(),
                policy.portal_group_tag.to_string(),
            ));
            if let Some(alias) = &policy.alias {
                out.push(("TargetAlias".into(), alias.clone()));
            }
        }
        self.policy = Some(policy);
        self.state = State::Security(SecurityState::Negotiating);
        Ok(())
    }

    pub(super) fn security_keys(
        &mut self,
        keys: &[(String, String)],
        out: &mut Vec<(String, String)>,
    ) -> Result<(), LoginFailure> {
        let auth_fail = |why: &str| LoginFailure::new(LoginStatus::AUTHENTICATION_FAILURE, why);
        let auth = self
            .policy
            .as_ref()
            .map(|p| p.auth.clone())
            .unwrap_or_default();
        let mut chap_n = None;
        let mut chap_r = None;
        let mut chap_i = None;
        let mut chap_c = None;
        let mut operational = Vec::new();
        for (k, v) in keys {
            match k.as_str() {
                "InitiatorName" | "TargetName" | "SessionType" => self.check_identity(k, v)?,
                "InitiatorAlias" => self.params.apply(k, v, Side::Initiator),
                "AuthMethod" => {
                    let mine = match auth {
                        Auth::None => "None",
                        Auth::Chap(_) | Auth::Relay => "CHAP",
                    };
                    let spec = params::spec("AuthMethod").ok_or_else(|| auth_fail("table"))?;
                    let answer = params::resolve(spec, v, mine).map_err(|e| {
                        LoginFailure::new(LoginStatus::INITIATOR_ERROR, e.to_string())
                    })?;
                    if answer == REJECT {
                        return Err(auth_fail("no acceptable AuthMethod offered"));
                    }
                    self.state = State::Security(if answer == "CHAP" {
                        SecurityState::ChapExpectAlgorithm
                    } else {
                        SecurityState::NoAuth(Authenticated(()))
                    });
                    out.push((k.clone(), answer));
                }
                "CHAP_A" if matches!(auth, Auth::Relay) => {
                    if !matches!(
                        self.state,
                        State::Security(SecurityState::ChapExpectAlgorithm)
                    ) {
                        return Err(auth_fail("CHAP_A out of sequence"));
                    }
                    let offered: Vec<ChapAlgorithm> = ChapAlgorithm::parse_list(v)
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|a| a.is_supported())
                        .collect();
                    if offered.is_empty() {
                        return Err(auth_fail("no acceptable CHAP algorithm"));
                    }
                    self.relay = Some(RelayRequest::Challenge {
                        algorithms: offered.clone(),
                    });
                    self.state = State::Security(SecurityState::RelayAwaitChallenge { offered });
                }
                "CHAP_A" => {
                    let Auth::Chap(policy) = &auth else {
                        return Err(auth_fail("CHAP_A without AuthMethod=CHAP"));
                    };
                    if !matches!(
                        self.state,
                        State::Security(SecurityState::ChapExpectAlgorithm)
                    ) {
                        return Err(auth_fail("CHAP_A out of sequence"));
                    }
                    let offered = ChapAlgorithm::parse_list(v).unwrap_or_default();
                    let alg = ChapAlgorithm::choose(&offered, &policy.algorithms)
                        .map_err(|_| auth_fail("no acceptable CHAP algorithm"))?;
                    let len = alg.digest_len().unwrap_or(16).max(16);
                    let ch = self
                        .challenges
                        .issue(alg, len)
                        .map_err(|e| auth_fail(&e.to_string()))?;
                    out.push(("CHAP_A".into(), alg.0.to_string()));
                    out.push(("CHAP_I".into(), ch.id.to_string()));
                    out.push(("CHAP_C".into(), chap::encode_binary(&ch.challenge)));
                    self.state = State::Security(SecurityState::ChapExpectResponse {
                        alg,
                        id: ch.id,
                        challenge: ch.challenge,
                    });
                }
                "CHAP_N" => chap_n = Some(v.as_str()),
                "CHAP_R" => chap_r = Some(v.as_str()),
                "CHAP_I" => chap_i = Some(v.as_str()),
                "CHAP_C" => chap_c = Some(v.as_str()),
                _ => operational.push((k.clone(), v.clone())),
            }
        }
        if matches!(auth, Auth::Relay) && (chap_n.is_some() || chap_r.is_some()) {
            if !matches!(
                self.state,
                State::Security(SecurityState::RelayExpectResponse)
            ) {
                return Err(auth_fail("CHAP response out of sequence"));
            }
            let (name, resp) = chap_n
                .zip(chap_r)
                .ok_or_else(|| auth_fail("CHAP_N or CHAP_R missing"))?;
            let response = chap::decode_binary(resp).map_err(|_| auth_fail("malformed CHAP_R"))?;
            let mutual = match (chap_i, chap_c) {
                (Some(i), Some(c)) => Some((
                    chap::parse_identifier(i).map_err(|_| auth_fail("malformed CHAP_I"))?,
                    chap::decode_binary(c).map_err(|_| auth_fail("malformed CHAP_C"))?,
                )),
                (None, None) => None,
                _ => return Err(auth_fail("CHAP_I and CHAP_C must come together")),
            };
            self.state = State::Security(SecurityState::RelayAwaitVerdict {
                mutual: mutual.is_some(),
            });
            self.relay = Some(RelayRequest::Response {
                name: name.to_owned(),
                response,
                mutual,
            });
        } else if chap_n.is_some() || chap_r.is_some() {
            let Auth::Chap(policy) = &auth else {
                return Err(auth_fail("CHAP response without AuthMethod=CHAP"));
            };
            let State::Security(SecurityState::ChapExpectResponse { alg, id, challenge }) =
                &self.state
            else {
                return Err(auth_fail("CHAP response out of sequence"));
            };
            let (name, resp) = chap_n
                .zip(chap_r)
                .ok_or_else(|| auth_fail("CHAP_N or CHAP_R missing"))?;
            let resp = chap::decode_binary(resp).map_err(|_| auth_fail("malformed CHAP_R"))?;
            // Compare the name and the response; both must match (names are not secret).
            let name_ok = name == policy.user;
            let resp_ok = chap::verify(*alg, *id, &policy.secret, challenge, &resp);
            if !(name_ok && resp_ok) {
                return Err(auth_fail("CHAP response did not verify"));
            }
            // Mutual CHAP: the initiator's challenge to us (RFC 7143 §12.1.3).
            match (chap_i, chap_c, &policy.mutual) {
                (Some(i), Some(c), Some((user, secret))) => {
                    let id =
                        chap::parse_identifier(i).map_err(|_| auth_fail("malformed CHAP_I"))?;
                    let c = chap::decode_binary(c).map_err(|_| auth_fail("malformed CHAP_C"))?;
                    self.challenges
                        .accept_incoming(&c)
                        .map_err(|e| auth_fail(&format!("initiator challenge refused: {e}")))?;
                    let r = chap::response(*alg, id, secret, &c)
                        .map_err(|e| auth_fail(&e.to_string()))?;
                    out.push(("CHAP_N".into(), user.clone()));
                    out.push(("CHAP_R".into(), chap::encode_binary(&r)));
                }
                (Some(_), Some(_), None) => {
                    return Err(auth_fail("mutual CHAP requested but not configured"));
                }
                (None, None, _) => {}
                _ => return Err(auth_fail("CHAP_I and CHAP_C must come together")),
            }
            self.state = State::Security(SecurityState::Verified(Authenticated(())));
        }
        if !operational.is_empty() {
            self.operational_keys(&operational, out)?;
        }
        Ok(())
    }
}
