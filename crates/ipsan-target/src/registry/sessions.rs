//! The session table: which sessions are logged in (by initiator, ISID and target, RFC 7143
//! §6.3.5), what each login proved ([`Authentication`], its [`Strength`]), the admission that
//! keeps a weaker login from replacing a stronger session and counts the per-initiator quota,
//! registration and reinstatement, TSIHs, and the shared state of a session's connections a
//! joining login finds (§5.3.4).

use super::*;

/// Key of a session for reinstatement: the same initiator, ISID and target (RFC 7143 §6.3.5).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct SessionKey {
    initiator: String,
    isid: [u8; 6],
    target: Option<String>,
}

/// What a session's login proved about its initiator name (docs/target.md, "Sessions keep
/// their strength"): the CHAP user it answered for, and the Seal secret its keys came from.
/// Neither is a secret; both are decided by the target's configuration at login.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Authentication {
    /// The CHAP user (`CHAP_N`) the login proved the secret of, when the target required CHAP.
    pub chap_user: Option<String>,
    /// The Seal secret the login's keys were confirmed with, when the session is sealed.
    pub seal: Option<crate::config::SealSecret>,
}

/// How strongly a login proved its initiator name, weakest first: nothing, CHAP (one secret
/// per target, RFC 7143 §12.1.3), Seal with the target-wide (group) secret, Seal with the
/// name's own secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Strength {
    None,
    Chap,
    SealTargetWide,
    SealOwn,
}

impl Authentication {
    /// The strongest proof this login gave.
    #[must_use]
    pub fn strength(&self) -> Strength {
        match (self.seal, &self.chap_user) {
            (Some(crate::config::SealSecret::Initiator), _) => Strength::SealOwn,
            (Some(crate::config::SealSecret::TargetWide), _) => Strength::SealTargetWide,
            (None, Some(_)) => Strength::Chap,
            (None, None) => Strength::None,
        }
    }

    /// Whether a login that proved `self` may replace a session that proved `old` (session
    /// reinstatement, RFC 7143 §6.3.5): it must prove everything `old` proved — the same
    /// CHAP user, a Seal secret at least as specific — so it is never weaker and never
    /// another identity.
    #[must_use]
    pub fn covers(&self, old: &Self) -> bool {
        self.strength() >= old.strength()
            && old
                .chap_user
                .as_ref()
                .is_none_or(|u| self.chap_user.as_ref() == Some(u))
            && self.seal >= old.seal
    }
}

impl std::fmt::Display for Authentication {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let seal = match self.seal {
            Some(crate::config::SealSecret::Initiator) => "Seal (own secret)",
            Some(crate::config::SealSecret::TargetWide) => "Seal (target-wide secret)",
            None => "",
        };
        match (&self.chap_user, seal) {
            (None, "") => f.write_str("no authentication"),
            (None, s) => f.write_str(s),
            (Some(u), "") => write!(f, "CHAP user {u:?}"),
            (Some(u), s) => write!(f, "CHAP user {u:?} and {s}"),
        }
    }
}

/// A login refused by [`Registry::register`] because a session it would replace was
/// authenticated more strongly (a race with another login; [`Registry::admit`] refuses the
/// ordinary case before the login is answered).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Outranked(String);

#[derive(Debug)]
struct SessionEntry {
    tsih: u16,
    /// Cancelled to end the session (reinstatement, shutdown, `ipsan ctl session drop`).
    cancel: CancellationToken,
    /// Cancelled by the session once none of its commands runs any more.
    drained: CancellationToken,
    info: Arc<SessionInfo>,
    stats: Arc<SessionStats>,
    /// Its connections' shared state, for a login joining it (RFC 7143 §5.3.4).
    core: Option<std::sync::Weak<dyn SessionCore>>,
}

