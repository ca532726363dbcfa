//! The originator's operational stage (RFC 7143 §6.3.2, §13): our operational keys offered,
//! the target's answers and declarations folded into [`SessionParams`] by the key table's
//! rules, and the result checked.

use iscsi_wire::header::Stage;

use super::{
    Established, LoginMachine, LoginNext, LoginReply, LoginStep, OriginatorError,
    OriginatorExtension, Phase, Result, SessionKind,
};
use crate::params::Side;

impl<X: ?Sized + OriginatorExtension> LoginMachine<X> {
    pub(super) fn operational_step(&mut self) -> Result<LoginStep> {
        let o = &self.opts;
        let yn = |b: bool| if b { "Yes" } else { "No" }.to_owned();
        let dg = |b: bool| if b { "CRC32C" } else { "None" }.to_owned();
        let mut keys: Vec<(String, String)> = vec![
            ("HeaderDigest".into(), dg(o.digest.header())),
            ("DataDigest".into(), dg(o.digest.data())),
            (
                "MaxRecvDataSegmentLength".into(),
                o.max_recv_data_segment_length.to_string(),
            ),
        ];
        if matches!(self.kind, SessionKind::Normal { .. }) {
            keys.extend([
                (
                    "MaxConnections".into(),
                    o.max_connections.max(1).to_string(),
                ),
                ("InitialR2T".into(), yn(o.initial_r2t)),
                ("ImmediateData".into(), yn(o.immediate_data)),
                ("MaxBurstLength".into(), o.max_burst_length.to_string()),
                ("FirstBurstLength".into(), o.first_burst_length.to_string()),
                (
                    "MaxOutstandingR2T".into(),
                    o.max_outstanding_r2t.to_string(),
                ),
                ("DefaultTime2Wait".into(), "0".into()),
                (
                    "DefaultTime2Retain".into(),
                    if o.error_recovery_level > 0 {
                        "20"
                    } else {
                        "0"
                    }
                    .into(),
                ),
                ("DataPDUInOrder".into(), "Yes".into()),
                ("DataSequenceInOrder".into(), "Yes".into()),
                (
                    "ErrorRecoveryLevel".into(),
                    o.error_recovery_level.min(2).to_string(),
                ),
            ]);
        }
        self.params.initiator_max_recv_data_segment_length = o.max_recv_data_segment_length;
        for (k, v) in &keys {
            if k != "MaxRecvDataSegmentLength" {
                self.offered.insert(k.clone(), v.clone());
            }
        }
        self.sent_operational = true;
        let mut transit = true;
        if let Some(mut ext) = self.ext.take() {
            let r = ext.offer(&self.ctx());
            transit = !ext.needs_second_request();
            self.ext = Some(ext);
            keys.extend(r.map_err(OriginatorError::Extension)?);
        }
        Ok(LoginStep {
            csg: Stage::LOGIN_OPERATIONAL_NEGOTIATION,
            nsg: Stage::FULL_FEATURE_PHASE,
            transit,
            keys,
        })
    }

