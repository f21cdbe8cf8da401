//! The testbed's state under `/run/netgap/NAME`: its directory opened and
//! checked, and the hosts file and `params.json` read and written.

use crate::error::io_err;
use crate::{state_dir, Params, TestbedError, STATE_ROOT};
use netgap_core::hosts::HostsFile;
use netgap_workload::confined::Dir;
use std::io;
use std::path::Path;

/// A file of the testbed's state directory, read as every file a user
/// names is (a regular file, bounded).
pub(crate) fn read_state(path: &Path) -> Result<String, netgap_core::files::ReadError> {
    netgap_core::files::read_to_string(path, netgap_core::files::Cap::TESTBED_STATE)
}

/// The hosts file in a testbed's state directory.
const HOSTS_FILE: &str = "hosts.json";
/// The testbed's parameters in its state directory.
const PARAMS_FILE: &str = "params.json";
/// The shared key in a testbed's state directory.
pub(crate) const KEY_FILE: &str = "key";
/// The mode of every file the testbed writes in its state directory. The
/// agents that read the key, and every command that reads the rest, run as
/// root: nothing there is for other users to read.
pub(crate) const STATE_FILE_MODE: u32 = 0o600;
/// The mode of the state root and of each testbed's directory.
const STATE_DIR_MODE: u32 = 0o700;
/// How a refusal names the state root.
pub(crate) const STATE_ROOT_WHAT: &str = "the testbeds' state directory";
/// What a refused state directory tells the operator to do.
pub(crate) const STATE_DIR_REMEDY: &str = "remove it; netgap makes it again, root's with mode 0700";

/// The testbeds' state root (`/run/netgap`), made if missing, opened
/// without following a link and checked to be root's and writable by
/// nobody else.
pub(crate) fn state_root() -> Result<Dir, TestbedError> {
    Ok(Dir::open_base(
        Path::new(STATE_ROOT),
        STATE_ROOT_WHAT,
        STATE_DIR_REMEDY,
        STATE_DIR_MODE,
    )?)
}

/// Testbed `name`'s state directory in the checked `root`, made if
/// missing, opened relative to the root's descriptor and checked the same
/// way: every file of the testbed is made relative to this one.
fn state_in(root: &Dir, name: &str) -> Result<Dir, TestbedError> {
    Ok(root.open_base_at(
        name,
        &format!("testbed {name}'s state directory"),
        STATE_DIR_REMEDY,
        STATE_DIR_MODE,
    )?)
}

/// Testbed `name`'s state directory, opened and checked ([`state_in`]).
pub(crate) fn open_state(name: &str) -> Result<Dir, TestbedError> {
    state_in(&state_root()?, name)
}

/// Refuses, in one line and before anything reads or changes it, a state
/// directory of testbed `name` that is not root's own (another user's, one
/// others can write in, a link): its pid files would name the processes
/// `down` stops, its hosts file the agents a run hands the key to. A
/// missing one is no testbed's.
pub(crate) fn check_state(name: &str) -> Result<(), TestbedError> {
    match std::fs::symlink_metadata(state_dir(name)) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        _ => open_state(name).map(drop),
    }
}

/// Writes `p` as the testbed's `params.json`, replacing the old one
/// whole ([`Dir::replace_file`]).
pub(crate) fn save_params(dir: &Dir, p: &Params) -> Result<(), TestbedError> {
    let text = serde_json::to_string_pretty(p).map_err(|e| TestbedError::Io {
        what: format!("writing {PARAMS_FILE}"),
        source: io::Error::other(e),
    })?;
    dir.replace_file(PARAMS_FILE, (text + "\n").as_bytes(), STATE_FILE_MODE)?;
    Ok(())
}

/// Writes `hosts` as the testbed's hosts file, replacing the old one
/// whole ([`Dir::replace_file`]), so a run that reads it while `testbed
/// set` rewrites it sees the old file or the new one, never half of one,
/// and a link planted at the name is replaced, not written through.
pub(crate) fn save_hosts(dir: &Dir, hosts: &HostsFile) -> Result<(), TestbedError> {
    let text = hosts.to_text().map_err(|e| TestbedError::Io {
        what: format!("writing {HOSTS_FILE}"),
        source: io::Error::other(e),
    })?;
    dir.replace_file(HOSTS_FILE, text.as_bytes(), STATE_FILE_MODE)?;
    Ok(())
}

/// The parameters and hosts file of the running testbed `name`.
pub(crate) fn load_state(name: &str) -> Result<(Params, HostsFile), TestbedError> {
    check_state(name)?;
    let dir = state_dir(name);
    let text = match read_state(&dir.join("params.json")) {
        Ok(t) => t,
        Err(e) if e.is_not_found() => return Err(TestbedError::NotUp(name.to_string())),
        Err(e) => return Err(io_err("reading params.json")(io::Error::other(e))),
    };
    let params: Params = serde_json::from_str(&text).map_err(|e| TestbedError::Io {
        what: "reading params.json".into(),
        source: io::Error::other(e),
    })?;
    let hosts = HostsFile::load(&dir.join("hosts.json")).map_err(|e| TestbedError::Io {
        what: "reading the hosts file".into(),
        source: io::Error::other(e.to_string()),
    })?;
    Ok((params, hosts))
}
