//! Seal on the initiator (docs/seal.md): the login extension that negotiates and confirms the
//! keys, and the payload transform that seals every command's data-out and opens its data-in.
//!
//! With a [`CryptoPool`] the transform runs on worker threads, so the next commands are sealed
//! while earlier ones wait for their round trip — the papers' "pre-processing". Without one
//! (`--pipeline off`) it seals inline, the papers' "without optimization" cycle.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use ipsan_seal::{
    is_seal_key, Binding, Cipher, CryptoPool, Direction, InitiatorNegotiation, LoginTranscript,
    Psk, SealSession, SessionIds,
};
use iscsi_proto::login::ExtensionContext;

use crate::error::Error;
use crate::login::{OriginatorExtension, RecordLayer};
use crate::scsi::{Sense, SenseKey};
use crate::session::ExtensionFactory;
use crate::transform::{CommandInfo, PayloadTransform, TransformFuture};
use iscsi_proto::login::originator;

/// What `ipsan bench --seal` asks for.
#[derive(Clone)]
pub struct SealRequest {
    pub ciphers: Vec<Cipher>,
    pub chunk: u32,
    pub psk: Psk,
    /// `None`: seal inline (pipeline off).
    pub pool: Option<Arc<CryptoPool>>,
}

impl std::fmt::Debug for SealRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealRequest")
            .field("ciphers", &self.ciphers)
            .field("chunk", &self.chunk)
            .field("pipeline", &self.pool.is_some())
            .finish_non_exhaustive()
    }
}

impl SealRequest {
    /// A factory that makes a fresh negotiation (fresh nonces) for each login attempt.
    #[must_use]
    pub fn factory(self) -> ExtensionFactory {
        self.factory_with_compression(false)
    }

    /// [`SealRequest::factory`] that also offers compression (`X-org.ipsan.Compression`,
    /// docs/seal.md §4b): on when the target agrees, off otherwise.
    #[must_use]
    pub fn factory_with_compression(self, compress: bool) -> ExtensionFactory {
        ExtensionFactory(Arc::new(move || {
            Box::new(SealOriginator {
                neg: InitiatorNegotiation::new(self.ciphers.clone(), self.chunk, self.psk.clone())
                    .with_compression(compress),
                pool: self.pool.clone(),
                session: None,
                transcript: LoginTranscript::new(),
            })
        }))
    }
}

/// The originator side of Seal's login keys.
#[derive(Debug)]
struct SealOriginator {
    neg: InitiatorNegotiation,
    pool: Option<Arc<CryptoPool>>,
    session: Option<Arc<SealSession>>,
    /// Every Login PDU so far, as the login exchange showed them.
    transcript: LoginTranscript,
}

fn ids(ctx: &ExtensionContext<'_>) -> SessionIds {
    SessionIds {
        initiator_name: ctx.initiator_name.to_owned(),
        target_name: ctx.target_name.unwrap_or_default().to_owned(),
        isid: ctx.isid,
    }
}

impl originator::OriginatorExtension for SealOriginator {
    fn handles(&self, key: &str) -> bool {
        is_seal_key(key)
    }

    fn offer(
        &mut self,
        ctx: &ExtensionContext<'_>,
    ) -> std::result::Result<Vec<(String, String)>, String> {
        self.neg.offer(&ids(ctx)).map_err(|e| e.to_string())
    }

    fn on_answer(
        &mut self,
        keys: &[(String, String)],
        _ctx: &ExtensionContext<'_>,
    ) -> std::result::Result<Vec<(String, String)>, String> {
        self.neg
            .on_answer(keys, &self.transcript)
            .map_err(|e| e.to_string())
    }

    fn finish(&mut self, _ctx: &ExtensionContext<'_>) -> std::result::Result<(), String> {
        self.neg.finish().map_err(|e| e.to_string())?;
        // Asked for Seal and the target did not agree: never fall back to plaintext.
        let s = self
            .neg
            .take_session()
            .ok_or("the target did not agree to Seal")?;
        self.session = Some(Arc::new(s));
        Ok(())
    }

    fn needs_second_request(&self) -> bool {
        true
    }

    fn observe_pdu(&mut self, dir: originator::PduDir, pdu: &iscsi_wire::Pdu) {
        match dir {
            originator::PduDir::Sent => self.transcript.add_sent(Direction::InitiatorToTarget, pdu),
            originator::PduDir::Received => {
                self.transcript
                    .add_received(Direction::TargetToInitiator, pdu);
            }
        }
    }
}