/// A session's shared connection state as the registry keeps it, weakly, for a login joining
/// the session (RFC 7143 §5.3.4; [`Registry::attach`], [`Registry::joining`]) and for `ipsan
/// ctl sessions`: the connection driver's own type (`conn::Core`), named by this trait so the
/// registry does not depend on the driver that depends on it.
pub(crate) trait SessionCore: std::any::Any + Send + Sync {
    /// How many connections the session has now.
    fn connections(&self) -> usize;
    /// Itself, for [`Registry::joining`] to hand back the driver's type.
    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync>;
}

/// What [`Registry::register`] hands a new session.
#[derive(Debug)]
pub struct Registration {
    /// Cancelled to end the session (reinstatement, shutdown, `ipsan ctl session drop`).
    pub cancel: CancellationToken,
    /// The session's counters.
    pub stats: Arc<SessionStats>,
    /// The session cancels this once none of its commands runs any more (after its end).
    pub drained: CancellationToken,
    /// The session this login reinstates (RFC 7143 §6.3.5): cancelled once that session's
    /// commands have all finished or been aborted. The new session must not execute a
    /// command before (an old WRITE still running could land after its reissued copy).
    pub reinstates: Option<CancellationToken>,
}

/// What a logged-in session is (for `ipsan ctl sessions` and the metrics): never a key.
#[derive(Debug)]
pub struct SessionInfo {
    pub initiator: String,
    pub isid: [u8; 6],
    pub target: Option<String>,
    pub tsih: u16,
    pub peer: SocketAddr,
    pub local: Option<SocketAddr>,
    /// The operational parameters negotiated (RFC 7143 §13), as key=value.
    pub params: Vec<(String, String)>,
    /// Whether the login passed CHAP (set by [`Registry::register`] from the target).
    pub chap: bool,
    /// What the login proved (the CHAP user, the Seal secret): a login replaces this session
    /// only if it proves as much ([`Authentication::covers`]).
    pub auth: Authentication,
    /// The Seal session (cipher, counters, key epochs are read from it), when negotiated.
    pub seal: Option<Arc<SealSession>>,
    pub since: SystemTime,
}

impl SessionInfo {
    /// The record of a session that just completed its login.
    #[must_use]
    pub fn new(
        params: &SessionParams,
        isid: [u8; 6],
        tsih: u16,
        peer: SocketAddr,
        local: Option<SocketAddr>,
        seal: Option<Arc<SealSession>>,
    ) -> Self {
        let yn = |b: bool| if b { "Yes" } else { "No" }.to_owned();
        let digest = |b: bool| if b { "CRC32C" } else { "None" }.to_owned();
        let p = vec![
            ("HeaderDigest".into(), digest(params.header_digest)),
            ("DataDigest".into(), digest(params.data_digest)),
            ("ImmediateData".into(), yn(params.immediate_data)),
            ("InitialR2T".into(), yn(params.initial_r2t)),
            ("MaxBurstLength".into(), params.max_burst_length.to_string()),
            (
                "FirstBurstLength".into(),
                params.first_burst_length.to_string(),
            ),
            (
                "MaxRecvDataSegmentLength(initiator)".into(),
                params.initiator_max_recv_data_segment_length.to_string(),
            ),
            (
                "MaxRecvDataSegmentLength(target)".into(),
                params.target_max_recv_data_segment_length.to_string(),
            ),
            (
                "MaxOutstandingR2T".into(),
                params.max_outstanding_r2t.to_string(),
            ),
            (
                "ErrorRecoveryLevel".into(),
                params.error_recovery_level.to_string(),
            ),
        ];
        Self {
            initiator: params.initiator_name.clone(),
            isid,
            target: params.target_name.clone(),
            tsih,
            peer,
            local,
            params: p,
            chap: false,
            auth: Authentication::default(),
            seal,
            since: SystemTime::now(),
        }
    }

    /// The same record with what its login proved.
    #[must_use]
    pub fn with_auth(mut self, auth: Authentication) -> Self {
        self.auth = auth;
        self
    }
}

