//! The whole target's exposition and its HTTP endpoint (`--metrics`): everything the
//! [`Registry`] counts, in [`metrics`](crate::metrics)' text format. Apart from `metrics` so
//! that the counters do not depend on the registry that holds them: the registry imports
//! `metrics`, and only this module imports both.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::metrics::{bounded_label, Exposition, SessionStats, MAX_SESSION_SERIES};
use crate::registry::Registry;

/// The exposition of everything `registry` counts.
#[must_use]
pub fn render(registry: &Registry) -> String {
    let mut e = Exposition::default();
    e.sample(
        "ipsan_build_info",
        "Always 1; the version label says which ipsan is running.",
        "gauge",
        &[("version", env!("CARGO_PKG_VERSION"))],
        1.0,
    );
    let targets = registry.targets();
    let sessions = registry.sessions();
    for t in targets.iter() {
        let n = sessions
            .iter()
            .filter(|s| s.info.target.as_deref() == Some(t.iqn.as_str()))
            .count();
        e.sample(
            "ipsan_target_sessions",
            "Sessions logged in to the target.",
            "gauge",
            &[("target", &t.iqn)],
            n as f64,
        );
        let conns: usize = sessions
            .iter()
            .filter(|s| s.info.target.as_deref() == Some(t.iqn.as_str()))
            .map(|s| s.connections)
            .sum();
        e.sample(
            "ipsan_target_connections",
            "Connections of the sessions logged in to the target (several per session when MaxConnections > 1).",
            "gauge",
            &[("target", &t.iqn)],
            conns as f64,
        );
        let stats = crate::read(&t.lun_stats);
        for (id, lu) in &t.luns {
            let lun = id.to_string();
            let labels = [("target", t.iqn.as_str()), ("lun", lun.as_str())];
            e.sample(
                "ipsan_lun_size_bytes",
                "Capacity of the LUN.",
                "gauge",
                &labels,
                (lu.num_blocks() * u64::from(lu.block_size())) as f64,
            );
            if let Some(s) = stats.get(id) {
                e.io("ipsan_lun", "LUN", &labels, s);
            }
        }
    }
    if let Some(nvme) = registry.nvme.get() {
        nvme.render_metrics(&mut e);
    }
    // The first MAX_SESSION_SERIES sessions (lowest TSIH) have series of their own; the rest
    // are summed per target (targets come from the configuration: bounded).
    let mut others: BTreeMap<&str, SessionStats> = BTreeMap::new();
    for (n, s) in sessions.iter().enumerate() {
        let i = &s.info;
        let target = i.target.as_deref().unwrap_or("");
        if n >= MAX_SESSION_SERIES {
            others.entry(target).or_default().add(&s.stats);
            continue;
        }
        let tsih = i.tsih.to_string();
        let initiator = bounded_label(&i.initiator);
        let labels = [
            ("target", target),
            ("initiator", initiator.as_ref()),
            ("tsih", tsih.as_str()),
        ];
        session_series(&mut e, &labels, &s.stats);
        if let Some(seal) = &i.seal {
            let (send, recv) = seal.key_epochs();
            for (dir, v) in [("send", send), ("receive", recv)] {
                let mut l = labels.to_vec();
                l.push(("direction", dir));
                e.sample(
                    "ipsan_session_seal_key_epoch",
                    "The Seal key epoch in use in each direction (docs/seal.md §4); never a key.",
                    "gauge",
                    &l,
                    v as f64,
                );
            }
        }
    }
    for (target, st) in &others {
        let labels = [
            ("target", *target),
            ("initiator", "other"),
            ("tsih", "other"),
        ];
        session_series(&mut e, &labels, st);
    }
    e.sample(
        "ipsan_session_series_aggregated",
        "Sessions counted under initiator=\"other\" rather than series of their own (beyond the first 64).",
        "gauge",
        &[],
        sessions.len().saturating_sub(MAX_SESSION_SERIES) as f64,
    );
    for (target, result, n) in registry.metrics.logins() {
        e.sample(
            "ipsan_logins_total",
            "Logins by target (\"\" for discovery and unknown names) and result.",
            "counter",
            &[("target", &target), ("result", result)],
            n as f64,
        );
    }
    let l = registry.stats.snapshot();
    for (name, help, v) in [
        (
            "ipsan_chap_failures_total",
            "CHAP authentication failures (login answered 0x0201).",
            l.auth_failures,
        ),
        (
            "ipsan_chap_lockout_rejects_total",
            "Logins refused because a CHAP failure lockout was running (0x0301).",
            l.lockout_rejects,
        ),
        (
            "ipsan_session_limit_rejects_total",
            "Logins refused by max_sessions_per_initiator (0x0302).",
            l.session_limit_rejects,
        ),
        (
            "ipsan_outranked_login_rejects_total",
            "Logins refused (0x0201) that would have replaced a more strongly authenticated session.",
            l.outranked_rejects,
        ),
        (
            "ipsan_address_limit_refusals_total",
            "Connections closed at accept by max_connections_per_address.",
            l.address_limit_refusals,
        ),
        (
            "ipsan_first_pdu_timeouts_total",
            "Connections closed for sending no Login Request in time.",
            l.first_pdu_timeouts,
        ),
    ] {
        e.sample(name, help, "counter", &[], v as f64);
    }
    for (result, v) in [
        ("applied", &registry.metrics.config_changes),
        ("invalid", &registry.metrics.config_changes_invalid),
        ("refused", &registry.metrics.config_changes_refused),
    ] {
        e.sample(
            "ipsan_config_changes_total",
            "Configuration changes (ipsan ctl, reloads, SIGHUP), by result: applied, invalid (did not validate), refused (valid but in use without --force, or not possible online).",
            "counter",
            &[("result", result)],
            v.load(Ordering::Relaxed) as f64,
        );
    }
    for (result, v) in [
        ("ok", registry.metrics.control_ok.load(Ordering::Relaxed)),
        (
            "error",
            registry.metrics.control_errors.load(Ordering::Relaxed),
        ),
    ] {
        e.sample(
            "ipsan_control_requests_total",
            "Control socket requests answered, by result.",
            "counter",
            &[("result", result)],
            v as f64,
        );
    }
    e.sample(
        "ipsan_sessions",
        "Sessions logged in (normal and discovery).",
        "gauge",
        &[],
        registry.session_count() as f64,
    );
    e.render()
}

