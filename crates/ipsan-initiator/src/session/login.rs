//! Connect and log in: TCP connect with the per-socket settings, the login exchange
//! (iscsi-proto's `LoginExchange` builds and reads every Login PDU; here they go out and
//! come in), and a logged-in connection's engine connection and tasks (`Fresh`).

use super::*;

/// TCP connect to the URL's portal, with the configured per-socket settings applied before
/// the SYN, bounded by the connect timeout; on a long path paced, its send buffer sized
/// ([`ipsan_tcp::tune_for_path`]).
pub(super) async fn connect_tcp(url: &IscsiUrl, cfg: &SessionConfig) -> Result<TcpStream> {
    let addr = url.socket_addr_string();
    let connect = async {
        let Some(tcp) = &cfg.tcp else {
            return TcpStream::connect(&addr).await;
        };
        let mut last = None;
        for sa in tokio::net::lookup_host(&addr).await? {
            let sock = if sa.is_ipv4() {
                tokio::net::TcpSocket::new_v4()?
            } else {
                tokio::net::TcpSocket::new_v6()?
            };
            // Buffers and the congestion control go on before the SYN.
            tcp.apply(&sock)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            match sock.connect(sa).await {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other(format!("{addr}: no address"))))
    };
    let stream = tokio::time::timeout(cfg.connect_timeout, connect)
        .await
        .map_err(|_| Error::Timeout("TCP connect"))??;
    if cfg.tcp.as_ref().and_then(|t| t.nodelay).is_none() {
        stream.set_nodelay(true)?;
    }
    // Across a WAN (judged by the handshake's round trip): paced, so a window leaves spread
    // over the round trip instead of as a burst into the bottleneck's queue (issue 28, one
    // connection at 1 Gbit/s, 32 ms: 2.17x, docs/results/mcs-sweep-7), and a send buffer
    // past the autotuning ceiling unless `[tcp] sndbuf` chose one (docs/results/mcs-sweep-8).
    let buffer = ipsan_tcp::SendBuffer::unless_set(cfg.tcp.as_ref());
    match ipsan_tcp::tune_for_path(&stream, buffer) {
        Ok(t) if t.long => {
            tracing::debug!(rtt = ?t.rtt, paced = t.paced, sndbuf = ?t.sndbuf, "long path")
        }
        Ok(_) => {}
        Err(e) => tracing::debug!("path not judged: {e}"),
    }
    Ok(stream)
}

/// What login leaves for the full feature phase.
pub(super) struct LoggedIn {
    pub(super) params: Negotiated,
    /// The values in force as login negotiated them: what the engine runs on.
    pub(super) session_params: SessionParams,
    /// Installed before the first command (Seal: every command's data is sealed).
    pub(super) transform: Option<Arc<dyn PayloadTransform>>,
    /// Seal's record protection for every PDU of the connection (docs/seal.md §4a).
    pub(super) record: Option<crate::login::RecordLayer>,
    pub(super) done: LoginDone,
}

/// Runs the login exchange on `conn` (RFC 7143 §6.3): iscsi-proto's [`LoginExchange`]
/// builds every Login Request and reads every response; here PDUs go out and come in, and
/// relayed CHAP's challenge and answer travel over the relay's channels.
pub(super) async fn login(
    conn: &mut Conn,
    opts: LoginOptions,
    kind: SessionKind,
    ext: Option<Box<dyn OriginatorExtension>>,
    relay: Option<crate::login::ChapRelay>,
) -> Result<LoggedIn> {
    let isid = opts.isid.unwrap_or_else(originator::random_isid);
    let (mut machine, first, mut relay) = match relay {
        Some(r) => {
            let opts = LoginOptions {
                chap_algorithms: r.algorithms.clone(),
                ..opts
            };
            let (m, s) = LoginMachine::start_relayed(opts, kind);
            (m, s, Some(r))
        }
        None => {
            let (m, s) = LoginMachine::start(opts, kind);
            (m, s, None)
        }
    };
    if let Some(ext) = ext {
        machine.set_extension(ext, isid);
    }
    let mut x = LoginExchange::new(machine, first, isid);
    loop {
        while let Some(pdu) = x.poll_transmit() {
            conn.send_pdu(pdu).await?;
        }
        let pdu = conn.recv().await?;
        let progress = x.handle_pdu(&pdu)?;
        if let (Some(verdict), Some(r)) = (x.take_relay_verdict(), relay.as_mut()) {
            // The target accepted the relayed response: the host hears it now.
            if let Some(tx) = r.accepted.take() {
                let _ = tx.send(verdict);
            }
        }
        match progress {
            LoginProgress::Send => {}
            LoginProgress::RelayChallenge {
                algorithm,
                id,
                challenge,
            } => {
                let r = relay
                    .as_mut()
                    .ok_or_else(|| Error::Login("relayed CHAP without a relay".into()))?;
                let (Some(tx), Some(rx)) = (r.challenge.take(), r.response.take()) else {
                    return Err(Error::Login("a second relayed CHAP challenge".into()));
                };
                tx.send((algorithm, id, challenge))
                    .map_err(|_| Error::Login("relayed CHAP: the host is gone".into()))?;
                let answer = rx
                    .await
                    .map_err(|_| Error::Login("relayed CHAP: the host did not answer".into()))?;
                x.relay_response(&answer.name, &answer.response, answer.mutual)?;
            }
            LoginProgress::Done(done) => {
                // Seal's record layer is keyed from the whole transcript, this final
                // response included (docs/seal.md §4a).
                let record = x
                    .extension_mut()
                    .and_then(|e| e.record_layer())
                    .transpose()
                    .map_err(Error::Login)?;
                let params = Negotiated::from_login(&done.established);
                tracing::debug!(?params, "login done");
                return Ok(LoggedIn {
                    params,
                    session_params: done.established.params.clone(),
                    record,
                    transform: x.extension_mut().and_then(|e| e.transform()),
                    done,
                });
            }
        }
    }
}