/// One session as `ipsan ctl sessions` lists it.
#[derive(Debug, Clone)]
pub struct SessionView {
    pub info: Arc<SessionInfo>,
    pub stats: Arc<SessionStats>,
    /// Its open connections (RFC 7143 §4.2, MaxConnections).
    pub connections: usize,
}

#[derive(Debug, Default)]
pub(super) struct Sessions {
    by_key: HashMap<SessionKey, SessionEntry>,
    next_tsih: u16,
    /// Logins past the session-count check that have not registered yet, per initiator and
    /// strength.
    pending: HashMap<(String, Strength), usize>,
}

/// A session slot taken by a login that passed [`Registry::admit`]; it counts against
/// `max_sessions_per_initiator` until the session registers or the login fails (dropped), so
/// concurrent logins cannot overshoot.
#[derive(Debug)]
pub struct SessionSlot {
    registry: Arc<Registry>,
    /// (initiator, strength) counted in `pending`; `None` for a discovery session.
    counted: Option<(String, Strength)>,
    auth: Authentication,
}

impl SessionSlot {
    /// What the login that took this slot proved (for [`SessionInfo::with_auth`]).
    #[must_use]
    pub fn auth(&self) -> &Authentication {
        &self.auth
    }
}

impl Drop for SessionSlot {
    fn drop(&mut self) {
        let Some(key) = self.counted.take() else {
            return;
        };
        let mut s = crate::lock(&self.registry.sessions);
        if let Some(n) = s.pending.get_mut(&key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                s.pending.remove(&key);
            }
        }
    }
}

impl Registry {
    /// Admits a login that completed everything else, before it is answered: refuses it if
    /// it would replace a session (same initiator, ISID and target: reinstatement, RFC 7143
    /// §6.3.5) that proved more than it did ([`Authentication::covers`]), then takes a session
    /// slot for it under `max_sessions_per_initiator`.
    ///
    /// A replacement that proves less gets 0x0201 (Authentication failure, RFC 7143
    /// §11.13.5): the name is authorized for the target (the allow-list said so, 0x0202 would
    /// be wrong), but the login did not authenticate as the identity that owns that I_T
    /// nexus; as a 0x0201 it counts toward the failure backoff and lockout (limits.rs). The
    /// old session is not touched.
    ///
    /// The quota counts, for a login of strength S, the initiator's sessions of strength S or
    /// more: a sealed login is never refused because of plaintext or CHAP sessions under its
    /// name (anyone may open those under `allowed`), a plaintext login counts everything. A
    /// name holds at most `max_sessions_per_initiator` sessions per strength. A full quota
    /// gets 0x0302 (Out of Resources: "the target has insufficient session, connection, or
    /// other resources"); 0x0206 (too many connections) is about connections within one
    /// session, so it does not fit. The session this login reinstates is not counted.
    pub fn admit(
        self: &Arc<Self>,
        initiator: &str,
        isid: [u8; 6],
        target: Option<&str>,
        auth: &Authentication,
    ) -> Result<SessionSlot, LoginFailure> {
        let max = self.limits.max_sessions_per_initiator;
        let strength = auth.strength();
        let mut s = crate::lock(&self.sessions);
        let key = SessionKey {
            initiator: initiator.to_owned(),
            isid,
            target: target.map(str::to_owned),
        };
        if let Some(old) = s.by_key.get(&key) {
            if !auth.covers(&old.info.auth) {
                let why = format!(
                    "would replace session TSIH {} authenticated by {}, with only {auth}",
                    old.tsih, old.info.auth
                );
                drop(s);
                LimitStats::bump(&self.stats.outranked_rejects);
                return Err(LoginFailure::new(LoginStatus::AUTHENTICATION_FAILURE, why));
            }
        }
        if target.is_none() {
            // Discovery sessions are not counted (they end after SendTargets).
            return Ok(SessionSlot {
                registry: self.clone(),
                counted: None,
                auth: auth.clone(),
            });
        }
        let live = s
            .by_key
            .iter()
            .filter(|(k, e)| {
                k.initiator == initiator
                    && k.target.is_some()
                    && **k != key
                    && e.info.auth.strength() >= strength
            })
            .count();
        let pending: usize = s
            .pending
            .iter()
            .filter(|((i, st), _)| i == initiator && *st >= strength)
            .map(|(_, n)| n)
            .sum();
        if live + pending >= max {
            drop(s);
            LimitStats::bump(&self.stats.session_limit_rejects);
            return Err(LoginFailure::new(
                LoginStatus::OUT_OF_RESOURCES,
                format!("{initiator} already has {live} sessions (+{pending} logging in) at least as strongly authenticated; max_sessions_per_initiator is {max}"),
            ));
        }
        let counted = (initiator.to_owned(), strength);
        *s.pending.entry(counted.clone()).or_insert(0) += 1;
        Ok(SessionSlot {
            registry: self.clone(),
            counted: Some(counted),
            auth: auth.clone(),
        })
    }

