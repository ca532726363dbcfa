//! Unit tests of the MC/S driver's sealed reassignment: an adopted read's data told apart
//! (opened, stale, forged).

use super::command::{open_adopted, Adopted};
use super::*;
use crate::transform::TransformFuture;

/// Keys that open only data made for them (its first byte), as Seal's open only what was
/// sealed under the same connection's keys.
#[derive(Debug)]
struct Keyed(u8);

impl PayloadTransform for Keyed {
    fn wire_len(&self, plain_len: usize) -> Option<usize> {
        Some(plain_len + 1)
    }
    fn outbound(&self, _cmd: CommandInfo, data: Bytes) -> TransformFuture<Bytes> {
        let k = self.0;
        Box::pin(async move { Ok([&[k][..], &data[..]].concat().into()) })
    }
    fn inbound(&self, _cmd: CommandInfo, data: BytesMut) -> TransformFuture<BytesMut> {
        let k = self.0;
        Box::pin(async move {
            match data.first() {
                Some(&b) if b == k => Ok(BytesMut::from(&data[1..])),
                _ => Err(Error::Transform("refused".into())),
            }
        })
    }
}

fn info() -> CommandInfo {
    CommandInfo {
        lun: 0,
        lba: 0,
        blocks: 1,
        opcode: 0x88,
        itt: 7,
    }
}

fn keys(k: u8) -> Arc<dyn PayloadTransform> {
    Arc::new(Keyed(k))
}

#[tokio::test]
async fn accepts_an_adopted_reads_data_made_for_its_new_connection() {
    let (new, first) = (keys(2), keys(1));
    let r = open_adopted(info(), BytesMut::from(&[2, 9, 9][..]), &new, &first).await;
    assert!(matches!(&r, Adopted::Opened(d) if d[..] == [9, 9]), "{r:?}");
}

#[tokio::test]
async fn tells_an_adopted_reads_data_sealed_for_its_failed_connection_from_a_forgery() {
    let (new, first) = (keys(2), keys(1));
    // What the target sealed before the reassignment: stale, refused, not a forgery.
    let r = open_adopted(info(), BytesMut::from(&[1, 9, 9][..]), &new, &first).await;
    assert!(matches!(r, Adopted::Stale), "{r:?}");
    // Made under neither connection's keys: a forgery, refused as one.
    let r = open_adopted(info(), BytesMut::from(&[3, 9, 9][..]), &new, &first).await;
    assert!(matches!(r, Adopted::Forged), "{r:?}");
    // Completed where it was first sent (no other keys to tell it by): a forgery.
    let r = open_adopted(info(), BytesMut::from(&[3, 9, 9][..]), &first, &first).await;
    assert!(matches!(r, Adopted::Forged), "{r:?}");
}
