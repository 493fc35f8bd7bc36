//! The lab's child processes: a target (`nvmf_tgt` or `qpath target`) started with its
//! reactor pinned, ready once its listener accepts a connection, stopped by its pid before
//! the next one starts; and clients run to completion within a deadline.

use std::fs::File;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use bench::{Error, ErrorKind, Result};

/// A started target must be listening within this long (SPDK maps and zeroes its memory
/// first; the machine may be loaded).
pub const START_WITHIN: Duration = Duration::from_secs(60);
/// A target asked to stop (SIGTERM) must be gone within this long, or it is killed.
pub const STOP_WITHIN: Duration = Duration::from_secs(15);
/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(50);
/// How much of a log an error quotes.
const LOG_TAIL_BYTES: usize = 2000;

/// The last lines of a log file, for an error message.
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let start = text.len().saturating_sub(LOG_TAIL_BYTES);
    let start = (start..=text.len()).find(|i| text.is_char_boundary(*i)).unwrap_or(text.len());
    text[start..].trim().to_string()
}

/// A target running as a child process.
#[derive(Debug)]
pub struct TargetProcess {
    /// "SPDK nvmf_tgt" or "qpath target", for messages.
    pub name: &'static str,
    child: Option<Child>,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its stdout and stderr.
    pub log: PathBuf,
}

impl TargetProcess {
    /// Runs `cmd` (stdout and stderr to `log`) and waits until `addr` accepts a connection
    /// and, when given, `log` holds `ready_line`.
    pub fn start(
        name: &'static str,
        mut cmd: Command,
        addr: SocketAddr,
        log: PathBuf,
        ready_line: Option<&str>,
    ) -> Result<TargetProcess> {
        let out = File::create(&log).map_err(|e| Error::io(format!("create {}", log.display()), e))?;
        let err = out.try_clone().map_err(|e| Error::io(format!("open {}", log.display()), e))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| Error::io(format!("start {name} ({})", cmd.get_program().to_string_lossy()), e))?;
        let mut t = TargetProcess { name, child: Some(child), addr, log };
        t.wait_ready(ready_line)?;
        Ok(t)
    }

    fn wait_ready(&mut self, ready_line: Option<&str>) -> Result<()> {
        let deadline = Instant::now() + START_WITHIN;
        loop {
            let child = self.child.as_mut().expect("a started target has its child");
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Err(Error::new(
                    ErrorKind::Target,
                    format!(
                        "{} exited ({status}) before it listened on {}; its log:\n{}",
                        self.name,
                        self.addr,
                        log_tail(&self.log)
                    ),
                ));
            }
            let logged = ready_line.is_none_or(|l| std::fs::read_to_string(&self.log).is_ok_and(|t| t.contains(l)));
            if logged && TcpStream::connect_timeout(&self.addr, Duration::from_secs(1)).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::new(
                    ErrorKind::Target,
                    format!(
                        "{} did not listen on {} within {} s; its log:\n{}",
                        self.name,
                        self.addr,
                        START_WITHIN.as_secs(),
                        log_tail(&self.log)
                    ),
                ));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Its process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether it is still running (an exit is an error: it died under load).
    pub fn check_alive(&mut self) -> Result<()> {
        let child = self.child.as_mut().expect("a running target has its child");
        match child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => {
                self.child = None;
                Err(Error::new(
                    ErrorKind::Target,
                    format!("{} exited ({status}) during the run; its log:\n{}", self.name, log_tail(&self.log)),
                ))
            }
            Err(e) => Err(Error::io(format!("look at {}", self.name), e)),
        }
    }

    /// Stops it by its pid: SIGTERM (SPDK releases its memory files on it), then SIGKILL
    /// after [`STOP_WITHIN`]; returns once it is gone.
    pub fn stop(mut self) -> Result<()> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else { return Ok(()) };
        let pid = child.id().to_string();
        // The crate has no unsafe code for kill(2); the kill command sends the signal to
        // this pid only.
        let _ = Command::new("kill").args(["-TERM", &pid]).stdout(Stdio::null()).stderr(Stdio::null()).status();
        let deadline = Instant::now() + STOP_WITHIN;
        while Instant::now() < deadline {
            match child.try_wait() {
                Ok(Some(_)) => return Ok(()),
                Ok(None) => std::thread::sleep(POLL),
                Err(e) => return Err(Error::io(format!("wait for {}", self.name), e)),
            }
        }
        tracing::warn!(target = self.name, "did not stop within {} s of SIGTERM: killed", STOP_WITHIN.as_secs());
        child.kill().map_err(|e| Error::io(format!("kill {}", self.name), e))?;
        child.wait().map_err(|e| Error::io(format!("wait for {}", self.name), e))?;
        Ok(())
    }
}

impl Drop for TargetProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs `cmd` to its end with stdout to `out` and stderr to `err`, killing it at `within`.
pub fn run_bounded(name: &str, mut cmd: Command, out: &Path, err: &Path, within: Duration) -> Result<ExitStatus> {
    let o = File::create(out).map_err(|e| Error::io(format!("create {}", out.display()), e))?;
    let e = File::create(err).map_err(|e| Error::io(format!("create {}", err.display()), e))?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(o)
        .stderr(e)
        .spawn()
        .map_err(|e| Error::io(format!("start {name} ({})", cmd.get_program().to_string_lossy()), e))?;
    let deadline = Instant::now() + within;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::new(
                    ErrorKind::Engine,
                    format!("{name} did not finish within {} s: killed", within.as_secs()),
                ));
            }
            Err(e) => return Err(Error::io(format!("wait for {name}"), e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bounded_run_is_killed_at_its_deadline() {
        let dir = std::env::temp_dir().join(format!("qpath-lab-spdk-process-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let t = Instant::now();
        let r = run_bounded("sleep", cmd, &dir.join("o"), &dir.join("e"), Duration::from_millis(200));
        assert!(r.unwrap_err().to_string().contains("did not finish within"));
        assert!(t.elapsed() < Duration::from_secs(10));
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo Total : 1; exit 3"]);
        let st = run_bounded("sh", cmd, &dir.join("o"), &dir.join("e"), Duration::from_secs(20)).unwrap();
        assert_eq!(st.code(), Some(3));
        assert_eq!(std::fs::read_to_string(dir.join("o")).unwrap(), "Total : 1\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_target_that_exits_before_listening_is_an_error_with_its_log() {
        let dir = std::env::temp_dir().join(format!("qpath-lab-spdk-exit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo no hugepages here >&2; exit 1"]);
        // Port 1 on loopback: nothing listens there.
        let e = TargetProcess::start("fake", cmd, "127.0.0.1:1".parse().unwrap(), dir.join("log"), None).unwrap_err();
        let s = e.to_string();
        assert!(s.contains("fake exited") && s.contains("no hugepages here"), "{s}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
