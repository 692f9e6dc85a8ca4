//! `autokernel worker` (hidden from `--help`): the far end of `tune --isolation process`.
//!
//! The tuner starts this binary as `autokernel worker --threads T`, sends one JSON request per
//! line on stdin and reads one reply per line on stdout (protocol: `runner::worker`). A
//! candidate that crashes, hangs or exhausts the memory limit takes only this process down;
//! the tuner records it and starts a fresh worker.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

#[derive(Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    threads: crate::ThreadsArg,
}

pub fn run(args: WorkerArgs) -> anyhow::Result<ExitCode> {
    args.threads.apply()?;
    runner::worker::serve_stdio(&|name| kernels::kernel(name).ok())
        .context("serving the worker protocol")?;
    Ok(ExitCode::SUCCESS)
}
