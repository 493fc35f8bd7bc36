//! The limits a block device over a namespace promises (ublk's parameters, NBD's sizes) come
//! from that namespace's Identify data read over the wire: logical block size (FLBAS),
//! largest request (MDTS, and the tag buffer's cap), discard and write zeroes (ONCS), the
//! volatile write cache (VWC), capacity. Checked against `qpath target` namespaces whose
//! answers differ (512 B RAM without a cache, 4 KiB file with one), so a limit taken from
//! anywhere but Identify shows. This machine has no `ublk_drv`: what the kernel then makes of
//! these parameters is checked in the Linux 7.2 guest (`tests/vm/guest/ublk.sh`, "limits").

mod loopback;

use std::time::Duration;

use blockdev::device::{DeviceInfo, wait_live};
use blockdev::spec::HeadSpec;
use uring::ublk::attr;

const NQN: &str = "nqn.2026-11.io.qpath:default";

/// qpath target's MDTS: 8, units of 4 KiB (CAP.MPSMIN 0): 1 MiB.
const TARGET_MDTS_BYTES: u32 = 1 << 20;

fn probe(addr: std::net::SocketAddr, cap: u32) -> DeviceInfo {
    let mut spec = HeadSpec::new(vec![addr.to_string()], NQN);
    spec.reconnect_delay = 1;
    let (ctrls, head) = spec.connect().expect("connect");
    wait_live(&head, Duration::from_secs(10)).unwrap();
    let ctrl_vwc = ctrls[0].identify().vwc & 1 != 0;
    let info = DeviceInfo::probe(&head, cap).expect("Identify Namespace");
    assert_eq!(info.volatile_cache, ctrl_vwc, "VWC of Identify Controller");
    blockdev::spec::disconnect(&ctrls);
    info
}

#[test]
fn a_ram_namespace_512_b_blocks_no_cache_mdts_caps_the_largest_request() {
    let (server, addrs) = loopback::target(1, "64M");
    // A cap above MDTS: MDTS wins. A cap below it: the cap wins.
    let big = probe(addrs[0], 4 << 20);
    assert_eq!(big.max_transfer, TARGET_MDTS_BYTES, "MDTS 8 (1 MiB) bounds a 4 MiB cap");
    let small = probe(addrs[0], 64 << 10);
    assert_eq!(small.max_transfer, 64 << 10);
    assert_eq!((big.size, big.block_shift, big.physical_shift), (64 << 20, 9, 9));
    assert!(big.discard && big.write_zeroes, "ONCS: Dataset Management and Write Zeroes");
    assert!(!big.volatile_cache, "a RAM namespace has no volatile write cache");
    assert_eq!(big.discard_granularity, 512, "no NPDG: one block");

    let p = blockdev::ublk::params::params_of(&big, false).unwrap();
    assert_eq!((p.basic.logical_bs_shift, p.basic.physical_bs_shift), (9, 9));
    assert_eq!(p.basic.max_sectors, TARGET_MDTS_BYTES >> 9, "max sectors = MDTS");
    assert_eq!(p.basic.dev_sectors, (64 << 20) >> 9);
    assert_eq!(p.basic.attrs & attr::VOLATILE_CACHE, 0, "no cache: the block layer sends no flush");
    let d = p.discard.expect("discard and write zeroes offered");
    assert_eq!(d.discard_granularity, 512);
    assert_eq!(d.max_discard_sectors, 65_536, "65,536 blocks of 512 B per Deallocate");
    assert_eq!(d.max_write_zeroes_sectors, 65_536);
    server.shutdown();
}

#[test]
fn a_file_namespace_4_kib_blocks_with_a_volatile_cache() {
    let dir = std::env::temp_dir().join(format!("qpath-limits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let toml = format!(
        "[[port]]\nid = 1\naddr = \"127.0.0.1:0\"\n[[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n\
         [[subsystem.namespace]]\nnsid = 1\nbackend = \"file\"\npath = \"{}\"\nsize = \"32M\"\nblock_size = 4096\n",
        dir.join("ns.img").display()
    );
    let server = target::config::Config::parse(&toml).unwrap().start().expect("target with a file namespace");
    let info = probe(server.local_addr(1).unwrap(), 4 << 20);
    assert_eq!((info.size, info.block_shift, info.physical_shift), (32 << 20, 12, 12));
    assert_eq!(info.max_transfer, TARGET_MDTS_BYTES);
    assert!(info.volatile_cache, "a file namespace has a volatile write cache (the page cache)");
    assert_eq!(info.discard_granularity, 4096, "no NPDG: one 4 KiB block");

    let p = blockdev::ublk::params::params_of(&info, false).unwrap();
    assert_eq!((p.basic.logical_bs_shift, p.basic.physical_bs_shift), (12, 12));
    assert_eq!(p.basic.max_sectors, TARGET_MDTS_BYTES >> 9);
    assert_ne!(p.basic.attrs & attr::VOLATILE_CACHE, 0, "a cache: the block layer sends flushes");
    assert_eq!(p.basic.attrs & attr::READ_ONLY, 0);
    let d = p.discard.expect("discard offered");
    assert_eq!(d.discard_granularity, 4096);
    let ro = blockdev::ublk::params::params_of(&info, true).unwrap();
    assert_ne!(ro.basic.attrs & attr::READ_ONLY, 0, "--read-only");
    server.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}
