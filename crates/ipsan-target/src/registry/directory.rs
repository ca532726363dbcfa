//! What a login asks of the registry (`iscsi_proto::login::Directory`): the target, its
//! policy, CHAP secrets, Seal keys, and the session table for reinstatement.

use super::*;

/// The [`Directory`] one login consults: target lookup, ACLs, CHAP lockouts, session
/// limits, TSIH. Lives for the whole login of one connection.
#[derive(Debug)]
pub struct LoginDirectory {
    pub registry: Arc<Registry>,
    /// The initiator's address, for the CHAP failure backoff.
    pub peer: IpAddr,
    /// (initiator name, target name) as declared in the first request, once consulted.
    pub(super) declared: Mutex<Option<(String, Option<String>)>>,
    /// Whether the target (or discovery) this login asked for requires CHAP.
    chap: std::sync::atomic::AtomicBool,
    /// The CHAP user the login must answer for (the policy it was given).
    chap_user: Mutex<Option<String>>,
    /// The CID the login's requests name (a login joining a session with the CID of one of
    /// its connections reinstates that connection, RFC 7143 §6.3.4).
    pub cid: std::sync::atomic::AtomicU16,
}

impl LoginDirectory {
    #[must_use]
    pub fn new(registry: Arc<Registry>, peer: IpAddr) -> Self {
        Self {
            registry,
            peer,
            declared: Mutex::new(None),
            chap: std::sync::atomic::AtomicBool::new(false),
            chap_user: Mutex::new(None),
            cid: std::sync::atomic::AtomicU16::new(0),
        }
    }

    /// The initiator name the login declared, if the directory was consulted.
    #[must_use]
    pub fn initiator(&self) -> Option<String> {
        crate::lock(&self.declared).as_ref().map(|(i, _)| i.clone())
    }

    /// Whether this login had to pass CHAP (only then does its success clear failures).
    #[must_use]
    pub fn chap_required(&self) -> bool {
        self.chap.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The CHAP user of the policy this login was given (it proved that user's secret once
    /// the login completes), `None` without CHAP.
    #[must_use]
    pub fn chap_user(&self) -> Option<String> {
        crate::lock(&self.chap_user).clone()
    }

    pub(super) fn declare(&self, initiator: &str, target: Option<&str>) {
        *crate::lock(&self.declared) = Some((initiator.to_owned(), target.map(str::to_owned)));
    }

    /// Marks this login as one that must authenticate (CHAP here, or relayed to the remote
    /// target) and records the CHAP user a local CHAP policy binds it to.
    pub(super) fn require_chap(&self, auth: &Auth) {
        match auth {
            Auth::None => {}
            Auth::Chap(p) => {
                self.chap.store(true, std::sync::atomic::Ordering::Relaxed);
                *crate::lock(&self.chap_user) = Some(p.user.clone());
            }
            _ => self.chap.store(true, std::sync::atomic::Ordering::Relaxed),
        }
    }
}

impl Directory for LoginDirectory {
    fn target(
        &self,
        target_name: &str,
        initiator_name: &str,
    ) -> Result<TargetPolicy, LoginFailure> {
        self.declare(initiator_name, Some(target_name));
        let t = self.registry.target(target_name).ok_or_else(|| {
            LoginFailure::new(LoginStatus::NOT_FOUND, format!("no target {target_name}"))
        })?;
        if !t.allows(initiator_name) {
            return Err(LoginFailure::new(
                LoginStatus::AUTHORIZATION_FAILURE,
                format!("{initiator_name} is not on {target_name}'s allow-list"),
            ));
        }
        let auth = t.auth_for(initiator_name)?;
        if !matches!(auth, Auth::None) {
            self.require_chap(&auth);
            self.registry.check_lockout(initiator_name, self.peer)?;
        }
        Ok(TargetPolicy {
            auth,
            portal_group_tag: PORTAL_GROUP_TAG,
            alias: t.alias.clone(),
        })
    }

    fn discovery(&self, initiator_name: &str) -> Result<TargetPolicy, LoginFailure> {
        self.declare(initiator_name, None);
        if !self
            .registry
            .discovery_enabled
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return Err(LoginFailure::new(
                LoginStatus::SESSION_TYPE_NOT_SUPPORTED,
                "discovery sessions are disabled ([discovery] enabled = false)",
            ));
        }
        let auth = self.registry.discovery_auth();
        if matches!(auth, Auth::Chap(_)) {
            self.require_chap(&auth);
            self.registry.check_lockout(initiator_name, self.peer)?;
        }
        Ok(TargetPolicy {
            auth,
            portal_group_tag: PORTAL_GROUP_TAG,
            alias: None,
        })
    }

    fn assign_tsih(
        &mut self,
        _isid: [u8; 6],
        _ini: &str,
        requested: u16,
    ) -> Result<u16, LoginFailure> {
        if requested == 0 {
            // The session quota and the strength check come once the login has proved
            // everything it will (`Registry::admit`, from the connection).
            return Ok(self.registry.allocate_tsih());
        }
        // A login with a TSIH adds a connection to that session (RFC 7143 §5.3.4). Whether
        // that session exists for this initiator, ISID and target, and whether it has room,
        // is decided by the connection once the login proved everything it will (Seal's
        // confirmation is checked after this call): until then a join to a full session, to a
        // session that does not exist and to one with room look alike (`conn/login.rs`).
        Ok(requested)
    }
}
