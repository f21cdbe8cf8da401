//! The switch a run changes conditions through ([`TestbedSwitch`]), the
//! conditions put back on an interrupt, and a study's own testbed
//! ([`OwnedTestbed`]).

use crate::command::preflight;
use crate::down::teardown;
use crate::layout::link_ends;
use crate::request::check_name;
use crate::state::load_state;
use crate::up::{up_as, RatePolicy};
use crate::{
    live, set_conditions, state_dir, AgentProbe, InterruptError, Status, TestbedError, TestbedLock,
    UpNote, UpRequest,
};
use netgap_core::link::LinkConditions;
use std::io;
use std::path::PathBuf;

/// What a run found on a testbed's links when it opened its switch: the
/// conditions its hosts file recorded and every link end as the kernel had
/// it. Restoring puts back exactly this.
#[derive(Debug, Clone)]
struct Found {
    name: String,
    conditions: LinkConditions,
    links: Vec<live::EndState>,
}

impl Found {
    /// Puts the links back as found: the recorded conditions (MTU, queueing
    /// disciplines, the hosts file), then each end's offloads feature by
    /// feature where they still differ.
    fn put_back(&self) -> Result<(), TestbedError> {
        set_conditions(&self.name, &self.conditions)?;
        live::restore_snapshot(&self.links)
    }
}

/// The testbed links a run has changed and not yet put back, for the
/// interrupt handler; every switch and restore holds this lock, so an
/// interrupt waits for a switch under way before it puts the links back.
static HELD: std::sync::Mutex<Option<Found>> = std::sync::Mutex::new(None);

/// The write end of the pipe the interrupt handler wakes its thread
/// through; -1 until [`restore_on_interrupt`] installs it.
static WAKE_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

extern "C" fn on_interrupt(_signal: libc::c_int) {
    let fd = WAKE_FD.load(std::sync::atomic::Ordering::Relaxed);
    if fd >= 0 {
        let byte = 1u8;
        // SAFETY: write is async-signal-safe; `byte` lives for the call and
        // `fd` is the pipe's write end, open for the life of the process.
        unsafe {
            libc::write(fd, std::ptr::from_ref(&byte).cast(), 1);
        }
    }
}

/// Makes Ctrl-C (SIGINT), SIGTERM and SIGHUP put back the links a run has
/// changed before the process exits (status 130). Installed once, when the
/// first switch opens; until a run holds links, an interrupt only exits.
fn restore_on_interrupt() -> Result<(), TestbedError> {
    static ONCE: std::sync::OnceLock<Result<(), InterruptError>> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|source| InterruptError::Pipe { source })?;
        std::thread::Builder::new()
            .name("interrupt".into())
            .spawn(move || {
                let mut file = std::fs::File::from(read);
                let mut byte = [0u8; 1];
                let _ = io::Read::read(&mut file, &mut byte);
                let held = HELD
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Some(found) = held.as_ref() {
                    eprintln!(
                        "netgap: interrupted: putting testbed {}'s links back as they were",
                        found.name
                    );
                    if let Err(e) = found.put_back() {
                        eprintln!("netgap: error: the links could not be put back: {e}");
                    }
                }
                let owned = OWNED
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Some(name) = owned.as_ref() {
                    eprintln!("netgap: interrupted: taking testbed {name} down");
                    if let Err(e) = teardown(name) {
                        eprintln!("netgap: error: testbed {name} could not be taken down: {e}");
                    }
                }
                std::process::exit(130);
            })
            .map_err(|e| InterruptError::Thread {
                source: std::sync::Arc::new(e),
            })?;
        WAKE_FD.store(
            std::os::fd::IntoRawFd::into_raw_fd(write),
            std::sync::atomic::Ordering::Relaxed,
        );
        let action = nix::sys::signal::SigAction::new(
            nix::sys::signal::SigHandler::Handler(on_interrupt),
            nix::sys::signal::SaFlags::SA_RESTART,
            nix::sys::signal::SigSet::empty(),
        );
        for sig in [
            nix::sys::signal::Signal::SIGINT,
            nix::sys::signal::Signal::SIGTERM,
            nix::sys::signal::Signal::SIGHUP,
        ] {
            // SAFETY: the handler only loads an atomic and calls write(2),
            // both async-signal-safe.
            unsafe { nix::sys::signal::sigaction(sig, &action) }.map_err(|source| {
                InterruptError::Signal {
                    signal: sig,
                    source,
                }
            })?;
        }
        Ok(())
    })
    .clone()
    .map_err(TestbedError::from)
}

