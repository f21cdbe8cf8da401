//! Apache httpd (Debian's `apache2`, the studies' own server): the event
//! MPM with keep-alive, sendfile and no access log, run in the foreground
//! (`-DFOREGROUND`) with its own configuration (`-f CONF`) whose pid file,
//! error log, mutexes and runtime files are all in its run directory. As
//! root its children switch to the unprivileged service user
//! ([`super::user::ServiceUser`]), which owns that directory. It is sized
//! to the clients ([`size`]): its children's threads and
//! `MaxRequestWorkers` give every closed-loop client a thread in whichever
//! child takes its connection, up to Apache's documented limits.

use super::{find_program, Launch, RunDir, Running, ServiceError, WebServer, WebStart};
use netgap_core::record::ServiceRecord;
use std::net::SocketAddr;
use std::path::Path;

/// The service's name in records.
pub(crate) const NAME: &str = "apache";

/// Apache, in [`super::web_servers`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Apache;

impl WebServer for Apache {
    fn name(&self) -> &'static str {
        NAME
    }

    fn help(&self) -> &'static str {
        "apache (apache2)"
    }

    fn workers_help(&self) -> &'static str {
        "Apache children (each with a thread for every client, up to 20000)"
    }

    fn refuse_clients(&self, clients: u64, workers: u32) -> Option<String> {
        size(clients, workers.max(1), workers != 0)
            .err()
            .map(|e| e.to_string())
    }

    fn start(&self, s: WebStart<'_>) -> Result<Running, ServiceError> {
        let sizing = size(s.clients, s.workers, s.workers_fixed)
            .map_err(|e| ServiceError::Refused(e.to_string()))?;
        start(s.dir, s.docroot, s.listen, sizing)
    }
}

/// Threads per child process of the event MPM, at the least.
pub(crate) const THREADS_PER_CHILD: u32 = 64;
/// The most `ServerLimit` (children) may be: the event MPM's hard limit
/// compiled into the server, as Apache's documentation states it.
pub(crate) const MAX_SERVER_LIMIT: u32 = 20_000;
/// The most `ThreadLimit` (and so `ThreadsPerChild`) may be: Apache's
/// documented hard limit on Unix.
pub(crate) const MAX_THREAD_LIMIT: u32 = 20_000;

/// How Apache is sized for a point: `MaxRequestWorkers` is children times
/// threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sizing {
    /// Child processes (`StartServers`, `ServerLimit`).
    pub children: u32,
    /// Threads of each (`ThreadsPerChild`, `ThreadLimit`).
    pub threads_per_child: u32,
}

impl Sizing {
    /// `MaxRequestWorkers`: the requests served at once.
    pub(crate) fn max_request_workers(&self) -> u64 {
        u64::from(self.children) * u64::from(self.threads_per_child)
    }
}

/// Apache cannot be sized for the clients within its documented limits.
#[derive(Debug, thiserror::Error)]
#[error(
    "Apache cannot serve {clients} clients with {children} children: each would need \
     {threads} threads, past the most its ThreadLimit may be ({MAX_THREAD_LIMIT}){hint}"
)]
pub(crate) struct TooManyClients {
    /// Clients of the point.
    pub clients: u64,
    /// Children.
    pub children: u32,
    /// Threads one child would need.
    pub threads: u64,
    /// What to change.
    pub hint: &'static str,
}

/// Sizes Apache for `clients` closed-loop clients, each of which keeps a
/// request in progress and so holds a thread: request slots for the
/// clients, a quarter more and a child's worth spare (a closed connection
/// lingers in its slot a moment). The kernel does not spread connections
/// evenly over the children, and a child of the event MPM whose threads
/// are all busy closes its kept-alive connections (which a closed-loop
/// client, its next request on the way, sees fail); so each child gets
/// threads for every slot (at least [`THREADS_PER_CHILD`]) up to
/// [`MAX_THREAD_LIMIT`], and past that more children than `children`
/// (unless `fixed`) up to [`MAX_SERVER_LIMIT`], so that together they hold
/// every slot.
pub(crate) fn size(clients: u64, children: u32, fixed: bool) -> Result<Sizing, TooManyClients> {
    let slots = clients + clients / 4 + u64::from(THREADS_PER_CHILD);
    let threads = slots.clamp(u64::from(THREADS_PER_CHILD), u64::from(MAX_THREAD_LIMIT));
    let children = if fixed {
        children.max(1)
    } else {
        let needed = u32::try_from(slots.div_ceil(threads)).unwrap_or(u32::MAX);
        needed.min(MAX_SERVER_LIMIT).max(children.max(1))
    };
    // Fixed children share the slots.
    let threads = threads.max(slots.div_ceil(u64::from(children)));
    match u32::try_from(threads) {
        Ok(t) if t <= MAX_THREAD_LIMIT => Ok(Sizing {
            children,
            threads_per_child: t,
        }),
        _ => Err(TooManyClients {
            clients,
            children,
            threads,
            hint: if fixed {
                "; ask for more children with --server-workers"
            } else {
                ""
            },
        }),
    }
}

