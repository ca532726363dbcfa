//! From the file form to the running [`Config`], one section at a time (portals, names, CHAP,
//! Seal, LUNs, remote LUNs, limits), each checked on the way: a bad value is refused with
//! the field it came from.

use super::*;

/// Reads a Seal pre-shared secret from a file (mode checked: [`check_secret_file`]).
pub fn seal_secret_from_file(field: &str, path: &Path) -> Result<Psk, ConfigError> {
    ipsan_initiator::psk_from_file(path).map_err(|e| err(field, e.to_string()))
}

pub(super) fn seal_psk(
    field: &str,
    inline: Option<&str>,
    file: Option<&Path>,
) -> Result<Psk, ConfigError> {
    match (inline, file) {
        (Some(s), None) => Psk::new(s.as_bytes().to_vec()).map_err(|e| err(field, e.to_string())),
        (None, Some(p)) => seal_secret_from_file(field, p),
        (Some(_), Some(_)) => Err(err(field, "give either secret or secret_file, not both")),
        (None, None) => Err(err(field, "a secret or secret_file is required")),
    }
}

pub(super) fn seal_settings(field: &str, f: &FileSeal) -> Result<SealSettings, ConfigError> {
    let policy = match &f.policy {
        None => SealPolicy::Allowed,
        Some(p) => p.parse().map_err(|_| {
            err(
                format!("{field}.policy"),
                format!("{p:?}: expected off, allowed or required"),
            )
        })?,
    };
    let secret = match (&f.secret, &f.secret_file) {
        (None, None) => None,
        (s, p) => Some(seal_psk(
            &format!("{field}.secret"),
            s.as_deref(),
            p.as_deref(),
        )?),
    };
    let initiators = f
        .initiator
        .iter()
        .enumerate()
        .map(|(i, ini)| {
            Ok((
                ini.name.clone(),
                seal_psk(
                    &format!("{field}.initiator[{i}].secret"),
                    ini.secret.as_deref(),
                    ini.secret_file.as_deref(),
                )?,
            ))
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    if policy == SealPolicy::Required && secret.is_none() && initiators.is_empty() {
        return Err(err(
            format!("{field}.policy"),
            "required, but no secret or initiator secrets are configured",
        ));
    }
    Ok(SealSettings {
        policy,
        secret,
        initiators,
    })
}

pub(super) fn parse_portal(field: &str, s: &str) -> Result<SocketAddr, ConfigError> {
    s.parse().map_err(|_| {
        err(
            field,
            format!("{s:?} is not an address:port (e.g. 127.0.0.1:3260)"),
        )
    })
}

/// Checks an iSCSI name (RFC 7143 §4.2.7): `iqn.`, `eui.` or `naa.` form, at most 223 bytes.
pub fn check_iqn(field: &str, iqn: &str) -> Result<(), ConfigError> {
    let ok_prefix = iqn.starts_with("iqn.") || iqn.starts_with("eui.") || iqn.starts_with("naa.");
    if !ok_prefix || iqn.len() > 223 || iqn.len() < 5 {
        return Err(err(
            field,
            format!("{iqn:?} is not an iSCSI name (iqn.YYYY-MM.reverse.domain:name)"),
        ));
    }
    if !iqn
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || b".-:".contains(&c))
        || iqn.bytes().any(|c| c.is_ascii_uppercase())
    {
        return Err(err(
            field,
            format!("{iqn:?} has characters an iSCSI name may not contain"),
        ));
    }
    Ok(())
}

pub(super) fn load_secret(
    field: &str,
    inline: Option<&str>,
    file: Option<&Path>,
) -> Result<ChapSecret, ConfigError> {
    match (inline, file) {
        (Some(s), None) => {
            ChapSecret::new(s.as_bytes().to_vec()).map_err(|e| err(field, e.to_string()))
        }
        (None, Some(p)) => {
            check_secret_file(field, p)?;
            ChapSecret::from_file(p).map_err(|e| err(field, e.to_string()))
        }
        (Some(_), Some(_)) => Err(err(field, "give either secret or secret_file, not both")),
        (None, None) => Err(err(field, "a secret or secret_file is required")),
    }
}

pub(super) fn chap_policy(field: &str, c: &FileChap) -> Result<ChapPolicy, ConfigError> {
    let secret = load_secret(
        &format!("{field}.secret"),
        c.secret.as_deref(),
        c.secret_file.as_deref(),
    )?;
    let mutual = match (
        &c.mutual_user,
        c.mutual_secret.is_some() || c.mutual_secret_file.is_some(),
    ) {
        (Some(u), true) => Some((
            u.clone(),
            load_secret(
                &format!("{field}.mutual_secret"),
                c.mutual_secret.as_deref(),
                c.mutual_secret_file.as_deref(),
            )?,
        )),
        (None, false) => None,
        _ => {
            return Err(err(
                format!("{field}.mutual_user"),
                "mutual CHAP needs both mutual_user and a mutual secret",
            ))
        }
    };
    if let Some((_, m)) = &mutual {
        if m.ct_eq(&secret) {
            // RFC 7143 §12.1.3: the two directions must use different secrets.
            return Err(err(
                format!("{field}.mutual_secret"),
                "must differ from the initiator's secret",
            ));
        }
    }
    let algorithms = match &c.algorithms {
        None => ChapAlgorithm::DEFAULT.to_vec(),
        Some(names) => names
            .iter()
            .map(|n| {
                ChapAlgorithm::from_name(n).ok_or_else(|| {
                    err(
                        format!("{field}.algorithms"),
                        format!(
                            "unknown CHAP algorithm {n:?}: expected sha256, sha3-256, sha1 or md5"
                        ),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    Ok(ChapPolicy {
        user: c.user.clone(),
        secret,
        mutual,
        algorithms,
    })
}

/// The `[[target.chap_host]]` entries of `field`, checked: every name a valid iSCSI name bound
/// to one credential only, every user name with one secret only.
pub(super) fn chap_hosts(
    field: &str,
    hosts: &[FileChapHost],
) -> Result<Vec<HostChap>, ConfigError> {
    let mut out: Vec<HostChap> = Vec::new();
    let mut bound = std::collections::HashMap::new();
    for (k, h) in hosts.iter().enumerate() {
        let f = format!("{field}.chap_host[{k}]");
        if h.names.is_empty() {
            return Err(err(
                format!("{f}.names"),
                "list the initiator names this credential may claim",
            ));
        }
        for n in &h.names {
            check_iqn(&format!("{f}.names"), n)?;
            if let Some(prev) = bound.insert(n.clone(), h.user.clone()) {
                return Err(err(
                    format!("{f}.names"),
                    format!(
                        "{n} is already bound to CHAP user {prev:?}: a name has one credential"
                    ),
                ));
            }
        }
        if out.iter().any(|o| o.policy.user == h.user) {
            return Err(err(
                format!("{f}.user"),
                format!(
                    "CHAP user {:?} is configured twice: list all its names in one entry",
                    h.user
                ),
            ));
        }
        let policy = chap_policy(
            &f,
            &FileChap {
                user: h.user.clone(),
                secret: h.secret.clone(),
                secret_file: h.secret_file.clone(),
                mutual_user: h.mutual_user.clone(),
                mutual_secret: h.mutual_secret.clone(),
                mutual_secret_file: h.mutual_secret_file.clone(),
                algorithms: h.algorithms.clone(),
            },
        )?;
        out.push(HostChap {
            names: h.names.clone(),
            policy,
        });
    }
    Ok(out)
}

/// The settings of a remote iSCSI LUN (`backend = "iscsi://host:port/iqn/lun"`).
pub(super) fn remote_from(
    field: &str,
    l: &FileLun,
) -> Result<crate::remote::RemoteSpec, ConfigError> {
    let url = ipsan_initiator::IscsiUrl::parse(&l.backend)
        .map_err(|e| err(format!("{field}.backend"), e.to_string()))?;
    if url.target.is_none() || url.lun.is_none() {
        return Err(err(
            format!("{field}.backend"),
            "expected iscsi://host[:port]/target-iqn/lun",
        ));
    }
    if url.user.is_some() {
        return Err(err(
            format!("{field}.backend"),
            "no CHAP user in the URL: use chap_user and chap_secret_file",
        ));
    }
    let mut session = ipsan_initiator::SessionConfig {
        // A remote leg rides out WAN failures (docs/gateway.md): open-iscsi's
        // replacement_timeout, as `ipsan gateway --recovery-timeout` defaults to.
        recovery_timeout: Some(ipsan_initiator::recovery::DEFAULT_RECOVERY_TIMEOUT),
        ..ipsan_initiator::SessionConfig::default()
    };
    match (&l.chap_user, &l.chap_secret_file) {
        (None, None) => {}
        (Some(user), Some(path)) => {
            let secret = ipsan_initiator::ChapSecret::from_file(path)
                .map_err(|e| err(format!("{field}.chap_secret_file"), e.to_string()))?;
            session.login.chap = Some(ipsan_initiator::ChapCredentials {
                name: user.clone(),
                secret,
            });
        }
        _ => {
            return Err(err(
                format!("{field}.chap_user"),
                "chap_user and chap_secret_file go together",
            ))
        }
    }
    let seal = match (&l.seal, &l.secret_file) {
        (None, None) => None,
        (Some(name), Some(path)) => {
            let cipher = ipsan_seal::Cipher::from_name(name).ok_or_else(|| {
                err(
                    format!("{field}.seal"),
                    format!("{name:?}: expected aes-256-gcm, chacha20-poly1305, 3des-cbc-hmac-sha1 or none"),
                )
            })?;
            Some((
                cipher,
                seal_secret_from_file(&format!("{field}.secret_file"), path)?,
            ))
        }
        _ => {
            return Err(err(
                format!("{field}.seal"),
                "seal and secret_file go together",
            ))
        }
    };
    if let Some(d) = l.depth {
        if !(1..=4096).contains(&d) {
            return Err(err(format!("{field}.depth"), "must be in 1..=4096"));
        }
    }
    if let Some(c) = &l.tcp_congestion {
        let t = ipsan_tcp::TcpSettings {
            congestion: Some(c.clone()),
            nodelay: Some(true),
            ..ipsan_tcp::TcpSettings::default()
        };
        t.validate()
            .map_err(|e| err(format!("{field}.tcp_congestion"), e.to_string()))?;
        session.tcp = Some(t);
    }
    let connections = l.connections.unwrap_or(crate::remote::DEFAULT_CONNECTIONS);
    if !(1..=64).contains(&connections) {
        return Err(err(format!("{field}.connections"), "must be in 1..=64"));
    }
    let erl = l
        .error_recovery_level
        .unwrap_or(crate::remote::DEFAULT_ERROR_RECOVERY_LEVEL);
    if erl != 0 && erl != 2 {
        // 1 (digest-error recovery by SNACK) is the target's only, as for `--erl`.
        return Err(err(
            format!("{field}.error_recovery_level"),
            "must be 0 or 2",
        ));
    }
    if l.chap_relay && l.chap_user.is_some() {
        return Err(err(
            format!("{field}.chap_relay"),
            "a relayed login answers CHAP with the host's credential: no chap_user",
        ));
    }
    let source = format!(
        "{} seal={} depth={} tcp={} chap={} connections={connections} erl={erl}",
        l.backend,
        l.seal.as_deref().unwrap_or("off"),
        l.depth.map_or("window".to_owned(), |d| d.to_string()),
        l.tcp_congestion.as_deref().unwrap_or("kernel"),
        if l.chap_relay {
            "relay"
        } else {
            l.chap_user.as_deref().unwrap_or("none")
        },
    );
    Ok(crate::remote::RemoteSpec {
        url,
        session,
        seal,
        depth: l.depth,
        source,
        chap_relay: l.chap_relay,
        compress: false,
        connections,
        spread: ipsan_initiator::Spread::default(),
        error_recovery_level: erl,
        granted: std::sync::Arc::default(),
    })
}

pub(super) fn lun_from(field: &str, l: &FileLun) -> Result<LunConfig, ConfigError> {
    let remote_only = l.seal.is_some()
        || l.secret_file.is_some()
        || l.depth.is_some()
        || l.tcp_congestion.is_some()
        || l.chap_user.is_some()
        || l.chap_secret_file.is_some()
        || l.chap_relay
        || l.connections.is_some()
        || l.error_recovery_level.is_some();
    if l.backend.starts_with("iscsi://") {
        let remote = remote_from(field, l)?;
        return Ok(LunConfig {
            id: l.id,
            backend: BackendSpec {
                kind: ipsan_scsi::BackendKind::Null,
                size: Some(0),
                block_size: None,
            },
            block_size: 512,
            read_only: l.read_only,
            write_cache: true,
            serial: None,
            remote: Some(std::sync::Arc::new(remote)),
        });
    }
    if remote_only {
        return Err(err(
            field.to_owned(),
            "seal, secret_file, depth, tcp_congestion, chap_user, chap_secret_file, chap_relay, connections and error_recovery_level apply to iscsi:// backends only",
        ));
    }
    let mut backend: BackendSpec = l
        .backend
        .parse()
        .map_err(|e| err(format!("{field}.backend"), format!("{e}")))?;
    let rbd_only = l.conf.is_some() || l.ceph_id.is_some() || l.keyring.is_some();
    match &mut backend.kind {
        ipsan_scsi::BackendKind::Rbd(r) => {
            if let Some(c) = &l.conf {
                r.conf = Some(c.clone());
            }
            if let Some(i) = &l.ceph_id {
                r.id = Some(i.clone());
            }
            if let Some(k) = &l.keyring {
                r.keyring = Some(k.clone());
            }
            for (k, v) in &l.options {
                let v = match v {
                    toml::Value::String(s) => s.clone(),
                    toml::Value::Integer(_) | toml::Value::Float(_) | toml::Value::Boolean(_) => {
                        v.to_string()
                    }
                    _ => {
                        return Err(err(
                            format!("{field}.options.{k}"),
                            "must be a string, number or boolean",
                        ))
                    }
                };
                r.options.push((k.clone(), v));
            }
        }
        _ if rbd_only || !l.options.is_empty() => {
            return Err(err(
                field.to_owned(),
                "conf, ceph_id, keyring and options apply to rbd: backends only",
            ))
        }
        _ => {}
    }
    let block_size = l.block_size.or(backend.block_size).unwrap_or(512);
    if block_size != 512 && block_size != 4096 {
        return Err(err(format!("{field}.block_size"), "must be 512 or 4096"));
    }
    Ok(LunConfig {
        id: l.id,
        backend,
        block_size,
        read_only: l.read_only,
        write_cache: l.write_cache.unwrap_or(true),
        serial: l.serial.clone(),
        remote: None,
    })
}

pub(super) fn limits_from(
    f: &FileServer,
    l: &mut crate::limits::Limits,
) -> Result<(), ConfigError> {
    use std::time::Duration;
    let at_least_1 = |field: &str, v: u64| {
        if v == 0 {
            Err(err(field, "must be at least 1"))
        } else {
            Ok(v)
        }
    };
    if let Some(n) = f.max_sessions_per_initiator {
        l.max_sessions_per_initiator =
            at_least_1("server.max_sessions_per_initiator", n as u64)? as usize;
    }
    if let Some(n) = f.max_connections_per_address {
        l.max_connections_per_address =
            at_least_1("server.max_connections_per_address", n as u64)? as usize;
    }
    if let Some(s) = f.first_pdu_timeout_secs {
        l.first_pdu_timeout = Duration::from_secs(at_least_1("server.first_pdu_timeout_secs", s)?);
    }
    let Some(b) = &f.auth_backoff else {
        return Ok(());
    };
    let a = &mut l.auth;
    if let Some(n) = b.name_free_failures {
        a.name_free_failures = n;
    }
    if let Some(n) = b.address_free_failures {
        a.address_free_failures = n;
    }
    if let Some(ms) = b.lockout_base_ms {
        a.lockout_base =
            Duration::from_millis(at_least_1("server.auth_backoff.lockout_base_ms", ms)?);
    }
    if let Some(s) = b.lockout_max_secs {
        a.lockout_max = Duration::from_secs(s);
    }
    if let Some(ms) = b.delay_base_ms {
        a.delay_base = Duration::from_millis(ms);
    }
    if let Some(ms) = b.delay_max_ms {
        a.delay_max = Duration::from_millis(ms);
    }
    if let Some(s) = b.forget_after_secs {
        a.forget_after =
            Duration::from_secs(at_least_1("server.auth_backoff.forget_after_secs", s)?);
    }
    if let Some(n) = b.max_tracked {
        a.max_tracked = at_least_1("server.auth_backoff.max_tracked", n as u64)? as usize;
    }
    if a.lockout_max < a.lockout_base {
        return Err(err(
            "server.auth_backoff.lockout_max_secs",
            "must not be shorter than lockout_base_ms",
        ));
    }
    if a.delay_max > Duration::from_secs(10) {
        return Err(err(
            "server.auth_backoff.delay_max_ms",
            "at most 10000 (a held-back response keeps a connection open)",
        ));
    }
    Ok(())
}
