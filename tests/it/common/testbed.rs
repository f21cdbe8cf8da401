//! A namespace testbed for one test: built with `netgap testbed up` under
//! the test's own `--name` (so tests run side by side), and taken down when
//! the guard goes, even when the test fails.

use super::{netgap, ok, read_records, u};
use netgap::cluster::HostsFile;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A testbed that is taken down when the guard goes, even on a panic.
pub(crate) struct Testbed {
    /// Its `--name`.
    pub name: String,
}

impl Testbed {
    /// Builds testbed `name` with `flags` (after taking down the leftovers
    /// of an earlier, killed run); the guard and what `up` printed.
    pub(crate) fn up(name: &str, flags: &[&str]) -> (Testbed, String) {
        let tb = Testbed { name: name.into() };
        let _ = netgap().args(["testbed", "down", "--name", name]).output();
        let out = netgap()
            .args(["testbed", "up", "--name", name])
            .args(flags)
            .output()
            .expect("testbed up");
        (tb, ok(out))
    }

    /// Its state directory.
    pub(crate) fn dir(&self) -> PathBuf {
        PathBuf::from("/run/netgap").join(&self.name)
    }

    /// The network namespace of `host`.
    pub(crate) fn ns(&self, host: &str) -> String {
        format!("ngtb-{}-{host}", self.name)
    }

    /// Its hosts file.
    pub(crate) fn hosts_path(&self) -> PathBuf {
        self.dir().join("hosts.json")
    }

    /// `@FILE` for `--hosts`.
    pub(crate) fn hosts_arg(&self) -> String {
        format!("@{}", self.hosts_path().display())
    }

    /// Its hosts file, read.
    pub(crate) fn hosts(&self) -> HostsFile {
        HostsFile::load(&self.hosts_path()).expect("hosts file")
    }

    /// Its agents' shared key.
    pub(crate) fn key(&self) -> PathBuf {
        self.dir().join("key")
    }

    /// The arguments of `netgap relay` on `host` with the relays' key
    /// file `key`: its interface (its end of the links after the first,
    /// which the TCP connections between hosts do not take) and the other
    /// hosts' addresses as the hosts it serves.
    #[cfg(feature = "xdp")]
    pub(crate) fn relay_args(&self, host: &str, key: &Path) -> Vec<String> {
        let hosts = self.hosts();
        let me = hosts.host(host).expect("the host is the testbed's");
        let interface = me
            .links
            .iter()
            .find(|l| l.index == 1)
            .map(|l| l.ifname.clone())
            .expect("a testbed with two links or more");
        let peers: Vec<String> = hosts
            .hosts
            .iter()
            .filter(|h| h.name != host)
            .map(|h| h.address.to_string())
            .collect();
        vec![
            "relay".into(),
            "--interface".into(),
            interface,
            "--peers".into(),
            peers.join(","),
            "--key".into(),
            key.display().to_string(),
        ]
    }

