//! Bringing a controller up and keeping it alive (NVMe/TCP): the admin queue's connection, TLS
//! and DH-HMAC-CHAP per queue, the bring-up (Fabrics Connect, Property Get/Set, Identify), the I/O
//! queues' Connects, and the Keep Alive task at KATO/2.

use std::sync::OnceLock;

use super::*;

pub(super) fn tls_params(cfg: &NvmeConfig, subnqn: &str) -> Option<TlsParams> {
    cfg.tls.as_ref().map(|k| TlsParams {
        key: k.clone(),
        hostnqn: cfg.hostnqn.clone(),
        subnqn: subnqn.to_owned(),
    })
}

/// Runs one queue's DH-HMAC-CHAP transaction (an I/O queue after its Connect).
pub(super) async fn authenticate(
    q: &QueueHandle,
    mut run: AuthRun,
    timeout: Duration,
) -> Result<(), NvmeError> {
    while let Some(c) = run.poll_command() {
        let (cqe, data) =
            tokio::time::timeout(timeout, q.call(c.sqe, c.data, c.read_len, BytesMut::new()))
                .await
                .map_err(|_| NvmeError::Timeout("DH-HMAC-CHAP"))??;
        if run.handle_completion(&cqe, &data)? {
            return Ok(());
        }
    }
    Err(NvmeError::Invalid("DH-HMAC-CHAP stalled".into()))
}

/// Runs a bring-up on the admin queue.
pub(super) async fn bring_up(
    admin: &QueueHandle,
    cfg: BringupConfig,
    timeout: Duration,
) -> Result<ControllerInfo, NvmeError> {
    let mut b = Bringup::new(cfg);
    loop {
        match b.poll_command(Instant::now())? {
            Some(HostCommand {
                sqe,
                data,
                read_len,
            }) => {
                let (cqe, buf) =
                    tokio::time::timeout(timeout, admin.call(sqe, data, read_len, BytesMut::new()))
                        .await
                        .map_err(|_| NvmeError::Timeout("admin command during bring-up"))??;
                b.handle_completion(&cqe, &buf, Instant::now())?;
            }
            None if b.is_done() => return Ok(b.into_info()),
            None => match b.poll_timeout() {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => {
                    return Err(NvmeError::Invalid(
                        "bring-up stalled with no command out".into(),
                    ))
                }
            },
        }
    }
}

/// What [`establish`] brought up.
pub(super) struct Established {
    pub(super) info: ControllerInfo,
    pub(super) nsid: u32,
    pub(super) block_len: u32,
    pub(super) blocks: u64,
    pub(super) max_transfer: u32,
    pub(super) links: Links,
}

