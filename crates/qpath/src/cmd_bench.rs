//! `qpath bench`: argument glue around `bench::cmd`, which holds the logic.

/// `qpath bench`: exits non-zero when a job failed.
pub fn bench(a: &bench::cmd::CmdArgs) -> Result<(), Box<dyn std::error::Error>> {
    let outcome = bench::cmd::bench(a)?;
    if outcome.failed {
        return Err("some jobs failed (see err= in the report)".into());
    }
    Ok(())
}