    /// `ip netns exec NS netgap relay ...` for `host`
    /// ([`Testbed::relay_args`]), to be given more flags and spawned.
    #[cfg(feature = "xdp")]
    pub(crate) fn relay_command(&self, host: &str, key: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(host)])
            .arg(super::netgap_path())
            .args(self.relay_args(host, key));
        c
    }

    /// A `netgap relay` in each host's namespace ([`Testbed::relay_args`],
    /// the relays' key file `key`), each logging to `DIR/relay-HOST.log`;
    /// returned once every log says it listens, each with its log. The
    /// relays stop when the guards go. They refuse direct connections
    /// (`--no-direct`): the tests that start them are the relayed path's.
    #[cfg(feature = "xdp")]
    pub(crate) fn start_relays(
        &self,
        key: &Path,
        dir: &Path,
    ) -> Vec<(super::procs::Terminated, PathBuf)> {
        self.start_relays_with(key, dir, &["--no-direct"])
    }

    /// [`Testbed::start_relays`], but relays that grant direct connections.
    #[cfg(feature = "xdp")]
    pub(crate) fn start_direct_relays(
        &self,
        key: &Path,
        dir: &Path,
    ) -> Vec<(super::procs::Terminated, PathBuf)> {
        self.start_relays_with(key, dir, &[])
    }

    /// [`Testbed::start_relays`] with `flags` added to each relay's.
    #[cfg(feature = "xdp")]
    fn start_relays_with(
        &self,
        key: &Path,
        dir: &Path,
        flags: &[&str],
    ) -> Vec<(super::procs::Terminated, PathBuf)> {
        let mut relays = Vec::new();
        for h in &self.hosts().hosts {
            let log = dir.join(format!("relay-{}.log", h.name));
            let child = self
                .relay_command(&h.name, key)
                .args(flags)
                .stdout(std::process::Stdio::null())
                .stderr(std::fs::File::create(&log).expect("a relay log"))
                .spawn()
                .expect("netgap relay");
            relays.push((super::procs::Terminated(child), log));
        }
        for (_, log) in &relays {
            let t0 = std::time::Instant::now();
            loop {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                if text.contains("listening on") {
                    break;
                }
                assert!(
                    t0.elapsed() < std::time::Duration::from_secs(10),
                    "the relay did not come up: {text}"
                );
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        relays
    }

    /// `netgap run TESTS --hosts @FILE FLAGS --json JSON` from the root
    /// namespace; the records.
    pub(crate) fn run(&self, tests: &str, flags: &[&str], json: &Path) -> Vec<Value> {
        ok(netgap()
            .args(["run", tests, "--hosts", &self.hosts_arg()])
            .args(flags)
            .arg("--json")
            .arg(json)
            .output()
            .expect("netgap run"));
        read_records(json)
    }

    /// `netgap testbed down`; what it printed.
    /// The processes in the testbed's namespaces whose command line holds
    /// `needle`, each as `PID COMMAND LINE`: what a run left behind
    /// (processes elsewhere on the machine are not this test's).
    #[cfg(feature = "xdp")]
    pub(crate) fn processes_in(&self, needle: &str) -> Vec<String> {
        let mut left = Vec::new();
        for h in &self.hosts().hosts {
            let out = Command::new("ip")
                .args(["netns", "pids", &self.ns(&h.name)])
                .output()
                .expect("ip netns pids");
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                if cmd.contains(needle) {
                    left.push(format!("{pid} {cmd}"));
                }
            }
        }
        left
    }

    /// No relay, of a run or started by hand, is left in the testbed's
    /// namespaces.
    #[cfg(feature = "xdp")]
    pub(crate) fn assert_no_relay(&self) {
        assert_eq!(
            self.processes_in(" relay "),
            Vec::<String>::new(),
            "relays left"
        );
    }

    /// The relays a run started left in the testbed's namespaces (they
    /// name their limits on the command line; a relay started by hand
    /// does not).
    #[cfg(feature = "xdp")]
    pub(crate) fn run_relays(&self) -> Vec<String> {
        self.processes_in("relay --max-per-uid")
    }

    pub(crate) fn down(&self) -> String {
        ok(netgap()
            .args(["testbed", "down", "--name", &self.name])
            .output()
            .expect("down"))
    }

    /// Nothing of the testbed is left: namespaces (and so their links),
    /// processes, state, its lock file.
    pub(crate) fn assert_gone(&self) {
        let prefix = format!("ngtb-{}-", self.name);
        let list = ok(Command::new("ip")
            .args(["netns", "list"])
            .output()
            .expect("ip netns"));
        assert!(!list.contains(&prefix), "namespaces left: {list}");
        let pgrep = Command::new("pgrep")
            .args(["-f", &format!("/run/netgap/{}/", self.name)])
            .output()
            .expect("pgrep");
        assert!(
            pgrep.stdout.is_empty(),
            "processes left: {}",
            String::from_utf8_lossy(&pgrep.stdout)
        );
        assert!(!self.dir().exists(), "state directory left");
        let lock = PathBuf::from("/run/netgap").join(format!("{}.lock", self.name));
        assert!(!lock.exists(), "lock file left: {}", lock.display());
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        let _ = netgap()
            .args(["testbed", "down", "--name", &self.name])
            .output();
    }
}

/// Bytes sent plus received by interface `dev` of namespace `ns`, from
/// `ip -s link`: what a testbed link really carried.
pub(crate) fn link_bytes(ns: &str, dev: &str) -> u64 {
    let out = ok(Command::new("ip")
        .args(["-n", ns, "-s", "-j", "link", "show", "dev", dev])
        .output()
        .expect("ip -s link"));
    let v: Value = serde_json::from_str(&out).expect("ip -j output");
    let s = &v[0]["stats64"];
    u(&s["tx"]["bytes"]) + u(&s["rx"]["bytes"])
}
