//! SPDK's client, `spdk_nvme_perf`: its command line for one workload, and the summary
//! it prints at the end (`Total : IOPS MiB/s Average min max`, latencies in µs;
//! SPDK's `app/spdk_nvme_perf/perf.c`, `print_performance`).

use std::net::SocketAddr;

use super::table::{Measure, Workload};
use bench::{Error, ErrorKind, Result};

/// How an SPDK process gets its memory: hugepages, or (without any free) anonymous memory
/// of this many MiB (`--no-huge -s`), which NVMe/TCP can use as it never DMAs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpdkMemory {
    /// The system's free hugepages.
    Huge,
    /// `--no-huge -s MIB`.
    NoHuge {
        /// Memory of the process, MiB.
        mib: u32,
    },
}

impl SpdkMemory {
    /// The options that say so.
    pub fn args(self) -> Vec<String> {
        match self {
            SpdkMemory::Huge => Vec::new(),
            SpdkMemory::NoHuge { mib } => vec!["--no-huge".into(), "-s".into(), mib.to_string()],
        }
    }
}

/// `spdk_nvme_perf`'s arguments for one run of `w` against `addr`/`subnqn`: on `cpu`, for
/// `secs` seconds after `warmup_secs` of warm-up (both whole seconds, as perf takes them).
pub fn args(
    w: &Workload,
    secs: u32,
    warmup_secs: u32,
    cpu: usize,
    addr: SocketAddr,
    subnqn: &str,
    mem: SpdkMemory,
) -> Vec<String> {
    let mut a = vec![
        "-q".to_string(),
        w.qd.to_string(),
        "-o".into(),
        w.bs.to_string(),
        "-w".into(),
        w.pattern.word().into(),
        "-t".into(),
        secs.to_string(),
        "-c".into(),
        core_mask(cpu),
        "-r".into(),
        format!("trtype:TCP adrfam:IPv4 traddr:{} trsvcid:{} subnqn:{subnqn}", addr.ip(), addr.port()),
    ];
    if warmup_secs > 0 {
        a.push("-a".into());
        a.push(warmup_secs.to_string());
    }
    a.extend(mem.args());
    a
}

/// What a TLS run adds to perf's arguments: the host NQN in the transport ID (the PSK is
/// bound to it), SPDK's ssl sockets and the PSK file.
pub fn add_tls(args: &mut Vec<String>, hostnqn: &str, psk_file: &std::path::Path) {
    if let Some(i) = args.iter().position(|a| a == "-r")
        && let Some(trid) = args.get_mut(i + 1)
    {
        trid.push_str(&format!(" hostnqn:{hostnqn}"));
    }
    // perf reads its options in order and takes --psk-path only once ssl is the socket.
    args.extend(["-S".into(), "ssl".into(), "--psk-path".into(), psk_file.display().to_string()]);
}

/// An SPDK core mask (`-m` / `-c`) of the one CPU `cpu`.
pub fn core_mask(cpu: usize) -> String {
    // A u128 mask covers the CPUs a lab runs on; larger indexes are refused by the caller.
    format!("0x{:x}", 1u128 << cpu.min(127))
}

/// The `Total` line of perf's summary, as a [`Measure`]. Perf prints one line per
/// namespace and core, then this sum; it prints none when no I/O completed.
pub fn parse_total(stdout: &str) -> Result<Measure> {
    let line =
        stdout.lines().rev().find(|l| l.trim_start().starts_with("Total") && l.contains(':')).ok_or_else(|| {
            Error::new(ErrorKind::Engine, "spdk_nvme_perf printed no \"Total\" line (no I/O completed?)")
        })?;
    let (_, numbers) = line.rsplit_once(':').expect("the line holds a colon");
    let v: Vec<f64> = numbers
        .split_whitespace()
        .map(str::parse::<f64>)
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| Error::new(ErrorKind::Engine, format!("spdk_nvme_perf's total line {line:?}: {e}")))?;
    if v.len() != 5 || v.iter().any(|x| !x.is_finite() || *x < 0.0) {
        return Err(Error::new(
            ErrorKind::Engine,
            format!("spdk_nvme_perf's total line {line:?}: expected IOPS, MiB/s, average, min and max latency"),
        ));
    }
    Ok(Measure { iops: v[0], mib_s: v[1], lat_us: v[2] })
}

