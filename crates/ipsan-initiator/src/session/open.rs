//! A session's life: open and connect (the first login), what it reports (parameters,
//! TCP state, recovery counters), which connection a command goes to, and logout.

use super::*;

impl Session {
    /// Connect, log in to the URL's target and LUN, and read its capacity (retrying the
    /// UNIT ATTENTION many targets report on a fresh nexus).
    pub async fn open(url: &IscsiUrl, cfg: &SessionConfig) -> Result<Self> {
        let s = Self::connect(url, cfg).await?;
        io::past_unit_attention(|| s.read_capacity()).await?;
        Ok(s)
    }

    /// Connect and log in, without touching the LUN. With
    /// [`SessionConfig::recovery_timeout`] set, a supervisor task recovers the session when
    /// its connection fails ([`crate::recovery`]).
    pub async fn connect(url: &IscsiUrl, cfg: &SessionConfig) -> Result<Self> {
        Self::connect_with(url, cfg, None).await
    }

    /// Connect and log in with relayed CHAP (a gateway's remote leg, docs/gateway.md): the
    /// target's challenge goes out through `relay`, the host's answer comes back through it,
    /// and the target's verdict goes out; `cfg.login.chap` is not used. Such a session has
    /// no session recovery whatever `cfg` says: a new login needs the host to answer again.
    pub async fn connect_relayed(
        url: &IscsiUrl,
        cfg: &SessionConfig,
        relay: crate::login::ChapRelay,
    ) -> Result<Self> {
        let cfg = SessionConfig {
            recovery_timeout: None,
            ..cfg.clone()
        };
        Self::connect_with(url, &cfg, Some(relay)).await
    }

    pub(super) async fn connect_with(
        url: &IscsiUrl,
        cfg: &SessionConfig,
        relay: Option<crate::login::ChapRelay>,
    ) -> Result<Self> {
        let target = url.require_target()?.to_owned();
        let lun = u64::from_be_bytes(scsi::encode_lun(u64::from(url.lun.unwrap_or(0))));
        // One ISID for the session's life: a reconnect with the same ISID and TSIH 0
        // reinstates it (RFC 7143 §6.3.5).
        let mut cfg = cfg.clone();
        cfg.login.isid = Some(cfg.login.isid.unwrap_or_else(originator::random_isid));
        let recovery_timeout = cfg.recovery_timeout.filter(|d| !d.is_zero());
        let fresh = match relay {
            None => login_connection(url, &cfg, &target).await?,
            Some(relay) => {
                let stream = connect_tcp(url, &cfg).await?;
                let mut conn = Conn::new(stream);
                let ext = cfg.extension.as_ref().map(|f| (f.0)());
                let kind = SessionKind::Normal {
                    target_name: target.clone(),
                };
                let li = tokio::time::timeout(
                    cfg.login_timeout,
                    login(&mut conn, cfg.login.clone(), kind, ext, Some(relay)),
                )
                .await
                .map_err(|_| Error::Timeout("login"))??;
                Fresh { conn, li }
            }
        };
        let st = Arc::new(ConnState::new(0, fresh.li.transform.clone()));
        let session = proto::Session::new(
            proto::Config {
                recovery_timeout,
                // What may go again after a loss is the SCSI layer's call (SAM-5 §5.6).
                idempotent: crate::recovery::is_idempotent,
            },
            fresh.engine(&cfg),
        );
        let core = Arc::new(Core {
            inner: Mutex::new(Inner {
                session,
                waiters: OwnTagMap::default(),
                tmf_waiters: OwnTagMap::default(),
                closed_waiters: Vec::new(),
                timer_at: None,
                conn: st.clone(),
            }),
            counters: Counters::default(),
            observer: Arc::new(OnceLock::new()),
            refused: OnceLock::new(),
        });
        let first = fresh.start(core.clone(), st);
        let params = first.params.clone();
        let link = Arc::new(Link {
            state: watch::channel(LinkState::Up(first)).0,
            core,
            recovery_timeout,
            closing: AtomicBool::new(false),
        });
        let supervisor = recovery_timeout.map(|_| {
            tokio::spawn(supervise(link.clone(), url.clone(), cfg, target, lun)).abort_handle()
        });
        Ok(Self {
            link,
            lun,
            capacity: OnceLock::new(),
            transform: None,
            params,
            supervisor,
        })
    }

    /// The parameters negotiated at the first login (a reinstating login asks the same).
    pub fn params(&self) -> &Negotiated {
        &self.params
    }

    /// Install a payload transform (Seal): from now on the data of every command goes through
    /// it (see [`crate::transform`]), instead of the one the login installed.
    pub fn set_transform(&mut self, t: Arc<dyn PayloadTransform>) {
        self.transform = Some(t);
    }

    /// Report every command's events from now on to `o` (see [`crate::observe`]; the
    /// benchmark's trace is one). A session has at most one observer; returns false if one was
    /// set already.
    pub fn set_observer(&self, o: Arc<dyn CommandObserver>) -> bool {
        self.link.core.observer.set(o).is_ok()
    }