    /// Records a new session after login; reinstates (ends) an older one with the same key.
    /// Returns the token that ends this session, the counters it keeps and, for a
    /// reinstatement, the token that tells when the old session's commands are done.
    ///
    /// Refuses (and leaves the older session running) when the older one proved more than
    /// `info.auth` ([`Authentication::covers`]): [`Registry::admit`] refused that before the
    /// login was answered, unless the older session registered in between.
    pub fn register(&self, mut info: SessionInfo) -> Result<Registration, Outranked> {
        let target = info.target.as_deref().and_then(|t| self.target(t));
        info.chap = target.as_ref().is_some_and(|t| {
            matches!(t.auth_for(&info.initiator), Ok(Auth::Chap(_) | Auth::Relay))
        });
        let key = SessionKey {
            initiator: info.initiator.clone(),
            isid: info.isid,
            target: info.target.clone(),
        };
        let luns = target.map(|t| t.lun_stats.clone());
        let stats = Arc::new(SessionStats::new(luns));
        let cancel = CancellationToken::new();
        let drained = CancellationToken::new();
        let tsih = info.tsih;
        let initiator = info.initiator.clone();
        let mut s = crate::lock(&self.sessions);
        if let Some(old) = s.by_key.get(&key) {
            if !info.auth.covers(&old.info.auth) {
                let why = format!(
                    "{initiator}: would replace session TSIH {} authenticated by {}, with only {}",
                    old.tsih, old.info.auth, info.auth
                );
                drop(s);
                LimitStats::bump(&self.stats.outranked_rejects);
                return Err(Outranked(why));
            }
        }
        if let Some(old) = s.by_key.insert(
            key,
            SessionEntry {
                tsih,
                cancel: cancel.clone(),
                drained: drained.clone(),
                info: Arc::new(info),
                stats: stats.clone(),
                core: None,
            },
        ) {
            tracing::info!(
                initiator,
                old_tsih = old.tsih,
                new_tsih = tsih,
                "session reinstatement"
            );
            old.cancel.cancel();
            return Ok(Registration {
                cancel,
                stats,
                drained,
                reinstates: Some(old.drained),
            });
        }
        Ok(Registration {
            cancel,
            stats,
            drained,
            reinstates: None,
        })
    }

    /// Every logged-in session.
    #[must_use]
    pub fn sessions(&self) -> Vec<SessionView> {
        let entries: Vec<_> = crate::lock(&self.sessions)
            .by_key
            .values()
            .map(|e| (e.info.clone(), e.stats.clone(), e.core.clone()))
            .collect();
        // Counted outside the table's lock: a session's engine is never locked under it.
        let mut v: Vec<SessionView> = entries
            .into_iter()
            .map(|(info, stats, core)| SessionView {
                info,
                stats,
                connections: core
                    .and_then(|c| c.upgrade())
                    .map_or(1, |c| c.connections()),
            })
            .collect();
        v.sort_by_key(|e| e.info.tsih);
        v
    }

