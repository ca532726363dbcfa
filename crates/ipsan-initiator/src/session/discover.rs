//! SendTargets discovery (RFC 7143 Appendix D): a discovery session's login, iscsi-proto's
//! `Discovery` machine over the socket, and its results.

use super::*;

/// A target found by SendTargets discovery (RFC 7143 Appendix D).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DiscoveredTarget {
    pub name: String,
    /// `TargetAddress` values: `host:port,portal-group-tag`.
    pub addresses: Vec<String>,
}

impl From<discovery::DiscoveredTarget> for DiscoveredTarget {
    fn from(t: discovery::DiscoveredTarget) -> Self {
        Self {
            name: t.name,
            addresses: t.addresses,
        }
    }
}

/// Discovery results as pretty JSON (`[{"name": ..., "addresses": [...]}]`).
pub fn targets_json(t: &[DiscoveredTarget]) -> std::result::Result<String, serde_json::Error> {
    serde_json::to_string_pretty(t)
}

/// Log into a discovery session, ask `SendTargets=All`, log out: iscsi-proto's
/// [`Discovery`] builds the requests and reads the answers; here PDUs go out and come in.
pub async fn discover(url: &IscsiUrl, cfg: &SessionConfig) -> Result<Vec<DiscoveredTarget>> {
    let fut = async {
        let (mut conn, li) = connect_and_login(url, cfg, SessionKind::Discovery).await?;
        conn.set_codec(&codec_for(&li.params));
        let mut d = Discovery::new(li.done.exp_cmd_sn, li.done.exp_stat_sn);
        let targets = loop {
            while let Some(pdu) = d.poll_transmit() {
                conn.send_pdu(pdu).await?;
            }
            if let DiscoveryEvent::Targets(t) = d.handle_pdu(&conn.recv().await?)? {
                break t;
            }
        };
        while let Some(pdu) = d.poll_transmit() {
            conn.send_pdu(pdu).await?;
        }
        // Best effort: the answer to a discovery logout changes nothing for the caller.
        let _ = tokio::time::timeout(discovery::LOGOUT_GRACE, async {
            while !d.is_done() {
                d.handle_pdu(&conn.recv().await?)?;
            }
            Ok::<_, Error>(())
        })
        .await;
        Ok(targets.into_iter().map(DiscoveredTarget::from).collect())
    };
    tokio::time::timeout(cfg.login_timeout, fut)
        .await
        .map_err(|_| Error::Timeout("discovery"))?
}
