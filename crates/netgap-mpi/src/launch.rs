//! Starting the two ranks with mpirun and reading rank 0's lines.
//!
//! On this machine the ranks meet over shared memory (Open MPI's `vader`
//! BTL), or with `--mpi-btl tcp` over TCP on loopback. On the testbed, mpirun itself runs inside rank 0's host (its
//! network namespace, and a UTS namespace named after the host so Open MPI
//! tells the hosts apart), and reaches rank 1's host through a launch agent
//! (`plm_rsh_agent`) that is netgap itself: `netgap mpi-agent HOST CMD...`
//! enters that host's namespaces and runs the command as ssh would, through
//! `sh -c`. Both the MPI traffic (`btl tcp,self`, so shared memory cannot
//! bypass the network) and mpirun's own out-of-band channel are pinned to
//! the testbed interface, so everything crosses the testbed's links.
//!
//! netgap passes its own Open MPI parameters on mpirun's command line,
//! which overrides the environment: an `OMPI_MCA_*` variable naming one of
//! them is refused before the job starts, and every other is left to Open
//! MPI and named in the record. The BTLs the ranks really used come from
//! the library's own report (`btl_base_verbose`) on mpirun's standard
//! error ([`Selection`]).

use crate::wire::{parse_line, RankLine, RankPlan, WireError, MAX_LINE_BYTES};
use netgap_workload::tether;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The environment variable that tells the launch agent which namespace
/// each host address lives in: `ADDR=NETNS=NAME` entries joined by `;`.
pub const HOSTS_ENV: &str = "NETGAP_MPI_HOSTS";
/// Lines of mpirun's standard error kept for the error message.
const STDERR_TAIL_LINES: usize = 20;

/// Why the ranks could not be started or followed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// mpirun could not be started.
    #[error("cannot start {program}: {source} (install Open MPI: apt-get install openmpi-bin)")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// mpirun ended before the ranks finished.
    #[error("mpirun ended ({status}) before the ranks finished{detail}")]
    Ended {
        /// Its exit status.
        status: String,
        /// The end of its standard error, after a colon.
        detail: String,
    },
    /// Rank 0 said nothing for too long.
    #[error("rank 0 sent nothing for {waited:?}; the job was stopped{detail}")]
    Silent {
        /// How long the launch waited.
        waited: Duration,
        /// How far the job had come and the end of mpirun's standard
        /// error, after a semicolon.
        detail: String,
    },
    /// Rank 0 wrote a line that does not parse or is out of range.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The current executable could not be found.
    #[error("cannot find this netgap executable: {0}")]
    Exe(std::io::Error),
    /// The testbed interface of a host could not be found.
    #[error("host {host}: {detail}")]
    Interface {
        /// The host.
        host: String,
        /// What went wrong.
        detail: String,
    },
    /// A namespace could not be entered, or the command not run.
    #[error("{0}")]
    Exec(String),
}

/// One testbed host a rank runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankHost {
    /// The host's name (`h1`), given to its UTS namespace.
    pub name: String,
    /// Its network namespace.
    pub netns: String,
    /// Its testbed address.
    pub address: IpAddr,
}

/// The BTL (Open MPI's byte transfer layer) two ranks on this machine are
/// asked to meet over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalBtl {
    /// Shared memory (`vader`), Open MPI's own choice on one host.
    Vader,
    /// TCP over loopback (`btl tcp,self`, `btl_tcp_if_include lo`), the
    /// path the socket tests take on one host.
    Tcp,
}

impl LocalBtl {
    /// Its name, as `--mpi-btl` takes it and Open MPI calls it.
    pub fn name(self) -> &'static str {
        match self {
            LocalBtl::Vader => "vader",
            LocalBtl::Tcp => "tcp",
        }
    }

    /// The BTL named `name` (`vader`, `sm` or `tcp`).
    pub fn by_name(name: &str) -> Option<LocalBtl> {
        match name {
            "vader" | "sm" => Some(LocalBtl::Vader),
            "tcp" => Some(LocalBtl::Tcp),
            _ => None,
        }
    }
}