/// Connect and log in, bounded by the login timeout.
///
/// No CHAP fallback: a refused login is not retried with a narrower algorithm list, since a
/// forged "authentication failure" (anyone on the path can send one) would otherwise steer
/// the next login to SHA-1/MD5 (issue 31). A target that picks an algorithm it cannot finish
/// (tgtd 1.0.85 takes CHAP_A=7 but cannot read a 32-byte CHAP_R) is reached by offering the
/// algorithms it can do explicitly ([`LoginOptions::chap_algorithms`], `--chap-algorithms
/// sha1,md5` for tgtd).
pub(super) async fn connect_and_login(
    url: &IscsiUrl,
    cfg: &SessionConfig,
    kind: SessionKind,
) -> Result<(Conn, LoggedIn)> {
    let stream = connect_tcp(url, cfg).await?;
    let mut conn = Conn::new(stream);
    let ext = cfg.extension.as_ref().map(|f| (f.0)());
    let opts = cfg.login.clone();
    let chap = opts.chap.is_some();
    let li = tokio::time::timeout(cfg.login_timeout, login(&mut conn, opts, kind, ext, None))
        .await
        .map_err(|_| Error::Timeout("login"))?;
    if let Err(Error::LoginRefused {
        class: 2,
        detail: 0,
        ..
    }) = &li
    {
        if chap {
            tracing::warn!(
                "login refused (initiator error) after CHAP; if the target cannot do the \
                 algorithm it picked (tgtd: SHA-256), offer the ones it can explicitly \
                 (tgtd 1.0.85: --chap-algorithms sha1,md5)"
            );
        }
    }
    Ok((conn, li?))
}

/// The codec for the values a login negotiated (digests, RFC 7143 §13.1; what we declared
/// we receive, §13.12).
pub(super) fn codec_for(params: &Negotiated) -> Codec {
    Codec {
        header_digest: params.header_digest,
        data_digest: params.data_digest,
        max_recv_data_segment_length: params.max_recv_data_segment_length,
    }
}

/// A logged-in connection whose full feature phase has not started.
pub(super) struct Fresh {
    pub(super) conn: Conn,
    pub(super) li: LoggedIn,
}

/// Connect and log in (a first login, or a reinstating one).
pub(super) async fn login_connection(
    url: &IscsiUrl,
    cfg: &SessionConfig,
    target: &str,
) -> Result<Fresh> {
    let (conn, li) = connect_and_login(
        url,
        cfg,
        SessionKind::Normal {
            target_name: target.to_owned(),
        },
    )
    .await?;
    Ok(Fresh { conn, li })
}

impl Fresh {
    /// The engine connection for this login.
    pub(super) fn engine(&self, cfg: &SessionConfig) -> engine::Connection {
        let li = &self.li;
        let mut ecfg = engine::Config::new(
            li.session_params.clone(),
            li.done.exp_cmd_sn,
            li.done.max_cmd_sn,
            li.done.exp_stat_sn,
        );
        ecfg.exp_cmd_sn = li.done.exp_cmd_sn;
        ecfg.nop_interval = cfg.nop_interval;
        ecfg.nop_timeout = cfg.nop_timeout;
        ecfg.tmf_timeout = TMF_TIMEOUT;
        ecfg.max_queued_pong_bytes = MAX_QUEUED_PONG_BYTES;
        ecfg.command_timeout = cfg.command_timeout;
        engine::Connection::new(ecfg, Instant::now())
    }

    /// Starts the connection's tasks (writer, reader, timer) once its engine connection is
    /// the session's current one (`st`).
    pub(super) fn start(self, core: Arc<Core>, st: Arc<ConnState>) -> Arc<Shared> {
        let Fresh { conn, li } = self;
        let params = li.params.clone();
        let Conn { mut rd, mut wr } = conn;
        let socket = {
            use std::os::fd::AsFd;
            rd.get_ref().as_ref().as_fd().try_clone_to_owned().ok()
        };
        let shared = Arc::new(Shared {
            core,
            st,
            params,
            socket,
        });
        // The negotiated digests, and the record step between the codec and the engine
        // (docs/seal.md §4a), on the same framed halves the login used: whatever the target
        // sent after its last login response is still in the reader's buffer.
        let codec = codec_for(&shared.params);
        let (sealer, opener) = li.record.map_or((None, None), |(s, o)| (Some(s), Some(o)));
        rd.codec = codec.clone();
        rd.record = opener;
        wr.codec = codec;
        wr.sealer = sealer;
        // The writer first: a closing engine stops the others but lets the writer flush.
        let w = tokio::spawn(writer(wr, shared.clone()));
        let r = tokio::spawn(reader(rd, shared.clone()));
        let k = tokio::spawn(timer(shared.clone()));
        if let Ok(mut t) = shared.st.io_tasks.lock() {
            *t = vec![w.abort_handle(), r.abort_handle(), k.abort_handle()];
        }
        shared
    }
}