    /// The observer set with [`Session::set_observer`].
    pub fn observer(&self) -> Option<&Arc<dyn CommandObserver>> {
        self.link.core.observer.get()
    }

    /// The connection's TCP settings as the kernel reports them.
    pub fn tcp_in_force(&self) -> Option<ipsan_tcp::InForce> {
        let c = self.link.up()?;
        c.socket
            .as_ref()
            .and_then(|s| ipsan_tcp::settings::read_back(s).ok())
    }

    /// A TCP_INFO snapshot of the connection (cwnd, ssthresh, RTT, retransmits, ...).
    pub fn tcp_info(&self) -> Option<ipsan_tcp::TcpInfoSnapshot> {
        let c = self.link.up()?;
        c.socket
            .as_ref()
            .and_then(|s| ipsan_tcp::info::tcp_info(s).ok())
    }

    /// The capacity from the last READ CAPACITY.
    pub fn capacity(&self) -> Option<Capacity> {
        self.capacity.get().copied()
    }

    /// Whether the target asked this session's connection to log out (AsyncEvent 1): new
    /// commands fail with [`Error::LogoutRequested`] (without recovery; with it, they wait
    /// for the next login).
    pub fn logout_requested(&self) -> bool {
        self.link
            .up()
            .is_some_and(|c| c.st.logout_asked.load(Ordering::Acquire))
    }

    /// Why the connection died, if it did (and, with recovery, has not been replaced yet).
    pub fn failure(&self) -> Option<String> {
        match &*self.link.state.borrow() {
            LinkState::Up(c) => c.st.dead.get().map(ToString::to_string),
            LinkState::Recovering { reason, .. } => Some(reason.to_string()),
            LinkState::Refused { message, .. } => Some((*message).to_owned()),
        }
    }

    /// The recovery counters ([`crate::recovery`]); all zero without recovery.
    pub fn recovery_stats(&self) -> RecoveryStats {
        self.link.core.counters.snapshot()
    }

    /// The connection to submit to: the current one, or while the session recovers the next
    /// one, waiting for it up to the recovery timeout; or the caller's abort.
    pub(super) async fn connection_until(&self, until: Until<'_>) -> Result<Arc<Shared>> {
        let Until::Abort(abort) = until else {
            return self.connection().await;
        };
        tokio::select! {
            biased;
            () = abort.cancelled() => Err(Error::TaskAborted("ABORT TASK".into())),
            c = self.connection() => c,
        }
    }

    /// The connection to submit to: the current one (a command submitted as it dies is kept
    /// by the engine session for the next one, with recovery on), or while the session
    /// recovers the next one, waiting for it up to the recovery timeout.
    pub(super) async fn connection(&self) -> Result<Arc<Shared>> {
        // The common case, without a receiver of its own.
        if let LinkState::Up(c) = &*self.link.state.borrow() {
            return Ok(c.clone());
        }
        let mut rx = self.link.state.subscribe();
        loop {
            let st = rx.borrow_and_update().clone();
            match st {
                LinkState::Up(c) => return Ok(c),
                LinkState::Recovering { since, reason, .. } => {
                    let limit = self.link.recovery_timeout.unwrap_or_default();
                    let timed_out = || {
                        Counters::bump(&self.link.core.counters.timed_out);
                        Error::RecoveryTimedOut {
                            after: limit,
                            reason: reason.clone(),
                        }
                    };
                    let deadline = since + limit;
                    if Instant::now() >= deadline {
                        return Err(timed_out());
                    }
                    match tokio::time::timeout_at(deadline.into(), rx.changed()).await {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => {
                            return Err(Error::ConnectionLost(ConnectionLoss::Local(
                                LocalClose::SessionClosed,
                            )))
                        }
                        Err(_) => return Err(timed_out()),
                    }
                }
                LinkState::Refused {
                    class,
                    detail,
                    message,
                } => {
                    return Err(Error::LoginRefused {
                        class,
                        detail,
                        message,
                    })
                }
            }
        }
    }

    /// Log out (RFC 7143 §11.14) and close. Commands still in flight fail; recovery stops.
    pub async fn logout(self) -> Result<()> {
        self.link.closing.store(true, Ordering::Release);
        if let Some(h) = &self.supervisor {
            h.abort();
        }
        // Nothing to log out of while recovering: the old connection is gone and no new one
        // will come (the supervisor is stopped).
        let Some(c) = self.link.up() else {
            let reason = match &*self.link.state.borrow() {
                LinkState::Recovering { reason, .. } => reason.clone(),
                _ => ConnectionLoss::Local(LocalClose::Recovering),
            };
            // Commands kept for the next connection end with the session.
            let _ = self.link.core.with(|g| {
                g.session.end(
                    Instant::now(),
                    ConnectionError {
                        by: Side::Initiator,
                        reason: CloseReason::Logout,
                    },
                )
            });
            return Err(Error::ConnectionLost(reason));
        };
        c.logout().await
    }
}
