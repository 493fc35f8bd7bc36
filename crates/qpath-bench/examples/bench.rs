//! Run a fio job file with this crate's local engines, as `qpath bench` will:
//!
//! ```text
//! cargo run -p qpath-bench --example bench -- examples/local-file.fio --output-format=json
//! ```

use clap::Parser;
use qpath_bench::{BenchArgs, EngineRegistry, RunOptions};

#[derive(Parser)]
#[command(name = "bench", about = "qpath bench with the local engines only")]
struct Cli {
    #[command(flatten)]
    args: BenchArgs,
}

fn main() {
    let cli = Cli::parse();
    match qpath_bench::run(&cli.args, &EngineRegistry::with_local_engines(), &RunOptions::default()) {
        Ok(outcome) => std::process::exit(i32::from(outcome.failed)),
        Err(e) => {
            eprintln!("qpath bench: {e}");
            std::process::exit(2);
        }
    }
}