/// The counters of one session (or of the sessions summed under `other`).
fn session_series(e: &mut Exposition, labels: &[(&str, &str)], st: &SessionStats) {
    e.io("ipsan_session", "session", labels, &st.io);
    let g = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
    for (name, help, v) in [
        (
            "ipsan_session_r2ts_total",
            "R2T PDUs sent to the session.",
            g(&st.r2ts),
        ),
        (
            "ipsan_session_digest_errors_total",
            "PDUs of the session that failed a CRC32C header or data digest.",
            g(&st.digest_errors),
        ),
        (
            "ipsan_session_pdu_errors_total",
            "PDUs of the session rejected as malformed (other than digests).",
            g(&st.pdu_errors),
        ),
        (
            "ipsan_session_seal_open_failures_total",
            "Seal data-out the target refused to open (any reason).",
            g(&st.seal_open_failures),
        ),
        (
            "ipsan_session_seal_forgeries_total",
            "Seal chunks whose tag did not verify: modified, relocated or forged data.",
            g(&st.seal_forgeries),
        ),
        (
            "ipsan_session_seal_replays_total",
            "Seal chunks refused as replays.",
            g(&st.seal_replays),
        ),
    ] {
        e.sample(name, help, "counter", labels, v);
    }
}

/// Serves `GET /metrics` on `listener` until `stop`: a minimal HTTP/1.1 responder (one
/// request per connection, `Connection: close`), enough for Prometheus and curl.
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    registry: Arc<Registry>,
    stop: tokio_util::sync::CancellationToken,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let limit = Arc::new(tokio::sync::Semaphore::new(64));
    loop {
        let (mut stream, _) = tokio::select! {
            a = listener.accept() => match a {
                Ok(x) => x,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stop.cancelled() => return,
        };
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            continue;
        };
        let registry = registry.clone();
        tokio::spawn(async move {
            let mut head = Vec::with_capacity(1024);
            let mut buf = [0u8; 1024];
            let read = async {
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
                    let n = stream.read(&mut buf).await?;
                    if n == 0 {
                        break;
                    }
                    head.extend_from_slice(&buf[..n]);
                }
                std::io::Result::Ok(())
            };
            if !matches!(
                tokio::time::timeout(Duration::from_secs(5), read).await,
                Ok(Ok(()))
            ) {
                return;
            }
            let line = head.split(|&b| b == b'\n').next().unwrap_or(&[]);
            let line = String::from_utf8_lossy(line);
            let mut parts = line.split_whitespace();
            let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let path = path.split('?').next().unwrap_or("");
            let (status, ctype, body) = match (method, path) {
                ("GET" | "HEAD", "/metrics") => (
                    "200 OK",
                    "text/plain; version=0.0.4; charset=utf-8",
                    render(&registry),
                ),
                ("GET" | "HEAD", "/") => (
                    "200 OK",
                    "text/plain; charset=utf-8",
                    "ipsan target metrics: GET /metrics (Prometheus text format)\n".to_owned(),
                ),
                ("GET" | "HEAD", _) => ("404 Not Found", "text/plain", "not found\n".to_owned()),
                _ => (
                    "405 Method Not Allowed",
                    "text/plain",
                    "GET only\n".to_owned(),
                ),
            };
            let mut resp = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            )
            .into_bytes();
            if method != "HEAD" {
                resp.extend_from_slice(body.as_bytes());
            }
            let _ = stream.write_all(&resp).await;
            let _ = stream.shutdown().await;
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipsan_scsi::ScsiStatus;

    /// Issue 31: 1,024 sessions whose initiator names are 8,192 bytes each (what a login
    /// accepts) made a scrape of about 0.7 GB. Now labels are at most MAX_LABEL_BYTES and
    /// sessions past MAX_SESSION_SERIES are summed under `other`: the scrape stays under
    /// 1 MiB (0.83 MB measured), and its size does not grow with the number of sessions past 64.
    #[test]
    fn bounds_the_scrape_at_1024_sessions_with_8192_byte_initiator_names() {
        let r = Registry::build(
            &crate::Config::from_toml(
                "[[target]]\niqn = \"iqn.2026-11.x:a\"\n[[target.lun]]\nid = 0\nbackend = \"mem:4MiB\"\n",
            )
            .unwrap(),
        )
        .unwrap();
        let mut regs = Vec::new();
        let w = [0x2a, 0, 0, 0, 0, 0, 0, 0, 8, 0];
        for n in 0..1024u16 {
            let mut name = format!("iqn.2026-11.x:{n:04}-");
            name.push_str(&"n".repeat(8192 - name.len()));
            let params = iscsi_proto::params::SessionParams {
                initiator_name: name,
                target_name: Some("iqn.2026-11.x:a".into()),
                ..Default::default()
            };
            let reg = r
                .register(crate::registry::SessionInfo::new(
                    &params,
                    [0x80, 0, 0, 0, (n >> 8) as u8, n as u8],
                    n + 1,
                    "127.0.0.1:1".parse().unwrap(),
                    None,
                    None,
                ))
                .unwrap();
            // One WRITE per session: the "other" series must sum them.
            reg.stats.start(0).done(&w, ScsiStatus::GOOD, None);
            regs.push(reg);
        }
        let text = render(&r);
        println!("scrape at 1,024 sessions: {} bytes", text.len());
        assert!(
            text.len() < 1 << 20,
            "scrape of {} bytes at 1,024 sessions",
            text.len()
        );
        let longest = text.lines().map(str::len).max().unwrap();
        assert!(longest < 400, "a line of {longest} bytes");
        // Names are cut, and two names that share their first bytes stay apart.
        let own: std::collections::BTreeSet<&str> = text
            .lines()
            .filter(|l| l.starts_with("ipsan_session_r2ts_total{"))
            .collect();
        assert_eq!(own.len(), MAX_SESSION_SERIES + 1, "64 sessions and other");
        assert!(
            text.contains("ipsan_session_series_aggregated 960"),
            "{}",
            &text[..2000]
        );
        let other = "ipsan_session_commands_total{target=\"iqn.2026-11.x:a\",initiator=\"other\",tsih=\"other\",op=\"write\"} 960";
        assert!(text.contains(other), "other does not sum the 960 sessions");
        assert!(text.contains(
            "ipsan_lun_commands_total{target=\"iqn.2026-11.x:a\",lun=\"0\",op=\"write\"} 1024"
        ));
    }
}