/// Connects the admin queue, brings the controller up, and connects the I/O queues.
pub(super) async fn establish(
    url: &NvmeUrl,
    cfg: &NvmeConfig,
    gen: u64,
) -> Result<Established, NvmeError> {
    let subnqn = url
        .require_subsystem()
        .map_err(|e| NvmeError::Invalid(e.to_string()))?
        .to_owned();
    let cancel = CancellationToken::new();
    let guard = cancel.clone().drop_guard();
    let addr = url.addr();
    let mut qc = QueueConfig::admin();
    qc.header_digest = cfg.header_digest;
    qc.data_digest = cfg.data_digest;
    let tls = tls_params(cfg, &subnqn);
    let admin =
        QueueHandle::connect(&addr, qc, tls.as_ref(), cfg.connect_timeout, cancel.clone()).await?;
    let kato_ms = u32::try_from(cfg.kato.as_millis()).unwrap_or(u32::MAX);
    let bc = BringupConfig {
        hostnqn: cfg.hostnqn.clone(),
        hostid: cfg.hostid,
        subnqn: subnqn.clone(),
        discovery: false,
        kato_ms,
        nsid: url.nsid,
        io_queues: cfg.queues.max(1),
        auth: cfg.auth.clone(),
    };
    let info = bring_up(&admin, bc, cfg.connect_timeout).await?;
    let (nsid, ns) = info
        .namespace
        .clone()
        .ok_or(NvmeError::Invalid("no namespace".into()))?;
    // MDTS caps a transfer (2^MDTS pages of 2^(12 + MPSMIN) bytes); 8 MiB otherwise.
    let page = 1u64 << (12 + info.cap.map_or(0, |c| u32::from(c.mpsmin)));
    let max_transfer = match info.identify.mdts {
        0 => 8 << 20,
        m => (page << m.min(20)).min(8 << 20) as u32,
    };
    // Entries per I/O queue: what was asked, at most CAP.MQES + 1 (and MAXCMD); one of
    // them stays free, so entries − 1 commands are in flight at most.
    let mqes = info.cap.map_or(127, |c| c.mqes);
    let mut entries = cfg.queue_depth.max(2).min(mqes.saturating_add(1));
    if info.identify.maxcmd != 0 {
        entries = entries.min(info.identify.maxcmd.max(2));
    }
    let depth = entries - 1;
    let in_capsule = info.identify.in_capsule_bytes();
    let mut io = Vec::new();
    for qid in 1..=info.io_queues.max(1) {
        let qc = QueueConfig {
            header_digest: cfg.header_digest,
            data_digest: cfg.data_digest,
            max_transfer,
            in_capsule,
            depth,
        };
        let rt = match cfg.queue_runtimes.len() {
            0 => None,
            n => cfg.queue_runtimes.get(usize::from(qid - 1) % n),
        };
        let q = QueueHandle::connect_on(
            rt,
            &addr,
            qc,
            tls.as_ref(),
            cfg.connect_timeout,
            cancel.clone(),
        )
        .await?;
        let data = ConnectData {
            hostid: cfg.hostid,
            cntlid: info.cntlid,
            subnqn: subnqn.clone(),
            hostnqn: cfg.hostnqn.clone(),
        };
        // SQ flow control off unless asked for: successful reads then need no response
        // capsule (NvmeConfig::sq_flow_control).
        let cattr = if cfg.sq_flow_control {
            0
        } else {
            cmd::CATTR_SQFLOW_DISABLE
        };
        let (sqe, bytes) = cmd::connect_with_cattr(qid, entries - 1, 0, cattr, &data)
            .map_err(|e| NvmeError::Invalid(e.to_string()))?;
        let (cqe, _) = tokio::time::timeout(
            cfg.connect_timeout,
            q.call(sqe, Bytes::copy_from_slice(&bytes), 0, BytesMut::new()),
        )
        .await
        .map_err(|_| NvmeError::Timeout("I/O queue Connect"))??;
        if !cqe.status.is_success() {
            return Err(NvmeError::Status {
                op: "Connect (I/O queue)",
                status: cqe.status,
                dnr: cqe.dnr,
            });
        }
        let r = ConnectResponse::from_dw0(cqe.dw0);
        if r.ascr {
            return Err(BringupError::ConcatenationRequired.into());
        }
        if r.atr {
            let a = cfg
                .auth
                .clone()
                .ok_or(BringupError::AuthenticationRequired)?;
            let run = AuthRun::new(a, &cfg.hostnqn, &subnqn, qid);
            authenticate(&q, run, cfg.connect_timeout).await?;
        }
        io.push(q);
    }
    let keepalive_error = Arc::new(OnceLock::new());
    if let Some(ka) = KeepAlive::new(kato_ms, Instant::now()) {
        tokio::spawn(keep_alive(
            admin.clone(),
            ka,
            cfg.kato,
            cancel.clone(),
            keepalive_error.clone(),
        ));
    }
    guard.disarm();
    Ok(Established {
        info,
        nsid,
        block_len: ns.block_len,
        blocks: ns.nsze,
        max_transfer,
        links: Links {
            admin,
            io,
            cancel,
            keepalive_error,
            gen,
        },
    })
}

pub(super) async fn keep_alive(
    admin: QueueHandle,
    mut ka: KeepAlive,
    kato: Duration,
    cancel: CancellationToken,
    error: Arc<OnceLock<String>>,
) {
    let fail = |msg: String| {
        tracing::warn!("nvme: {msg}");
        let _ = error.set(msg);
    };
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(ka.poll_timeout().into()) => {}
            () = cancel.cancelled() => return,
        }
        match ka.handle_timeout(Instant::now()) {
            Err(e) => {
                fail(e.to_string());
                cancel.cancel();
                return;
            }
            Ok(None) => {}
            Ok(Some(c)) => {
                let r = tokio::select! {
                    r = tokio::time::timeout(kato, admin.call(c.sqe, c.data, 0, BytesMut::new())) => r,
                    () = cancel.cancelled() => return,
                };
                match r {
                    Ok(Ok((cqe, _))) if cqe.status.is_success() => ka.answered(Instant::now()),
                    Ok(Ok((cqe, _))) => {
                        fail(format!(
                            "Keep Alive failed: SCT {:#x} SC {:#04x}",
                            cqe.status.sct, cqe.status.sc
                        ));
                        cancel.cancel();
                        return;
                    }
                    Ok(Err(e)) => {
                        fail(format!("Keep Alive: {e}"));
                        cancel.cancel();
                        return;
                    }
                    Err(_) => {
                        fail(format!("Keep Alive unanswered for {kato:?} (KATO)"));
                        cancel.cancel();
                        return;
                    }
                }
            }
        }
    }
}
