//! The codec measurement behind docs/seal.md §4b (*Why LZ4*): `lz4_flex` (the codec Seal
//! uses) on independent chunks of a file, one core: compression and decompression MB/s of
//! plaintext and the ratio, as Seal runs it (a chunk stored raw when it does not shrink).
//!
//! `cargo run --release -p ipsan-seal --example codec -- FILE [CHUNK] [REPS]`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: codec FILE [CHUNK] [REPS]");
    let chunk: usize = args.next().map_or(65536, |c| c.parse().unwrap());
    let reps: usize = args.next().map_or(3, |r| r.parse().unwrap());
    let data = std::fs::read(&path).unwrap();
    let bound = lz4_flex::block::get_maximum_output_size(chunk);
    let mut out = vec![0u8; bound * data.len().div_ceil(chunk)];
    let mut back = vec![0u8; data.len()];
    for rep in 0..reps {
        // Compress every chunk into its own slot; remember each stored length.
        let t = Instant::now();
        let mut stored = Vec::with_capacity(data.len() / chunk + 1);
        for (i, c) in data.chunks(chunk).enumerate() {
            let slot = &mut out[i * bound..(i + 1) * bound];
            let m = lz4_flex::block::compress_into(c, slot).unwrap();
            stored.push(if m < c.len() { Some(m) } else { None });
        }
        let ct = t.elapsed().as_secs_f64();
        let wire: usize = data
            .chunks(chunk)
            .zip(&stored)
            .map(|(c, s)| s.unwrap_or(c.len()))
            .sum();
        let t = Instant::now();
        for (i, (c, s)) in data.chunks(chunk).zip(&stored).enumerate() {
            let dst = &mut back[i * chunk..i * chunk + c.len()];
            match s {
                Some(m) => {
                    let n = lz4_flex::block::decompress_into(&out[i * bound..i * bound + m], dst)
                        .unwrap();
                    assert_eq!(n, c.len());
                }
                None => dst.copy_from_slice(c),
            }
        }
        let dt = t.elapsed().as_secs_f64();
        assert!(back == data, "round trip");
        let mb = data.len() as f64 / 1e6;
        println!(
            "{path} rep {rep} chunk {chunk}: lz4_flex ratio {:.3} ({} -> {} bytes, {} of {} chunks stored raw), compress {:.0} MB/s, decompress {:.0} MB/s",
            data.len() as f64 / wire as f64,
            data.len(),
            wire,
            stored.iter().filter(|s| s.is_none()).count(),
            stored.len(),
            mb / ct,
            mb / dt
        );
    }
}