    /// Asks the sessions `pick` selects to log out (AsyncEvent 1, RFC 7143 §11.9.1); they
    /// stay until the initiator does. Returns how many were asked.
    pub fn request_logout(&self, pick: impl Fn(&SessionInfo) -> bool) -> usize {
        let s = crate::lock(&self.sessions);
        let mut n = 0;
        for e in s.by_key.values() {
            if pick(&e.info) {
                e.stats.logout.notify_one();
                n += 1;
            }
        }
        n
    }

    /// Ends the sessions `pick` selects (commands in flight finish first); returns how many.
    pub fn drop_sessions(&self, pick: impl Fn(&SessionInfo) -> bool) -> usize {
        let s = crate::lock(&self.sessions);
        let mut n = 0;
        for e in s.by_key.values() {
            if pick(&e.info) {
                e.cancel.cancel();
                n += 1;
            }
        }
        n
    }

    /// Forgets a session that ended (if it is still the registered one).
    pub fn unregister(&self, initiator: &str, isid: [u8; 6], target: Option<&str>, tsih: u16) {
        let key = SessionKey {
            initiator: initiator.to_owned(),
            isid,
            target: target.map(str::to_owned),
        };
        let mut s = crate::lock(&self.sessions);
        if s.by_key.get(&key).is_some_and(|e| e.tsih == tsih) {
            s.by_key.remove(&key);
        }
    }

    /// Ends every session (shutdown).
    pub fn cancel_all(&self) {
        let s = crate::lock(&self.sessions);
        for e in s.by_key.values() {
            e.cancel.cancel();
        }
    }

    /// Number of sessions logged in.
    #[must_use]
    pub fn session_count(&self) -> usize {
        crate::lock(&self.sessions).by_key.len()
    }

    pub(super) fn allocate_tsih(&self) -> u16 {
        let mut s = crate::lock(&self.sessions);
        loop {
            s.next_tsih = s.next_tsih.wrapping_add(1);
            let candidate = s.next_tsih;
            // TSIH 0 is reserved for "new session" (RFC 7143 §11.12.6).
            if candidate != 0 && !s.by_key.values().any(|e| e.tsih == candidate) {
                return candidate;
            }
        }
    }

    /// Records the shared state of a registered session's connections, so a login with its
    /// TSIH can join it.
    pub(crate) fn attach<C: SessionCore>(
        &self,
        initiator: &str,
        isid: [u8; 6],
        target: Option<&str>,
        tsih: u16,
        core: &Arc<C>,
    ) {
        let key = SessionKey {
            initiator: initiator.to_owned(),
            isid,
            target: target.map(str::to_owned),
        };
        if let Some(e) = crate::lock(&self.sessions)
            .by_key
            .get_mut(&key)
            .filter(|e| e.tsih == tsih)
        {
            let core: std::sync::Weak<C> = Arc::downgrade(core);
            e.core = Some(core);
        }
    }

    /// The session a login with `tsih` joins: only the one of this initiator, ISID and target
    /// (RFC 7143 §5.3.4), and only while it runs.
    pub(crate) fn joining<C: SessionCore>(
        &self,
        initiator: &str,
        isid: [u8; 6],
        target: Option<&str>,
        tsih: u16,
    ) -> Option<Arc<C>> {
        if tsih == 0 {
            return None;
        }
        let key = SessionKey {
            initiator: initiator.to_owned(),
            isid,
            target: target.map(str::to_owned),
        };
        crate::lock(&self.sessions)
            .by_key
            .get(&key)
            .filter(|e| e.tsih == tsih)
            .and_then(|e| e.core.as_ref())
            .and_then(std::sync::Weak::upgrade)
            .and_then(|core| core.into_any().downcast::<C>().ok())
    }
}
