//! Scenario: a `SharedRegion` used as a RAM disk by several threads: bounds are enforced,
//! concurrent copies never corrupt disjoint ranges, racing writers to the same bytes leave
//! whole words from one writer, and a ring sends straight from the region.

mod common;

use std::io::Read;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::{drive, loopback_pair, pattern};
use uring::{ErrorKind, Ring, RingConfig, SendMsg, SharedRegion};

const REGION_BYTES: usize = 1 << 20;
const ROUNDS: usize = 2_000;

#[test]
fn bounds_are_enforced() {
    let region = SharedRegion::new(REGION_BYTES).expect("map");
    let mut buf = [0u8; 16];
    let error = region.copy_from_region(REGION_BYTES - 8, &mut buf).expect_err("past the end");
    assert_eq!(error.kind(), ErrorKind::InvalidArgument);
    assert!(region.copy_to_region(REGION_BYTES, &[1]).is_err());
    assert!(region.copy_to_region(REGION_BYTES - 16, &buf).is_ok());
    assert!(region.fill_zero(REGION_BYTES - 1..REGION_BYTES + 1).is_err());
    let region = Arc::new(region);
    let mut msg = SendMsg::new();
    assert!(msg.push_region(&region, REGION_BYTES - 1..REGION_BYTES + 1).is_err());
}

#[test]
fn concurrent_copies_keep_disjoint_ranges_and_tear_only_at_words() {
    let region = Arc::new(SharedRegion::new(REGION_BYTES).expect("map"));
    const SHARED: usize = 512 * 1024;
    const LEN: usize = 4096;
    let writers: Vec<_> = (0..2u8)
        .map(|id| {
            let region = Arc::clone(&region);
            thread::spawn(move || {
                let own = usize::from(id) * 64 * 1024;
                let fill = [id + 1; LEN];
                for round in 0..ROUNDS {
                    let data = pattern(id.wrapping_add(round.to_le_bytes()[0]), LEN);
                    region.copy_to_region(own, &data).expect("own range");
                    let mut back = vec![0u8; LEN];
                    region.copy_from_region(own, &mut back).expect("own range");
                    assert!(back == data, "writer {id} saw its own range change under it");
                    // Both writers race on the same (unaligned) shared bytes.
                    region.copy_to_region(SHARED + 3, &fill).expect("shared range");
                }
            })
        })
        .collect();

    let reader = {
        let region = Arc::clone(&region);
        thread::spawn(move || {
            let mut snapshot = vec![0u8; LEN];
            for _ in 0..ROUNDS {
                region.copy_from_region(SHARED + 3, &mut snapshot).expect("read");
                for &byte in &snapshot {
                    assert!(byte <= 2, "only bytes some writer wrote: {byte}");
                }
            }
        })
    };
    for writer in writers {
        writer.join().expect("writer");
    }
    reader.join().expect("reader");

    // After the race, every aligned word of the shared range comes wholly from one writer.
    let mut after = vec![0u8; LEN];
    region.copy_from_region(SHARED + 3, &mut after).expect("read");
    assert!(after.iter().all(|&b| b == 1 || b == 2));
    let aligned_start = (SHARED + 8) - SHARED - 3; // first byte of the first whole word
    for word in after[aligned_start..].chunks_exact(8) {
        assert!(word.iter().all(|&b| b == word[0]), "torn inside a word: {word:?}");
    }
}

#[test]
fn ring_sends_straight_from_the_region() {
    let region = Arc::new(SharedRegion::new(REGION_BYTES).expect("map"));
    let data = pattern(9, 8192);
    region.copy_to_region(4096, &data).expect("write");
    let (mut client, server) = loopback_pair();
    let mut ring = Ring::new(RingConfig::default()).expect("ring");

    let mut msg = SendMsg::new();
    msg.push_bytes(b"hdr");
    msg.push_region(&region, 4096..4096 + 8192).expect("in bounds");
    let total = msg.len();
    ring.send(server.as_raw_fd(), msg, 1).map_err(|(e, _)| e).expect("send");
    let mut result = None;
    drive(&mut ring, &mut result, Duration::from_secs(10), |_, r, c| *r = Some(c.result), |r| r.is_some());
    assert_eq!(result.and_then(|r| usize::try_from(r).ok()), Some(total));

    let mut got = vec![0u8; total];
    client.read_exact(&mut got).expect("read");
    assert_eq!(&got[..3], b"hdr");
    assert!(got[3..] == data[..]);
}

/// `copy_for_send` reads what `copy_from_region` reads, at every alignment and length
/// around the word size, and refuses a range past the end the same way.
#[test]
fn copy_for_send_reads_the_same_bytes_as_the_word_copy() {
    let region = SharedRegion::new(1 << 16).expect("region");
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 31 + 7).to_le_bytes()[0]).collect();
    region.copy_to_region(100, &pattern).expect("in");
    for offset in [100usize, 101, 103, 104, 107, 2000] {
        for len in [0usize, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1000] {
            let (mut a, mut b) = (vec![0u8; len], vec![0xffu8; len]);
            region.copy_from_region(offset, &mut a).expect("word copy");
            region.copy_for_send(offset, &mut b).expect("copy for send");
            assert_eq!(a, b, "offset {offset} length {len}");
        }
    }
    let mut buf = [0u8; 16];
    assert!(region.copy_for_send((1 << 16) - 8, &mut buf).is_err(), "past the end");
    assert_eq!(buf, [0u8; 16], "nothing copied when refused");
}