    pub(super) fn handle_operational(&mut self, reply: LoginReply) -> Result<LoginNext> {
        let mut answers = Vec::new();
        let (ext_keys, keys): (Vec<_>, Vec<_>) = reply
            .keys
            .iter()
            .cloned()
            .partition(|(k, _)| self.ext.as_ref().is_some_and(|e| e.handles(k)));
        if let Some(mut ext) = self.ext.take() {
            let r = if ext_keys.is_empty() {
                Ok(Vec::new())
            } else {
                ext.on_answer(&ext_keys, &self.ctx())
            };
            let r = r.and_then(|more| {
                if reply.transit && reply.nsg == Stage::FULL_FEATURE_PHASE {
                    ext.finish(&self.ctx()).map(|()| more)
                } else {
                    Ok(more)
                }
            });
            self.ext = Some(ext);
            answers.extend(r.map_err(OriginatorError::Extension)?);
            self.params.extensions.extend(ext_keys.iter().cloned());
        }
        for (k, v) in &keys {
            if let Some(ours) = self.offered.remove(k) {
                self.apply_answer(k, &ours, v)?;
            } else if let Some(answer) = self.apply_declaration_or_offer(k, v)? {
                answers.push((k.clone(), answer));
            }
        }
        if reply.transit && reply.nsg == Stage::FULL_FEATURE_PHASE {
            // Keys the target never answered keep their RFC 7143 defaults, except the ones
            // whose defaults we override on purpose; an unanswered offer means "default" —
            // but a digest we insisted on must not fall back to None that way either (found
            // by the `initiator_login` fuzz target: a misspelt DataDigest answer).
            for key in ["HeaderDigest", "DataDigest"] {
                if let Some(ours) = self.offered.get(key).filter(|v| v.as_str() != "None") {
                    return Err(OriginatorError::Negotiation(format!(
                        "target never answered {key}={ours}"
                    )));
                }
            }
            self.offered.clear();
            self.validate()?;
            // The operational stage's proof moves into the result.
            let Phase::Operational(auth) = std::mem::replace(&mut self.phase, Phase::Done) else {
                return Err(OriginatorError::WrongStage {
                    got: reply.csg.0,
                    ours: Stage::FULL_FEATURE_PHASE.0,
                });
            };
            return Ok(LoginNext::Done(Box::new(Established {
                params: self.params.clone(),
                tsih: self.tsih,
                target_portal_group_tag: self.target_portal_group_tag,
                target_alias: self.target_alias.clone(),
                chap_algorithm: self.chap_algorithm,
                target_authenticated: self.target_authenticated,
                auth,
            })));
        }
        Ok(LoginNext::Send(LoginStep {
            csg: Stage::LOGIN_OPERATIONAL_NEGOTIATION,
            nsg: Stage::FULL_FEATURE_PHASE,
            transit: true,
            keys: answers,
        }))
    }