/// Where Debian keeps Apache's loadable modules.
const MODULES: &str = "/usr/lib/apache2/modules";

/// The configuration netgap writes for Apache serving `docroot` on
/// `listen` sized by `sizing`;
/// `user` (the user and group names a root agent's services run as) is
/// what its children switch to when it starts as root.
pub(crate) fn config(
    dir: &Path,
    docroot: &Path,
    listen: SocketAddr,
    sizing: Sizing,
    user: Option<&(String, String)>,
) -> String {
    let d = dir.display();
    let root = docroot.display();
    let Sizing {
        children,
        threads_per_child,
    } = sizing;
    let max = sizing.max_request_workers();
    let user = user.map_or(String::new(), |(u, g)| format!("User {u}\nGroup {g}\n"));
    format!(
        "# Written by netgap for one web point; removed with its directory.
ServerRoot \"{d}\"
ServerName netgap
LoadModule mpm_event_module {MODULES}/mod_mpm_event.so
LoadModule authz_core_module {MODULES}/mod_authz_core.so
PidFile \"{d}/httpd.pid\"
DefaultRuntimeDir \"{d}\"
Mutex file:{d} default
ErrorLog \"{d}/error.log\"
LogLevel warn
Listen {listen}
{user}Timeout 60
KeepAlive On
MaxKeepAliveRequests 0
KeepAliveTimeout 120
EnableSendfile On
EnableMMAP On
StartServers {children}
ServerLimit {children}
ThreadsPerChild {threads_per_child}
ThreadLimit {threads_per_child}
MinSpareThreads {threads_per_child}
MaxSpareThreads {max}
MaxRequestWorkers {max}
MaxConnectionsPerChild 0
DocumentRoot \"{root}\"
<Directory \"{root}\">
    Require all granted
    AllowOverride None
    Options None
</Directory>
"
    )
}

/// Starts Apache serving `docroot` on `listen` sized by `sizing`,
/// its error log `error.log` in `dir` (made by the caller with
/// [`RunDir::service_file`]).
pub(crate) fn start(
    dir: RunDir,
    docroot: &Path,
    listen: SocketAddr,
    sizing: Sizing,
) -> Result<Running, ServiceError> {
    let program = find_program("apache2", "apache2", "-v")?;
    if !Path::new(MODULES).join("mod_mpm_event.so").exists() {
        return Err(ServiceError::NotInstalled {
            program: "apache2's event MPM module",
            package: "apache2",
        });
    }
    let text = config(
        dir.path(),
        docroot,
        listen,
        sizing,
        dir.user_names().as_ref(),
    );
    let conf = dir.write("httpd.conf", text.as_bytes())?;
    let launch = Launch {
        program: program.path.clone(),
        args: vec!["-f".into(), conf.into(), "-DFOREGROUND".into()],
        stop_signal: libc::SIGTERM,
    };
    let record = ServiceRecord {
        name: NAME.into(),
        host: super::host_name(),
        program: program.path.display().to_string(),
        version: program.version,
        listen: listen.to_string(),
        workers: Some(u32::try_from(sizing.max_request_workers()).unwrap_or(u32::MAX)),
        config: text,
        facts: Default::default(),
    };
    dir.hand_over()?;
    Running::spawn(NAME, launch, dir, record)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn every_client_has_a_thread_within_the_documented_limits() {
        // Two CPUs, 200 clients: each child can hold every client.
        let s = size(200, 2, false).unwrap();
        assert_eq!(
            s,
            Sizing {
                children: 2,
                threads_per_child: 314
            }
        );
        assert_eq!(size(10, 2, false).unwrap().threads_per_child, 76);
        let f = size(1000, 2, true).unwrap();
        assert_eq!((f.children, f.threads_per_child), (2, 1314));
        // Past the thread limit, more children hold the slots together.
        let most = size(100_000, 1, false).unwrap();
        assert_eq!((most.children, most.threads_per_child), (7, 20_000));
        assert!(most.max_request_workers() >= 125_064);
        // Fixed children that cannot hold them are refused.
        let e = size(100_000, 2, true).unwrap_err().to_string();
        assert!(
            e.contains("ThreadLimit") && e.contains("--server-workers"),
            "{e}"
        );
        let conf = config(
            Path::new("/r"),
            Path::new("/r/www"),
            "127.0.0.1:80".parse().unwrap(),
            f,
            None,
        );
        for line in [
            "StartServers 2",
            "ServerLimit 2",
            "ThreadsPerChild 1314",
            "ThreadLimit 1314",
            "MaxRequestWorkers 2628",
        ] {
            assert!(conf.lines().any(|l| l == line), "{line} in {conf}");
        }
    }
}