/// Where the two ranks run and what carries their messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Both ranks on this machine, over the BTL asked for.
    Local(LocalBtl),
    /// Rank 0 on `rank0`, rank 1 on `rank1`, over TCP on `interface`.
    Testbed {
        /// Rank 0's host; mpirun runs there too.
        rank0: RankHost,
        /// Rank 1's host.
        rank1: RankHost,
        /// The testbed interface both hosts have (`eth0`), as Open MPI's
        /// `*_if_include` takes it.
        interface: String,
    },
    /// Rank 0 on node `rank0`, rank 1 on node `rank1` of a cluster, over
    /// TCP on the nodes' network; mpirun runs here and reaches the nodes
    /// the cluster's way (srun inside a Slurm allocation, else its
    /// configured launch agent, ssh by default).
    Nodes {
        /// Rank 0's node, as the launcher names it.
        rank0: String,
        /// Rank 1's node.
        rank1: String,
    },
}

/// Where the ranks run, for the names of the parameters netgap sets there
/// ([`netgap_mca_names`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Where {
    /// On this machine, over this BTL.
    Local(LocalBtl),
    /// On two testbed hosts.
    Testbed,
    /// On two nodes of a cluster.
    Nodes,
}

impl Placement {
    /// The Open MPI parameters netgap sets for the ranks at this
    /// placement, in the order mpirun gets them; `scratch` is the job's
    /// own directory. A parameter of this list set in the environment too
    /// is refused ([`check_environment`]): mpirun's `--mca` would override
    /// it without a word.
    pub fn mca(&self, scratch: &str, exe: &str) -> Vec<(&'static str, String)> {
        let mut v: Vec<(&'static str, String)> = vec![
            // ob1 drives the BTLs named below; other PMLs (UCX) would
            // choose their own path.
            ("pml", "ob1".into()),
            // In a PID namespace of its own mpirun has the same pid in
            // every job, and Open MPI names a job's session files and
            // shared memory after its host name and pid: each job gets a
            // directory of its own for them, so that jobs side by side (on
            // the same or same-named hosts) do not meet.
            ("orte_tmpdir_base", scratch.into()),
            ("btl_vader_backing_directory", scratch.into()),
            // The library reports the BTL it chose for each peer (and at
            // level 20 the interfaces TCP uses) on standard error, which
            // the launch reads for the record's stack.
            ("btl_base_verbose", SELECTION_VERBOSITY.into()),
        ];
        match self {
            Placement::Local(LocalBtl::Vader) => v.push(("btl", "self,vader".into())),
            Placement::Local(LocalBtl::Tcp) => {
                v.push(("btl", "tcp,self".into()));
                v.push(("btl_tcp_if_include", "lo".into()));
            }
            Placement::Testbed { interface, .. } => {
                v.push(("btl", "tcp,self".into()));
                v.push(("btl_tcp_if_include", interface.clone()));
                v.push(("oob_tcp_if_include", interface.clone()));
                v.push(("plm_rsh_agent", format!("{exe} mpi-agent")));
            }
            // The nodes' own network, whichever interfaces Open MPI finds
            // there (it leaves out loopback); how mpirun reaches the
            // nodes is the cluster's.
            Placement::Nodes { .. } => v.push(("btl", "tcp,self".into())),
        }
        v
    }

    /// Whether both ranks run on this machine's own network stack.
    pub fn is_local(&self) -> bool {
        matches!(self, Placement::Local(_))
    }
}

/// The verbosity of `btl_base_verbose` at which Open MPI names the BTL
/// it uses for each peer (`mca: bml: Using tcp btl for send to ...`) and
/// the interfaces its TCP BTL uses.
const SELECTION_VERBOSITY: &str = "20";

/// The names of the Open MPI parameters netgap sets itself where the
/// ranks run.
pub fn netgap_mca_names(at: Where) -> Vec<&'static str> {
    let placement = match at {
        Where::Testbed => Placement::Testbed {
            rank0: RankHost::placeholder(),
            rank1: RankHost::placeholder(),
            interface: String::new(),
        },
        Where::Nodes => Placement::Nodes {
            rank0: String::new(),
            rank1: String::new(),
        },
        Where::Local(btl) => Placement::Local(btl),
    };
    placement.mca("", "").into_iter().map(|(k, _)| k).collect()
}

