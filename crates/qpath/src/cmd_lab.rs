//! `qpath lab`: argument glue around the `lab` crate, which holds the labs.

/// Arguments of `qpath lab`.
#[derive(clap::Args, Debug)]
pub struct LabArgs {
    #[command(subcommand)]
    command: LabCommand,
}

#[derive(clap::Subcommand, Debug)]
enum LabCommand {
    /// Path flaps that lose nothing: a 4k randwrite with crc32c verify through a 2-path
    /// head while one path goes down (5 s every 10 s), then a read-back.
    ///
    /// The outage is a link loss (veth in network namespaces), port faults or ANA flips by
    /// RPC, or Linux nvmet.
    Flaps(lab::flaps::FlapsArgs),
    /// The machine's physical baseline: raw loopback TCP ping-pong and stream.
    ///
    /// A ping-pong of a 4 KiB read's shape (72-byte request, 4,144-byte reply) and a
    /// stream of 128 KiB writes.
    Baseline(lab::LabBaselineArgs),
    /// QD1 4k reads next to a QD64 flood on the same target reactor.
    ///
    /// Without fairness budgets and with the defaults (QD1 p99 with the flood / alone,
    /// goal <= 2x).
    Fairness(lab::fairness::FairnessArgs),
    /// QD1 4k reads on a target reactor while another host authenticates (ffdhe8192).
    ///
    /// The DH-HMAC-CHAP steps run on the reactor (as before) and on the target's workers.
    #[command(name = "auth-stall")]
    AuthStall(lab::auth_stall::AuthStallArgs),
    /// A host's DH-HMAC-CHAP connects while another floods the target's DH workers.
    ///
    /// The flooding host sends Negotiates (ffdhe8192) and hangs up on them.
    #[command(name = "auth-flood")]
    AuthFlood(lab::auth_flood::AuthFloodArgs),
    /// WAL writes next to random-read hogs on one host-wide tag set of 170.
    ///
    /// Without fairness, with each fairness policy, and with per-device tag sets
    /// (examples/seed-003-wal-and-hogs.fio).
    #[command(name = "seed-003")]
    Seed003(lab::seed_003::Seed003Args),
    /// 512 KiB random reads at QD1 over two paths under each path policy.
    ///
    /// And under the two reference selectors of examples/seed-000-qd1-512k-randread.fio:
    /// submission latency, IOPS, per-path counts.
    #[command(name = "seed-000")]
    Seed000(lab::seed_000::Seed000Args),
    /// One of two paths delayed +2 ms: 4k random reads under each path policy.
    ///
    /// Round-robin, queue-depth and latency: IOPS and per-path counts.
    #[command(name = "mpath-delay")]
    MpathDelay(lab::mpath_delay::MpathDelayArgs),
    /// 512 B and 4 KiB random reads at iodepth 128 on one core: block path vs queue pair.
    ///
    /// Through the block path and through a user-owned queue pair, same run
    /// (examples/seed-001-passthru-randread.fio).
    #[command(name = "seed-001")]
    Seed001(lab::seed_001::Seed001Args),
    /// Per-stream 4k random reads at iodepth 64 over 1, N and N queues on N contexts.
    ///
    /// Over 1 I/O queue, N queues on one completion context, and N queues on N contexts
    /// (examples/seed-004-per-cpu-randread.fio).
    #[command(name = "seed-004")]
    Seed004(lab::seed_004::Seed004Args),
    /// tiobench-style 4k writes and reads over 1, 2 and 4 subsystems of 2 paths each.
    ///
    /// Sequential and random: aggregate MiB/s, I/O errors and reconnects
    /// (examples/seed-002-tiobench.fio).
    #[command(name = "seed-002")]
    Seed002(lab::seed_002::Seed002Args),
    /// qpath side by side with SPDK: perf and qpath bench against nvmf_tgt and qpath target.
    ///
    /// One target at a time (reactor busy-polling on CPU 0, client on CPU 1, 256 MiB RAM
    /// namespace): 4k random reads at QD1, 32 and 128, 4k random writes at QD32, 128k reads
    /// at QD16; medians over alternating rounds, their spread, and the ratios against SPDK
    /// with PASS/FAIL. SPDK is your own build (--spdk-dir); without it only the qpath
    /// column runs, and the report says why.
    Spdk(lab::spdk::SpdkArgs),
}

/// `qpath lab ...`.
pub fn run(a: &LabArgs) -> Result<(), Box<dyn std::error::Error>> {
    match &a.command {
        LabCommand::Flaps(f) => match lab::flaps::run(f)? {
            lab::flaps::FlapsOutcome::Skipped(why) => println!("SKIP: {why}"),
            lab::flaps::FlapsOutcome::Ran(r) => {
                r.emit(&f.output)?;
                let lost = lab::flaps::losses(&r);
                if lost > 0 {
                    return Err(format!("flaps: {lost} I/O errors, verify failures or blocks not read back").into());
                }
            }
        },
        LabCommand::Baseline(b) => {
            lab::baseline(b, &mut std::io::stdout())?;
        }
        LabCommand::Fairness(f) => {
            let r = lab::fairness::lab(f)?;
            let errors = lab::fairness::total_errors(&r);
            if errors > 0 {
                return Err(format!("fairness: {errors} I/O errors").into());
            }
        }
        LabCommand::AuthStall(s) => {
            let r = lab::auth_stall::lab(s)?;
            let errors = lab::auth_stall::total_errors(&r);
            if errors > 0 {
                return Err(format!("auth-stall: {errors} failed reads or connects").into());
            }
        }
        LabCommand::AuthFlood(s) => {
            let r = lab::auth_flood::lab(s)?;
            let errors = lab::auth_flood::total_errors(&r);
            if errors > 0 {
                return Err(format!("auth-flood: {errors} failed connects").into());
            }
        }
        LabCommand::Seed000(s) => {
            let r = lab::seed_000::lab(s)?;
            let errors = lab::seed_000::total_errors(&r);
            if errors > 0 {
                return Err(format!("seed-000: {errors} cases with I/O errors").into());
            }
        }
        LabCommand::MpathDelay(s) => {
            let r = lab::mpath_delay::lab(s)?;
            let errors = lab::seed_000::total_errors(&r);
            if errors > 0 {
                return Err(format!("mpath-delay: {errors} cases with I/O errors").into());
            }
        }
        LabCommand::Seed003(s) => {
            let r = lab::seed_003::lab(s)?;
            let errors = lab::seed_003::total_errors(&r);
            if errors > 0 {
                return Err(format!("seed-003: {errors} I/O errors").into());
            }
        }
        LabCommand::Seed002(s) => {
            let r = lab::seed_002::lab(s)?;
            let errors = lab::seed_002::total_errors(&r);
            if errors > 0 {
                return Err(format!("seed-002: {errors} I/O errors, job errors, reconnects or failed queues").into());
            }
        }
        LabCommand::Seed001(s) => {
            let r = lab::seed_001::lab(s)?;
            let errors = lab::seed_001::total_errors(&r);
            if errors > 0 {
                return Err(format!("seed-001: {errors} I/O errors").into());
            }
        }
        LabCommand::Spdk(s) => {
            let exe = std::env::current_exe().map_err(|e| format!("spdk: where this qpath program is: {e}"))?;
            lab::spdk::lab(s, &exe)?;
        }
        LabCommand::Seed004(s) => {
            let r = lab::seed_004::lab(s)?;
            let errors = lab::seed_004::total_errors(&r);
            if errors > 0 {
                return Err(format!("seed-004: {errors} I/O errors").into());
            }
        }
    }
    Ok(())
}