#[cfg(test)]
mod tests {
    use super::super::table::WORKLOADS;
    use super::*;

    /// spdk_nvme_perf v24.01's output of `-q 32 -o 4096 -w randread -t 2 -a 1 -c 0x2
    /// --no-huge -s 512` against nvmf_tgt (`-m 0x1 --no-huge -s 1024`) on loopback, as
    /// captured on the loaded 2-CPU machine this lab was written on.
    const CAPTURED: &str = include_str!("perf_sample.txt");

    #[test]
    fn parses_the_total_line_of_a_captured_run() {
        let m = parse_total(CAPTURED).unwrap();
        assert!(m.iops > 1000.0 && m.mib_s > 1.0 && m.lat_us > 1.0, "{m:?}");
        // IOPS of 4 KiB and MiB/s agree, as perf computes one from the other.
        assert!((m.iops * 4096.0 / f64::from(1 << 20) - m.mib_s).abs() < 0.01 * m.mib_s, "{m:?}");
    }

    #[test]
    fn takes_the_total_not_a_device_line() {
        let out = "\
========================================================
                                                                           Latency(us)
Device Information                                                       :       IOPS      MiB/s    Average        min        max
TCP  (addr:127.0.0.1 subnqn:nqn.2026-11.io.qpath:lab) NSID 1 from core  1:   50000.00     195.31     639.50      80.10    2100.00
========================================================
Total                                                                    :   50000.00     195.31     639.52      80.10    2100.00

";
        let m = parse_total(out).unwrap();
        assert_eq!(m, Measure { iops: 50000.0, mib_s: 195.31, lat_us: 639.52 });
    }

    #[test]
    fn refuses_output_without_a_sound_total() {
        assert!(
            parse_total("Initializing NVMe Controllers\nNo valid NVMe controllers or AIO or URING devices found\n")
                .is_err()
        );
        assert!(parse_total("Total : 1.0 2.0 3.0\n").is_err(), "too few numbers");
        assert!(parse_total("Total : 1.0 2.0 nan 4.0 5.0\n").is_err());
        assert!(parse_total("Total : 1.0 -2.0 3.0 4.0 5.0\n").is_err());
    }

    #[test]
    fn builds_the_command_line_of_a_workload() {
        let addr: SocketAddr = "127.0.0.1:4420".parse().unwrap();
        let a = args(&WORKLOADS[4], 5, 1, 1, addr, "nqn.x", SpdkMemory::NoHuge { mib: 512 });
        let s = a.join(" ");
        assert!(s.starts_with("-q 16 -o 131072 -w read -t 5 -c 0x2 -r"), "{s}");
        assert!(a.contains(&"trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4420 subnqn:nqn.x".to_string()), "{s}");
        assert!(s.ends_with("-a 1 --no-huge -s 512"), "{s}");
        let a = args(&WORKLOADS[0], 5, 0, 0, addr, "nqn.x", SpdkMemory::Huge);
        assert!(!a.contains(&"-a".to_string()) && a.contains(&"0x1".to_string()));
        assert_eq!(core_mask(5), "0x20");
    }

    #[test]
    fn a_tls_run_names_its_host_and_key_file() {
        let addr: SocketAddr = "127.0.0.1:4420".parse().unwrap();
        let mut a = args(&WORKLOADS[0], 5, 0, 0, addr, "nqn.x", SpdkMemory::Huge);
        add_tls(&mut a, "nqn.h", std::path::Path::new("/d/tls.psk"));
        let r = a.iter().position(|x| x == "-r").unwrap();
        assert!(a[r + 1].ends_with("subnqn:nqn.x hostnqn:nqn.h"), "{a:?}");
        assert!(a.ends_with(&["-S", "ssl", "--psk-path", "/d/tls.psk"].map(String::from)), "{a:?}");
    }
}