/// Refuses, in one line naming it, an `OMPI_MCA_*` variable of `vars`
/// that sets a parameter netgap sets itself (`names`): mpirun's own
/// `--mca` takes precedence over the environment, so the user's value
/// would be overridden silently. Every other `OMPI_MCA_*` is left to
/// Open MPI, and the record names it ([`mca_settings`]).
pub fn check_environment<I>(vars: I, names: &[&str]) -> Result<(), EnvironmentClash>
where
    I: IntoIterator<Item = (String, String)>,
{
    let mut clashes: Vec<(String, String)> = vars
        .into_iter()
        .filter(|(k, _)| {
            k.strip_prefix("OMPI_MCA_")
                .is_some_and(|name| names.contains(&name))
        })
        .collect();
    clashes.sort();
    let Some((k, v)) = clashes.first() else {
        return Ok(());
    };
    let name = k.trim_start_matches("OMPI_MCA_");
    let remedy = match name {
        "btl" | "btl_tcp_if_include" => {
            "unset it; --mpi-btl tcp runs the ranks on this machine over TCP on loopback, and on the testbed they always use TCP on its links"
        }
        _ => "unset it",
    };
    Err(EnvironmentClash {
        variable: k.clone(),
        value: v.chars().take(100).collect(),
        name: name.to_string(),
        remedy,
    })
}

/// An `OMPI_MCA_*` variable of the environment that sets a parameter
/// netgap sets itself ([`check_environment`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}={value} is set in the environment, but netgap sets the Open MPI parameter {name} for the ranks itself and would override it: {remedy}")]
pub struct EnvironmentClash {
    /// The variable, `OMPI_MCA_NAME`.
    pub variable: String,
    /// Its value, at most 100 characters of it.
    pub value: String,
    /// The parameter it sets.
    pub name: String,
    /// What to do.
    pub remedy: &'static str,
}

impl RankHost {
    /// A host with no name or namespace, for listing parameter names.
    fn placeholder() -> RankHost {
        RankHost {
            name: String::new(),
            netns: String::new(),
            address: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        }
    }
}

