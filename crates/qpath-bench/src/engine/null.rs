//! fio's `null` engine: an asynchronous engine that completes every I/O at commit
//! without moving data. It measures the cost of the benchmark itself and exercises
//! the queue/commit/getevents path without hardware. Reads leave buffers untouched.

use std::collections::VecDeque;
use std::time::Duration;

use super::{Capabilities, Engine, EngineCtx, EngineFactory, FileInfo, Queued, Ready};
use crate::error::{Error, ErrorKind, Result};
use crate::io_u::{IoResult, IoU};

/// Factory for `ioengine=null`.
#[derive(Debug)]
pub struct NullFactory;

impl EngineFactory for NullFactory {
    fn name(&self) -> &str {
        "null"
    }

    fn create(&self, ctx: &EngineCtx<'_>) -> Result<Box<dyn Engine>> {
        let depth = usize::try_from(ctx.iodepth).unwrap_or(1);
        Ok(Box::new(Null { queued: VecDeque::with_capacity(depth), done: Ready::with_capacity(depth) }))
    }
}

/// Unit indices move queued -> done (at commit) -> caller (handed out at getevents,
/// taken by event).
#[derive(Debug)]
struct Null {
    queued: VecDeque<u32>,
    done: Ready,
}

impl Engine for Null {
    fn name(&self) -> &str {
        "null"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    fn open(&mut self, ctx: &EngineCtx<'_>) -> Result<FileInfo> {
        let size = ctx
            .needed_size
            .ok_or_else(|| Error::new(ErrorKind::Option, "ioengine=null needs size= (there is no file to size it)"))?;
        Ok(FileInfo { size, block_size: 512 })
    }

    fn queue(&mut self, unit: &mut IoU) -> Queued {
        unit.result = IoResult::Done { bytes: unit.len };
        self.queued.push_back(unit.index);
        Queued::Queued
    }

    fn commit(&mut self, _units: &mut [IoU]) -> Result<()> {
        for unit in self.queued.drain(..) {
            self.done.push(unit);
        }
        Ok(())
    }

    fn getevents(&mut self, _units: &mut [IoU], min: usize, max: usize, _timeout: Option<Duration>) -> Result<usize> {
        // Everything committed is complete, so `min` is always met when it can be.
        Ok(self.done.hand_out(min, max))
    }

    fn event(&mut self, index: usize) -> u32 {
        // Events are taken in order 0..n, so the front is always `index`.
        let _ = index;
        self.done.take()
    }
}