impl OriginatorExtension for SealOriginator {
    fn transform(&mut self) -> Option<Arc<dyn PayloadTransform>> {
        let session = self.session.clone()?;
        Some(Arc::new(SealTransform {
            session,
            pool: self.pool.clone(),
        }))
    }

    fn record_layer(&mut self) -> Option<std::result::Result<RecordLayer, String>> {
        let session = self.session.as_ref()?;
        Some(
            session
                .record_layer(&self.transcript.hash())
                .map_err(|e| e.to_string()),
        )
    }
}

/// Seals data-out and opens data-in of every command.
#[derive(Debug)]
pub struct SealTransform {
    session: Arc<SealSession>,
    pool: Option<Arc<CryptoPool>>,
}

impl SealTransform {
    /// The negotiated session (cipher, counters, statistics).
    #[must_use]
    pub fn session(&self) -> &Arc<SealSession> {
        &self.session
    }
}

fn binding(cmd: CommandInfo) -> Binding {
    Binding {
        lun: cmd.lun,
        lba: cmd.lba,
        blocks: cmd.blocks,
        opcode: cmd.opcode,
        task_tag: cmd.itt,
    }
}

/// The error a caller sees for data that failed to open: the same sense triple the target
/// uses (docs/seal.md §5), so callers handle both alike. No data is returned.
fn refused(e: &ipsan_seal::OpenError, log: bool) -> Error {
    if log {
        tracing::warn!("seal: data-in refused: {e}");
    }
    Error::Scsi {
        status: ipsan_seal::sense::STATUS,
        sense: Some(Sense::new(
            SenseKey(ipsan_seal::sense::SENSE_KEY),
            ipsan_seal::sense::ASC,
            ipsan_seal::sense::ASCQ,
        )),
    }
}

impl PayloadTransform for SealTransform {
    fn wire_len(&self, plain_len: usize) -> Option<usize> {
        self.session.sealed_len(plain_len)
    }

    fn outbound(&self, cmd: CommandInfo, data: Bytes) -> TransformFuture<Bytes> {
        let session = self.session.clone();
        let pool = self.pool.clone();
        // The caller keeps its plaintext (a retry is sealed afresh), so seal a copy; with a
        // pool the copy runs on the crypto worker, chunk by chunk with the encryption.
        let b = binding(cmd);
        let sealed = pool
            .as_ref()
            .map(|pool| pool.seal_copy(&session, b, data.clone()));
        Box::pin(async move {
            let sealed = match sealed {
                Some(f) => f.await,
                None => session.seal_copy(&b, &data),
            };
            sealed.map_err(|e| Error::Transform(format!("seal: {e}")))
        })
    }

    fn outbound_now(&self, cmd: CommandInfo, data: &Bytes) -> Option<crate::Result<Bytes>> {
        // Fresh counters of this connection's session: never a nonce used before.
        Some(
            self.session
                .seal_copy(&binding(cmd), data)
                .map_err(|e| Error::Transform(format!("seal: {e}"))),
        )
    }

    fn outbound_tail(&self, _cmd: CommandInfo, len: usize) -> Option<crate::Result<Bytes>> {
        // `none`'s tags are zeros whatever the binding: the trailer is the counters and them.
        self.session
            .none_trailer(len)
            .map_err(|e| Error::Transform(format!("seal: {e}")))
            .transpose()
    }

    fn inbound(&self, cmd: CommandInfo, data: BytesMut) -> TransformFuture<BytesMut> {
        self.open(cmd, data, true)
    }

    fn inbound_quiet(&self, cmd: CommandInfo, data: BytesMut) -> TransformFuture<BytesMut> {
        self.open(cmd, data, false)
    }
}

impl SealTransform {
    /// Opens a read's data; `log`: a refusal is logged as the forgery it may be.
    fn open(&self, cmd: CommandInfo, data: BytesMut, log: bool) -> TransformFuture<BytesMut> {
        let session = self.session.clone();
        let pool = self.pool.clone();
        Box::pin(async move {
            let b = binding(cmd);
            let plain = match &pool {
                Some(pool) => pool.open(&session, b, data).await,
                None => session.open(&b, data),
            };
            plain.map(BytesMut::from).map_err(|e| refused(&e, log))
        })
    }
}