/// The interface holding `address` in network namespace `netns`, found
/// from inside it (a thread enters the namespace and lists addresses).
pub fn interface_of(netns: &str, address: IpAddr) -> Result<String, InterfaceError> {
    let netns = netns.to_string();
    std::thread::spawn(move || -> Result<String, InterfaceError> {
        netgap_transport::netns::enter(&netns)?;
        let addrs = nix::ifaddrs::getifaddrs().map_err(InterfaceError::ListAddresses)?;
        for a in addrs {
            let ip = a.address.as_ref().and_then(|s| {
                s.as_sockaddr_in()
                    .map(|v4| IpAddr::V4(v4.ip()))
                    .or_else(|| s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
            });
            if ip == Some(address) {
                return Ok(a.interface_name);
            }
        }
        Err(InterfaceError::NoInterface { address, netns })
    })
    .join()
    .map_err(|_| InterfaceError::Panicked)?
}

/// Why the interface holding an address in a namespace is not known
/// ([`interface_of`]).
#[derive(Debug, thiserror::Error)]
pub enum InterfaceError {
    /// The namespace could not be entered.
    #[error(transparent)]
    Netns(#[from] netgap_transport::netns::NetnsError),
    /// The namespace's addresses could not be listed.
    #[error("listing addresses: {0}")]
    ListAddresses(nix::Error),
    /// No interface in the namespace has the address.
    #[error("no interface has address {address} in {netns}")]
    NoInterface {
        /// The address looked for.
        address: IpAddr,
        /// The namespace.
        netns: String,
    },
    /// The thread that entered the namespace panicked.
    #[error("the interface lookup thread panicked")]
    Panicked,
}

/// The mpirun command line for `plan` at `placement`, with the
/// environment it needs; `exe` is this netgap, `scratch` the job's own
/// directory for Open MPI's session files and shared memory, `exports`
/// what the ranks' environment gets and mpirun's does not (`-x
/// NAME=VALUE`: the preload library, which mpirun and its daemons must
/// not run under).
pub fn mpirun_command(
    exe: &Path,
    plan: &RankPlan,
    placement: &Placement,
    scratch: &Path,
    exports: &[(String, OsString)],
) -> Command {
    let exe_s = exe.display().to_string();
    let mut mpirun: Vec<String> = vec!["mpirun".into(), "-np".into(), "2".into()];
    // Root may run MPI jobs only when it says so (the testbed needs root).
    if nix::unistd::geteuid().is_root() {
        mpirun.push("--allow-run-as-root".into());
    }
    mpirun.extend(["--bind-to".into(), "none".into()]);
    let scratch_s = scratch.display().to_string();
    for (k, val) in placement.mca(&scratch_s, &exe_s) {
        mpirun.extend(["--mca".into(), k.into(), val]);
    }
    match placement {
        Placement::Local(_) => mpirun.extend(["--host".into(), "localhost:2".into()]),
        Placement::Testbed { rank0, rank1, .. } => mpirun.extend([
            "--host".into(),
            format!("{}:1,{}:1", rank0.address, rank1.address),
        ]),
        Placement::Nodes { rank0, rank1 } => {
            mpirun.extend(["--host".into(), format!("{rank0}:1,{rank1}:1")])
        }
    }
    for (name, value) in exports {
        mpirun.extend(["-x".into(), format!("{name}={}", value.to_string_lossy())]);
    }
    mpirun.push(exe_s.clone());
    mpirun.push("mpi-rank".into());
    mpirun.extend(plan.to_args());
    // The job (mpirun, its daemons and the ranks, on every host: the launch
    // agent starts them as mpirun's descendants) ends with this process,
    // even when it is killed.
    let mut cmd = match placement {
        Placement::Local(_) | Placement::Nodes { .. } => {
            tether::command(Path::new(&mpirun[0]), &mpirun[1..], None)
        }
        Placement::Testbed { rank0, rank1, .. } => {
            let mut args: Vec<String> = vec![
                "mpi-exec".into(),
                "--netns".into(),
                rank0.netns.clone(),
                "--hostname".into(),
                rank0.name.clone(),
                "--".into(),
            ];
            args.extend(mpirun);
            let mut c = tether::command(exe, &args, None);
            let hosts = [rank0, rank1]
                .iter()
                .map(|h| format!("{}={}={}", h.address, h.netns, h.name))
                .collect::<Vec<_>>()
                .join(";");
            c.env(HOSTS_ENV, hosts);
            c
        }
    };
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// What Open MPI reported of its choices while the job started (with
/// `btl_base_verbose`, on standard error): for each rank process, the BTLs
/// it sends to its peer over and the nodes it names, and the interfaces
/// its TCP BTL uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// Per reporting process (`HOST:PID`), the BTLs it uses to reach
    /// another process (not `self`, which only reaches itself).
    peer_btls: BTreeMap<String, BTreeSet<String>>,
    /// The nodes the processes named as where their peers run.
    nodes: BTreeSet<String>,
    /// The interfaces the TCP BTL said it uses.
    interfaces: BTreeSet<String>,
}

/// Most distinct names a [`Selection`] keeps of each kind (a job of two
/// ranks reports a handful).
const MAX_SELECTION_NAMES: usize = 16;

impl Selection {
    /// Takes in one line of mpirun's standard error; whether it was one of
    /// the library's verbose reports (which are not errors to show).
    pub fn take_line(&mut self, line: &str) -> bool {
        let Some((proc_name, text)) = line
            .strip_prefix('[')
            .and_then(|rest| rest.split_once("] "))
        else {
            return false;
        };
        if let Some(rest) = text.strip_prefix("mca: bml: Using ") {
            // `tcp btl for send to [[12345,1],1] on node h2`
            let Some((btl, after)) = rest.split_once(" btl for send to ") else {
                return true;
            };
            let node = after.split_once(" on node ").map(|(_, n)| n.trim());
            if btl != "self" && self.peer_btls.len() < MAX_SELECTION_NAMES {
                let set = self.peer_btls.entry(short(proc_name)).or_default();
                if set.len() < MAX_SELECTION_NAMES {
                    set.insert(short(btl));
                }
                if let Some(n) = node.filter(|_| self.nodes.len() < MAX_SELECTION_NAMES) {
                    self.nodes.insert(short(n));
                }
            }
            return true;
        }
        if let Some(rest) = text.strip_prefix("btl: tcp: Using interface: ") {
            if self.interfaces.len() < MAX_SELECTION_NAMES {
                self.interfaces.insert(short(rest.trim()));
            }
            return true;
        }
        ["mca: ", "select: ", "btl: ", "btl:", "check:select: "]
            .iter()
            .any(|p| text.starts_with(p))
    }

    /// How many processes named the BTL they reach their peer over.
    pub fn ranks_reported(&self) -> usize {
        self.peer_btls.len()
    }

    /// The BTLs the ranks used to reach each other, sorted.
    pub fn btls(&self) -> Vec<String> {
        let all: BTreeSet<&String> = self.peer_btls.values().flatten().collect();
        all.into_iter().cloned().collect()
    }

    /// The nodes the ranks named as where their peers run, sorted.
    pub fn nodes(&self) -> Vec<String> {
        self.nodes.iter().cloned().collect()
    }

    /// The interfaces the TCP BTL used, sorted.
    pub fn interfaces(&self) -> Vec<String> {
        self.interfaces.iter().cloned().collect()
    }
}

/// A name from the library's output, cut to a sane length.
fn short(s: &str) -> String {
    s.chars().take(64).collect()
}

/// A running mpirun job and rank 0's lines.
pub struct Launch {
    child: Child,
    /// The job's own directory, removed when the job is over.
    scratch: PathBuf,
    lines: Receiver<Result<RankLine, WireError>>,
    /// How many lines rank 0 has sent, named when the job falls silent.
    lines_seen: usize,
    stderr: Arc<Mutex<VecDeque<String>>>,
    selection: Arc<Mutex<Selection>>,
}

impl Launch {
    /// Starts mpirun for `plan` at `placement`, the ranks' environment
    /// with `exports` ([`mpirun_command`]). The job ends with the
    /// thread that calls this (`PR_SET_PDEATHSIG`), so the thread must
    /// keep the [`Launch`] until the job is done.
    pub fn start(
        plan: &RankPlan,
        placement: &Placement,
        exports: &[(String, OsString)],
    ) -> Result<Launch, LaunchError> {
        let exe = std::env::current_exe().map_err(LaunchError::Exe)?;
        let scratch = scratch_dir()?;
        let mut cmd = mpirun_command(&exe, plan, placement, &scratch, exports);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(source) => {
                let _ = std::fs::remove_dir_all(&scratch);
                return Err(LaunchError::Spawn {
                    program: format!("{:?}", cmd.get_program()),
                    source,
                });
            }
        };
        let (tx, lines) = mpsc::channel();
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(out) = child.stdout.take() {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(out);
                loop {
                    let mut buf = Vec::new();
                    let limit = (MAX_LINE_BYTES + 1) as u64;
                    match (&mut reader).take(limit).read_until(b'\n', &mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                    let text = String::from_utf8_lossy(&buf);
                    let parsed = if buf.len() > MAX_LINE_BYTES {
                        Err(WireError::Line(format!(
                            "a line over {MAX_LINE_BYTES} bytes"
                        )))
                    } else {
                        parse_line(&text)
                    };
                    match parsed {
                        Ok(None) => {}
                        Ok(Some(line)) => {
                            if tx.send(Ok(line)).is_err() {
                                break;
                            }
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            break;
                        }
                    }
                }
            });
        }
        let selection = Arc::new(Mutex::new(Selection::default()));
        if let Some(err) = child.stderr.take() {
            let tail = Arc::clone(&stderr);
            let chosen = Arc::clone(&selection);
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines() {
                    let Ok(line) = line else { break };
                    let line = line.trim().to_string();
                    if line.is_empty() || line.chars().all(|c| c == '-') {
                        continue;
                    }
                    let reported = chosen.lock().map(|mut s| s.take_line(&line));
                    if reported.unwrap_or(false) {
                        continue;
                    }
                    if let Ok(mut t) = tail.lock() {
                        if t.len() == STDERR_TAIL_LINES {
                            t.pop_front();
                        }
                        t.push_back(line.chars().take(300).collect());
                    }
                }
            });
        }
        Ok(Launch {
            child,
            scratch,
            lines,
            lines_seen: 0,
            stderr,
            selection,
        })
    }

    /// What the library reported of its choices, once both ranks have
    /// named the BTL they reach each other over or `wait` has passed (the
    /// reports come on standard error, which may lag rank 0's lines).
    pub fn selection(&self, wait: Duration) -> Selection {
        let deadline = std::time::Instant::now() + wait;
        loop {
            let now = self.selection.lock().map(|s| s.clone()).unwrap_or_default();
            if now.ranks_reported() >= 2 || std::time::Instant::now() >= deadline {
                return now;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The next line of rank 0, waiting at most `timeout`; a job that ends
    /// or falls silent is stopped and named.
    pub fn next(&mut self, timeout: Duration) -> Result<RankLine, LaunchError> {
        match self.lines.recv_timeout(timeout) {
            Ok(Ok(line)) => {
                self.lines_seen += 1;
                Ok(line)
            }
            Ok(Err(e)) => {
                self.stop();
                Err(e.into())
            }
            Err(RecvTimeoutError::Timeout) => Err(self.silent(timeout)),
            Err(RecvTimeoutError::Disconnected) => Err(self.ended()),
        }
    }

    /// Waits for mpirun to exit after the last point; an error when it
    /// fails or takes longer than `timeout`.
    pub fn finish(mut self, timeout: Duration) -> Result<(), LaunchError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(s)) if s.success() => return Ok(()),
                Ok(Some(_)) | Err(_) => return Err(self.ended()),
                Ok(None) if std::time::Instant::now() >= deadline => {
                    return Err(self.silent(timeout));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Stops a job that fell silent, naming how far it had come: whether
    /// the ranks had got as far as choosing their BTLs (which they do
    /// while starting, in `MPI_Init`), how many lines rank 0 had sent, and
    /// the end of mpirun's standard error.
    fn silent(&mut self, waited: Duration) -> LaunchError {
        self.stop();
        let started = self
            .selection
            .lock()
            .map(|s| s.ranks_reported())
            .unwrap_or(0);
        let mut detail = format!(
            "; {started} of 2 ranks had chosen a BTL, rank 0 had sent {} lines",
            self.lines_seen
        );
        let said = self.stderr_tail();
        if !said.is_empty() {
            detail.push_str("; mpirun said: ");
            detail.push_str(&said);
        }
        LaunchError::Silent { waited, detail }
    }

    /// The end of mpirun's standard error, its lines joined by ` | `.
    fn stderr_tail(&self) -> String {
        self.stderr
            .lock()
            .map(|t| t.iter().cloned().collect::<Vec<_>>().join(" | "))
            .unwrap_or_default()
    }

    /// The job's end, with its status and the end of its standard error.
    fn ended(&mut self) -> LaunchError {
        let status = match self.child.wait() {
            Ok(s) => s.to_string(),
            Err(e) => e.to_string(),
        };
        // The stderr reader may still be draining the last lines.
        std::thread::sleep(Duration::from_millis(100));
        let detail = self.stderr_tail();
        LaunchError::Ended {
            status,
            detail: if detail.is_empty() {
                String::new()
            } else {
                format!(": {detail}")
            },
        }
    }

    /// Stops the job: SIGTERM to its process group (mpirun passes it on to
    /// every rank and daemon; `unshare` around mpirun ignores it), then
    /// SIGKILL, which ends the PID namespace and everything in it.
    fn stop(&mut self) {
        let group = i32::try_from(self.child.id()).ok().filter(|&p| p > 1);
        let signal_group = |sig| {
            if let Some(pgid) = group {
                let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), sig);
            }
        };
        signal_group(nix::sys::signal::Signal::SIGTERM);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // What is left of the group (in a process group only, processes
        // mpirun left behind) goes too.
        signal_group(nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Launch {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.stop();
        }
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

/// How a job's directory is named: this prefix, the pid of the netgap that
/// ran it, a count and a nonce.
const SCRATCH_PREFIX: &str = "netgap-mpi-";

/// Removes the job directories in `base` left by a netgap that was killed
/// (its job died with it): those named after a pid that no longer runs.
fn sweep_scratch(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix(SCRATCH_PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok());
        let Some(pid) = pid else { continue };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// A fresh directory for one job's session files and shared memory: in
/// `/dev/shm` (memory, where Open MPI keeps shared memory by default) when
/// there is one, else in the temporary directory; readable only by this
/// user.
pub(crate) fn scratch_dir() -> Result<PathBuf, LaunchError> {
    use std::os::unix::fs::DirBuilderExt;
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    sweep_scratch(&base);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let path = base.join(format!(
        "{SCRATCH_PREFIX}{}-{}-{nanos:x}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&path)
        .map_err(|e| LaunchError::Exec(format!("making {}: {e}", path.display())))?;
    Ok(path)
}

/// Enters network namespace `netns` and a new UTS namespace named
/// `hostname`, then replaces this process with `argv`. Returns only on
/// failure.
pub fn exec_in(netns: &str, hostname: &str, argv: &[OsString]) -> LaunchError {
    if let Err(e) = netgap_transport::netns::enter(netns) {
        return LaunchError::Exec(e.to_string());
    }
    // A host name of its own, so Open MPI counts the hosts as two nodes.
    if let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUTS) {
        return LaunchError::Exec(format!("new UTS namespace: {e}"));
    }
    if let Err(e) = nix::unistd::sethostname(hostname) {
        return LaunchError::Exec(format!("setting the host name {hostname}: {e}"));
    }
    let Some(program) = argv.first() else {
        return LaunchError::Exec("no command given".into());
    };
    let err = std::os::unix::process::CommandExt::exec(Command::new(program).args(&argv[1..]));
    LaunchError::Exec(format!("running {program:?}: {err}"))
}

/// The launch agent: mpirun runs `netgap mpi-agent HOST CMD...` to start
/// its daemon on HOST. Finds HOST's namespace in [`HOSTS_ENV`], enters it
/// and runs CMD through `sh -c` as ssh would. Returns only on failure.
pub fn agent(host: &str, command: &[OsString]) -> LaunchError {
    let map = std::env::var(HOSTS_ENV).unwrap_or_default();
    let Some((netns, name)) = map.split(';').find_map(|entry| {
        let mut parts = entry.splitn(3, '=');
        let (addr, netns, name) = (parts.next()?, parts.next()?, parts.next()?);
        (addr == host).then(|| (netns.to_string(), name.to_string()))
    }) else {
        return LaunchError::Exec(format!(
            "host {host:?} is not a testbed host of this run ({HOSTS_ENV})"
        ));
    };
    let line = command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .filter(|a| !a.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let argv: Vec<OsString> = vec!["/bin/sh".into(), "-c".into(), line.into()];
    exec_in(&netns, &name, &argv)
}

/// Most `OMPI_MCA_*` settings a record names.
const MAX_MCA_SETTINGS: usize = 32;

/// The Open MPI parameters set in the environment (`OMPI_MCA_NAME=VALUE`,
/// which mpirun and the ranks read), sorted, as `mca_NAME=VALUE`: they
/// change what MPI does (`mpi_yield_when_idle=1` lets an idle rank yield
/// its core instead of spinning), so the record's stack names them.
pub fn mca_settings() -> Vec<String> {
    let mut v: Vec<String> = environment()
        .filter_map(|(k, val)| {
            let name = k.strip_prefix("OMPI_MCA_")?;
            Some(format!(
                "mca_{}={}",
                name.chars().take(64).collect::<String>(),
                val.chars().take(100).collect::<String>()
            ))
        })
        .collect();
    v.sort();
    v.truncate(MAX_MCA_SETTINGS);
    v
}

/// This process's environment, which mpirun and the ranks inherit, with
/// any name or value that is not UTF-8 read lossily (`std::env::vars`
/// would panic on it).
pub fn environment() -> impl Iterator<Item = (String, String)> {
    std::env::vars_os().map(|(k, v)| {
        (
            k.to_string_lossy().into_owned(),
            v.to_string_lossy().into_owned(),
        )
    })
}

/// Whether `mpirun` is on the PATH.
pub fn mpirun_path() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("mpirun"))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_selection_is_what_the_library_reported() {
        let mut s = Selection::default();
        // Open MPI 4.1's own lines, as mpirun forwards them.
        let lines = [
            "[h1:2001] mca: base: components_open: found loaded component tcp",
            "[h1:2001] btl: tcp: Using interface: eth0",
            "[h1:2001] mca: bml: Using self btl for send to [[16247,1],0] on node h1",
            "[h1:2001] mca: bml: Using tcp btl for send to [[16247,1],1] on node h2",
            "[h2:2002] mca: bml: Using self btl for send to [[16247,1],1] on node h2",
            "[h2:2002] mca: bml: Using tcp btl for send to [[16247,1],0] on node h1",
        ];
        assert!(lines.iter().all(|l| s.take_line(l)));
        assert_eq!(s.ranks_reported(), 2);
        assert_eq!(s.btls(), ["tcp"]);
        assert_eq!(s.interfaces(), ["eth0"]);
        assert_eq!(s.nodes(), ["h1", "h2"]);
        // Anything else is mpirun's to say, and stays in the error's tail.
        assert!(!s.take_line("ORTE was unable to reliably start one or more daemons."));
        assert!(!s.take_line("[h1:2001] *** An error occurred in MPI_Init"));
        assert_eq!(s.btls(), ["tcp"]);
    }

    #[test]
    fn netgap_names_the_parameters_it_sets() {
        let local = netgap_mca_names(Where::Local(LocalBtl::Vader));
        assert!(local.contains(&"btl") && local.contains(&"pml"));
        assert!(!local.contains(&"btl_tcp_if_include"));
        assert!(netgap_mca_names(Where::Local(LocalBtl::Tcp)).contains(&"btl_tcp_if_include"));
        let nodes = netgap_mca_names(Where::Nodes);
        assert!(nodes.contains(&"btl") && !nodes.contains(&"plm_rsh_agent"));
        let testbed = netgap_mca_names(Where::Testbed);
        assert!(testbed.contains(&"oob_tcp_if_include") && testbed.contains(&"plm_rsh_agent"));
        let env = |k: &str| vec![(k.to_string(), "x".to_string())];
        assert!(check_environment(env("OMPI_MCA_pml"), &local)
            .expect_err("refused")
            .to_string()
            .starts_with("OMPI_MCA_pml=x is set"));
        assert_eq!(
            check_environment(env("OMPI_MCA_mpi_yield_when_idle"), &local),
            Ok(())
        );
        assert_eq!(check_environment(env("BTL"), &local), Ok(()));
    }

    #[test]
    fn tcp_on_this_machine_is_pinned_to_loopback() {
        let plan = RankPlan {
            points: vec![crate::wire::RankPoint {
                test: crate::kind::MpiTest::Latency,
                size_bytes: 1,
            }],
            reps: 1,
            iterations: crate::wire::RankIterations::Fixed(1),
            warmup: None,
        };
        let cmd = mpirun_command(
            Path::new("/bin/netgap"),
            &plan,
            &Placement::Local(LocalBtl::Tcp),
            Path::new("/tmp/x"),
            &[("LD_PRELOAD".into(), "/lib/p.so".into())],
        );
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let joined = args.join(" ");
        assert!(joined.contains("--mca btl tcp,self"), "{joined}");
        assert!(joined.contains("--mca btl_tcp_if_include lo"), "{joined}");
        assert!(!joined.contains("vader,"), "{joined}");
        // The library goes to the ranks only, before the rank's program.
        let x = joined.find("-x LD_PRELOAD=/lib/p.so").expect("exported");
        assert!(x < joined.find("mpi-rank").expect("the rank"), "{joined}");
        assert!(
            cmd.get_envs().all(|(k, _)| k != "LD_PRELOAD"),
            "mpirun itself runs plain"
        );
    }
}