/// The switch of a running testbed's conditions: what a run with
/// `--conditions` switches the links with, through [`set_conditions`]
/// (the binary hands it to the measurement crate as its
/// `ConditionSwitch`). It reads the links' live state when opened, and its
/// restore (and an interrupt while it holds the links) puts back exactly
/// that.
pub struct TestbedSwitch {
    found: Found,
    /// The testbed's lock, held while the run may switch its links.
    _lock: TestbedLock,
}

impl TestbedSwitch {
    /// The switch of testbed `name`; needs root and the testbed up.
    pub fn open(name: &str) -> Result<TestbedSwitch, TestbedError> {
        check_name(name)?;
        preflight()?;
        let lock = TestbedLock::acquire(name, "netgap run --conditions")?;
        let (params, hosts) = load_state(name)?;
        let found = Found {
            name: name.to_string(),
            conditions: hosts.conditions.unwrap_or_else(|| params.conditions()),
            links: live::read(&link_ends(name, &params))?,
        };
        restore_on_interrupt()?;
        Ok(TestbedSwitch { found, _lock: lock })
    }
}

impl TestbedSwitch {
    /// Puts every link under `to` (the whole state, not a change),
    /// rewriting the hosts file; returns the conditions as applied (the
    /// shaper's bucket and what drops a loss).
    pub fn switch(&mut self, to: &LinkConditions) -> Result<LinkConditions, TestbedError> {
        let mut held = HELD
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        held.get_or_insert_with(|| self.found.clone());
        set_conditions(&self.found.name, to)
    }

    /// Puts the links back exactly as they were when the switch was
    /// opened, whatever was switched since.
    pub fn restore(&mut self) -> Result<(), TestbedError> {
        let mut held = HELD
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.found.put_back()?;
        *held = None;
        Ok(())
    }
}

/// The testbed a command built for itself and takes down when done
/// ([`OwnedTestbed`]), for the interrupt handler.
static OWNED: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// A testbed a command builds for its own run (`netgap study`): brought up
/// with [`up`](crate::up) under the testbed's lock, and taken down when the
/// guard is dropped (on success, on error) or on Ctrl-C, SIGTERM or SIGHUP,
/// which take it down before the process exits. The lock is released after the
/// teardown, so no other command builds the testbed while it goes.
pub struct OwnedTestbed {
    name: String,
    /// Dropped after [`Drop::drop`] has taken the testbed down.
    lock: TestbedLock,
}

impl OwnedTestbed {
    /// Builds testbed `req.name` for `command` (taking down what an
    /// earlier, killed run left under that name) and holds it; refuses,
    /// changing nothing, when another process holds the testbed.
    pub fn up(
        req: &UpRequest,
        command: &str,
        probe: &dyn AgentProbe,
        notes: &mut dyn FnMut(UpNote),
    ) -> Result<(OwnedTestbed, Status), TestbedError> {
        req.params()?;
        preflight()?;
        let name = req.name.clone();
        let lock = TestbedLock::acquire(&name, command)?;
        restore_on_interrupt()?;
        teardown(&name)?;
        *OWNED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(name.clone());
        let guard = OwnedTestbed { name, lock };
        let status = up_as(req, RatePolicy::Scale, probe, notes)?;
        Ok((guard, status))
    }

    /// Its hosts file.
    pub fn hosts_file(&self) -> PathBuf {
        state_dir(&self.name).join("hosts.json")
    }
}

impl Drop for OwnedTestbed {
    fn drop(&mut self) {
        let mut owned = OWNED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match teardown(&self.name) {
            Ok(_) => self.lock.remove_file_on_release(),
            Err(e) => eprintln!(
                "netgap: error: testbed {} could not be taken down: {e}",
                self.name
            ),
        }
        *owned = None;
    }
}
