//! The target's operational stage (RFC 7143 §6.3.2, §13): the operational keys answered
//! into [`SessionParams`], and the login finished into a [`super::LoginResult`].

use iscsi_wire::header::{LoginRequest, Stage};

use super::{
    Authenticated, Directory, ExtensionContext, LoginFailure, LoginResult, LoginStatus, Outcome,
    Reply, SecurityState, State, TargetLogin,
};
use crate::params;
use crate::params::{SessionType, Side, IRRELEVANT, NOT_UNDERSTOOD, REJECT};

impl TargetLogin {
    pub(super) fn operational_keys(
        &mut self,
        keys: &[(String, String)],
        out: &mut Vec<(String, String)>,
    ) -> Result<(), LoginFailure> {
        let mut ext_keys = Vec::new();
        for (k, v) in keys {
            if let Some(ext) = &self.extension {
                if ext.handles(k) {
                    ext_keys.push((k.clone(), v.clone()));
                    continue;
                }
            }
            if matches!(k.as_str(), "InitiatorName" | "TargetName" | "SessionType") {
                self.check_identity(k, v)?;
                continue;
            }
            if k.starts_with("CHAP_") || k == "AuthMethod" {
                return Err(LoginFailure::new(
                    LoginStatus::INITIATOR_ERROR,
                    format!("{k} outside the security stage"),
                ));
            }
            let Some(spec) = params::spec(k) else {
                out.push((k.clone(), NOT_UNDERSTOOD.into()));
                continue;
            };
            self.negotiated.insert(k.clone());
            match spec.kind {
                params::Kind::Declarative => {
                    self.params.apply(k, v, Side::Initiator);
                    continue;
                }
                _ if spec.normal_only && self.params.session_type == SessionType::Discovery => {
                    out.push((k.clone(), IRRELEVANT.into()));
                    continue;
                }
                _ => {}
            }
            let Some(ours) = self.offer.ours(k) else {
                out.push((k.clone(), NOT_UNDERSTOOD.into()));
                continue;
            };
            match params::resolve(spec, v, &ours) {
                Ok(answer) => {
                    if answer != REJECT {
                        self.params.apply(k, &answer, Side::Target);
                    }
                    out.push((k.clone(), answer));
                }
                Err(_) => out.push((k.clone(), REJECT.into())),
            }
        }
        if !ext_keys.is_empty() {
            let ctx = ExtensionContext {
                initiator_name: &self.params.initiator_name,
                target_name: self.params.target_name.as_deref(),
                isid: self.isid,
                tsih: self.tsih,
            };
            if let Some(ext) = self.extension.as_mut() {
                out.extend(ext.respond(&ext_keys, &ctx)?);
            }
        }
        Ok(())
    }

    pub(super) fn finish(
        &mut self,
        req: &LoginRequest,
        mut out: Vec<(String, String)>,
        dir: &mut dyn Directory,
    ) -> Result<Reply, LoginFailure> {
        let no_auth = self.requires_no_auth();
        // The proof moves into the result: the login ends here either way.
        let proof = match std::mem::replace(&mut self.state, State::Done) {
            State::Operational(p)
            | State::Security(SecurityState::NoAuth(p) | SecurityState::Verified(p)) => p,
            State::Security(SecurityState::Negotiating) if no_auth => Authenticated(()),
            other => {
                self.state = other;
                return Err(LoginFailure::new(
                    LoginStatus::AUTHENTICATION_FAILURE,
                    "full feature phase requested before authentication",
                ));
            }
        };
        let tsih = dir.assign_tsih(self.isid, &self.params.initiator_name, self.tsih)?;
        self.tsih = tsih;
        let ctx = ExtensionContext {
            initiator_name: &self.params.initiator_name,
            target_name: self.params.target_name.as_deref(),
            isid: self.isid,
            tsih,
        };
        if let Some(ext) = self.extension.as_mut() {
            out.extend(ext.finish(&ctx)?);
        }
        // FirstBurstLength is irrelevant when neither unsolicited nor immediate data is allowed
        // (RFC 7143 §13.14); nothing to send, but the value in force is clamped.
        if !self.declared_mrdsl {
            self.declared_mrdsl = true;
            out.push((
                "MaxRecvDataSegmentLength".into(),
                self.offer.max_recv_data_segment_length.to_string(),
            ));
        }
        self.params.target_max_recv_data_segment_length = self.offer.max_recv_data_segment_length;
        self.params.finish();
        let mut header = self.response_header(req, true, req.csg, Stage::FULL_FEATURE_PHASE);
        header.max_cmd_sn = self.cmd_sn.wrapping_add(self.offer.cmd_window.max(1) - 1);
        let result = LoginResult {
            params: std::mem::take(&mut self.params),
            isid: self.isid,
            tsih,
            cid: self.cid,
            cmd_sn: self.cmd_sn,
            next_stat_sn: self.stat_sn,
            auth: proof,
        };
        Ok(Reply {
            header,
            data: encode(&out),
            outcome: Outcome::FullFeature(Box::new(result)),
        })
    }

    /// Keys the initiator has negotiated so far (for logging).
    #[must_use]
    pub fn negotiated_keys(&self) -> Vec<&str> {
        self.negotiated.iter().map(String::as_str).collect()
    }
}

pub(super) fn encode(pairs: &[(String, String)]) -> Vec<u8> {
    iscsi_wire::text::encode(pairs).to_vec()
}