    /// The target's answer to a key we offered.
    pub(super) fn apply_answer(&mut self, key: &str, ours: &str, v: &str) -> Result<()> {
        if matches!(v, "NotUnderstood" | "Irrelevant") {
            return Ok(());
        }
        if v == "Reject" {
            // Digests we insisted on must not silently fall back to None.
            if key.ends_with("Digest") && ours != "None" {
                return Err(OriginatorError::Negotiation(format!(
                    "target refused {key}={ours}"
                )));
            }
            return Ok(());
        }
        // The result functions of RFC 7143 §6.2 (AND/OR/min/list membership) are checked by
        // the shared key table in iscsi-proto; an answer that breaks them fails the login.
        let v = match crate::params::spec(key) {
            Some(spec) => crate::params::check_answer(spec, ours, v).map_err(|e| {
                OriginatorError::Negotiation(format!("target answered {e} to our {key}={ours}"))
            })?,
            None => v.to_owned(),
        };
        let v = v.as_str();
        let bad = || {
            OriginatorError::Negotiation(format!("target answered {key}={v} to our {key}={ours}"))
        };
        let num = |s: &str| s.parse::<u32>().map_err(|_| bad());
        let boolean = |s: &str| match s {
            "Yes" => Ok(true),
            "No" => Ok(false),
            _ => Err(bad()),
        };
        let r = &mut self.params;
        match key {
            "HeaderDigest" | "DataDigest" => {
                let on = match v {
                    "CRC32C" => true,
                    "None" => false,
                    _ => return Err(bad()),
                };
                if on != (ours == "CRC32C") {
                    return Err(bad());
                }
                if key == "HeaderDigest" {
                    r.header_digest = on;
                } else {
                    r.data_digest = on;
                }
            }
            // OR: the answer may only turn a No into Yes.
            "InitialR2T" | "DataPDUInOrder" | "DataSequenceInOrder" => {
                let b = boolean(v)?;
                if ours == "Yes" && !b {
                    return Err(bad());
                }
                match key {
                    "InitialR2T" => r.initial_r2t = b,
                    "DataPDUInOrder" => r.data_pdu_in_order = b,
                    _ => r.data_sequence_in_order = b,
                }
            }
            // AND: the answer may only turn a Yes into No.
            "ImmediateData" => {
                let b = boolean(v)?;
                if ours == "No" && b {
                    return Err(bad());
                }
                r.immediate_data = b;
            }
            // min: the answer may not exceed our offer.
            "MaxBurstLength" | "FirstBurstLength" | "MaxOutstandingR2T" | "MaxConnections"
            | "ErrorRecoveryLevel" | "DefaultTime2Retain" => {
                let n = num(v)?;
                if n > num(ours)? {
                    return Err(bad());
                }
                match key {
                    "MaxBurstLength" => r.max_burst_length = n,
                    "FirstBurstLength" => r.first_burst_length = n,
                    "MaxOutstandingR2T" => r.max_outstanding_r2t = n,
                    "MaxConnections" => r.max_connections = n,
                    "ErrorRecoveryLevel" => r.error_recovery_level = n,
                    _ => {}
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// A key the target sent on its own: a declaration, or an offer we must answer.
    pub(super) fn apply_declaration_or_offer(
        &mut self,
        key: &str,
        v: &str,
    ) -> Result<Option<String>> {
        let r = &mut self.params;
        match key {
            "MaxRecvDataSegmentLength" => {
                let n: u32 = v.parse().map_err(|_| {
                    OriginatorError::Negotiation(format!("bad MaxRecvDataSegmentLength={v}"))
                })?;
                if !(512..=16_777_215).contains(&n) {
                    return Err(OriginatorError::Negotiation(format!(
                        "MaxRecvDataSegmentLength={n} outside 512..=2^24-1 (RFC 7143 §13.12)"
                    )));
                }
                r.apply(key, v, Side::Target);
                Ok(None)
            }
            "TargetPortalGroupTag" => {
                self.target_portal_group_tag = v.parse().ok();
                Ok(None)
            }
            "TargetAlias" => {
                self.target_alias = Some(v.to_owned());
                Ok(None)
            }
            "TargetAddress" | "DefaultTime2Wait" | "DefaultTime2Retain" => Ok(None),
            // A target-initiated offer for a key we would have sent anyway: accept its value
            // within our limits.
            "MaxBurstLength" | "FirstBurstLength" | "MaxOutstandingR2T" => {
                let n: u32 = v
                    .parse()
                    .map_err(|_| OriginatorError::Negotiation(format!("bad {key}={v}")))?;
                let ours = match key {
                    "MaxBurstLength" => self.opts.max_burst_length,
                    "FirstBurstLength" => self.opts.first_burst_length,
                    _ => self.opts.max_outstanding_r2t,
                };
                let m = n.min(ours);
                match key {
                    "MaxBurstLength" => r.max_burst_length = m,
                    "FirstBurstLength" => r.first_burst_length = m,
                    _ => r.max_outstanding_r2t = m,
                }
                Ok(Some(m.to_string()))
            }
            _ => Ok(Some("NotUnderstood".to_owned())),
        }
    }

    pub(super) fn validate(&mut self) -> Result<()> {
        let r = &mut self.params;
        if r.error_recovery_level > self.opts.error_recovery_level.min(2) {
            return Err(OriginatorError::Negotiation(format!(
                "target insists on ErrorRecoveryLevel {} (offered {})",
                r.error_recovery_level,
                self.opts.error_recovery_level.min(2)
            )));
        }
        if !r.data_pdu_in_order || !r.data_sequence_in_order {
            return Err(OriginatorError::Negotiation(
                "out-of-order data PDUs/sequences are not supported by this initiator".into(),
            ));
        }
        if r.max_burst_length < 512 || r.first_burst_length < 512 {
            return Err(OriginatorError::Negotiation(
                "burst length below 512 bytes".into(),
            ));
        }
        // RFC 7143 §13.14: FirstBurstLength must not exceed MaxBurstLength.
        r.first_burst_length = r.first_burst_length.min(r.max_burst_length);
        r.max_outstanding_r2t = r.max_outstanding_r2t.max(1);
        Ok(())
    }
}
