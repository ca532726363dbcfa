//! The sessions a workload runs on ([`BlockIo`]): an iSCSI [`Session`], a session of several
//! connections ([`McsSession`]) and an NVMe/TCP [`NvmeSession`].

use super::*;

/// What a workload runs on: a block device reached through an initiator session.
pub trait BlockIo: Send + Sync + 'static {
    /// The device's size, if known.
    fn capacity(&self) -> Option<Capacity>;
    /// Reads `blocks` blocks at `lba`, into `buf` (cleared first) or, when the transport
    /// received the data in one piece (NVMe/TCP: one C2HData PDU), as that piece.
    fn read_into(
        &self,
        lba: u64,
        blocks: u32,
        buf: BytesMut,
    ) -> impl std::future::Future<Output = Result<Bytes, Error>> + Send;
    /// Whether [`BlockIo::read_discard`] drops the data as it arrives (`--sink discard`).
    fn drops_data(&self) -> bool {
        false
    }
    /// Reads `blocks` blocks at `lba` and keeps none of the data: checked, counted and dropped
    /// as it arrives where [`BlockIo::drops_data`]; the default reads it and drops it after.
    fn read_discard(
        &self,
        lba: u64,
        blocks: u32,
    ) -> impl std::future::Future<Output = Result<(), Error>> + Send {
        async move {
            self.read_into(lba, blocks, BytesMut::new()).await?;
            Ok(())
        }
    }
    /// Writes `data` at `lba`.
    fn write(
        &self,
        lba: u64,
        data: Bytes,
    ) -> impl std::future::Future<Output = Result<(), Error>> + Send;
}

impl BlockIo for Session {
    fn capacity(&self) -> Option<Capacity> {
        Session::capacity(self)
    }
    async fn read_into(&self, lba: u64, blocks: u32, buf: BytesMut) -> Result<Bytes, Error> {
        Ok(Session::read_into(self, lba, blocks, buf).await?.freeze())
    }
    fn drops_data(&self) -> bool {
        true
    }
    fn read_discard(
        &self,
        lba: u64,
        blocks: u32,
    ) -> impl std::future::Future<Output = Result<(), Error>> + Send {
        Session::read_discard(self, lba, blocks)
    }
    fn write(
        &self,
        lba: u64,
        data: Bytes,
    ) -> impl std::future::Future<Output = Result<(), Error>> + Send {
        Session::write(self, lba, data)
    }
}

impl BlockIo for McsSession {
    fn capacity(&self) -> Option<Capacity> {
        McsSession::capacity(self)
    }
    async fn read_into(&self, lba: u64, blocks: u32, buf: BytesMut) -> Result<Bytes, Error> {
        Ok(McsSession::read_into(self, lba, blocks, buf)
            .await?
            .freeze())
    }
    fn drops_data(&self) -> bool {
        true
    }
    fn read_discard(
        &self,
        lba: u64,
        blocks: u32,
    ) -> impl std::future::Future<Output = Result<(), Error>> + Send {
        McsSession::read_discard(self, lba, blocks)
    }
    fn write(
        &self,
        lba: u64,
        data: Bytes,
    ) -> impl std::future::Future<Output = Result<(), Error>> + Send {
        McsSession::write(self, lba, data)
    }
}

impl BlockIo for NvmeSession {
    fn capacity(&self) -> Option<Capacity> {
        NvmeSession::capacity(self)
    }
    async fn read_into(&self, lba: u64, blocks: u32, buf: BytesMut) -> Result<Bytes, Error> {
        Ok(NvmeSession::read_into(self, lba, blocks, buf).await?)
    }
    async fn write(&self, lba: u64, data: Bytes) -> Result<(), Error> {
        Ok(NvmeSession::write(self, lba, data).await?)
    }
}
