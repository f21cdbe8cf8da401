//! nginx (Debian's `nginx-light`): a static file server with keep-alive,
//! sendfile and no access log, run in the foreground (`daemon off;`) with
//! every path inside its run directory (`-p DIR -e LOG -c CONF`). Its
//! workers are sized to the clients ([`size`]): at least one per CPU, more
//! when one worker's share would pass a process's descriptor limit, each
//! on its own `reuseport` listening socket so the kernel spreads the
//! connections over them.

use super::{find_program, Launch, RunDir, Running, ServiceError, WebServer, WebStart};
use netgap_core::record::ServiceRecord;
use std::net::SocketAddr;
use std::path::Path;

/// The service's name in records.
pub(crate) const NAME: &str = "nginx";

/// nginx, in [`super::web_servers`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Nginx;

impl WebServer for Nginx {
    fn name(&self) -> &'static str {
        NAME
    }

    fn help(&self) -> &'static str {
        "nginx (Debian's nginx-light)"
    }

    fn workers_help(&self) -> &'static str {
        "nginx worker processes"
    }

    fn start(&self, s: WebStart<'_>) -> Result<Running, ServiceError> {
        // The workers inherit this agent's hard descriptor limit.
        let (_, hard) = netgap_transport::flows::limits::fd_limits()
            .map_err(|e| ServiceError::Refused(e.to_string()))?;
        let sizing = size(
            s.clients,
            s.files,
            s.workers,
            s.workers_fixed,
            s.max_workers,
            hard,
        )
        .map_err(|e| ServiceError::Refused(e.to_string()))?;
        start(s.dir, s.docroot, s.listen, &sizing)
    }
}

/// Most files a worker holds open in its open-file cache (the config's
/// `open_file_cache max`), each a descriptor; fewer when the file set is
/// smaller.
const MAX_CACHED_FILES: u64 = 10_000;
/// Descriptors a worker holds besides its connections and cached files:
/// its listening sockets, epoll, logs, and channels to the other workers.
const SPARE_FDS: u64 = 256;
/// Connection slots of a worker besides its share of the clients: its
/// listening sockets count as connections in nginx, and a worker short of
/// slots closes idle kept-alive connections ("worker_connections are not
/// enough, reusing connections"), which a closed-loop client whose next
/// request is on its way sees as a failure.
const SPARE_CONNECTIONS: u64 = 256;

/// How nginx is sized for a point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sizing {
    /// Worker processes.
    pub workers: u32,
    /// `worker_connections`: the connections one worker may hold.
    pub worker_connections: u64,
    /// `worker_rlimit_nofile`: the descriptors one worker may open.
    pub rlimit_nofile: u64,
    /// `open_file_cache max`: the served files a worker keeps open.
    pub cached_files: u64,
}

/// nginx cannot be sized for the clients within the descriptor limit.
#[derive(Debug, thiserror::Error)]
#[error(
    "nginx cannot serve {clients} clients: {workers} worker processes would each need \
     {needed} file descriptors, over this host's limit of {limit}{hint}"
)]
pub(crate) struct TooManyClients {
    /// Clients of the point.
    pub clients: u64,
    /// Workers at most.
    pub workers: u32,
    /// Descriptors one worker would need.
    pub needed: u64,
    /// The per-process descriptor limit.
    pub limit: u64,
    /// What to change.
    pub hint: &'static str,
}

/// Sizes nginx for `clients` connections to a set of `files` files:
/// `workers` processes (at least
/// one per CPU, or as the run asked when `fixed`), raised up to
/// `max_workers` while one worker's descriptors would pass `fd_limit`
/// (the per-process hard limit the workers inherit). The kernel spreads
/// connections over `reuseport` sockets by a hash, so a worker's
/// connections are the even share plus a quarter and
/// 256 spare slots; its descriptors are those connections, its
/// cached files and 256 spare.
pub(crate) fn size(
    clients: u64,
    files: u64,
    workers: u32,
    fixed: bool,
    max_workers: u32,
    fd_limit: u64,
) -> Result<Sizing, TooManyClients> {
    let cached_files = files.clamp(1, MAX_CACHED_FILES);
    let at = |w: u32| {
        let even = clients.div_ceil(u64::from(w.max(1)));
        let worker_connections = even + even / 4 + SPARE_CONNECTIONS;
        Sizing {
            workers: w.max(1),
            worker_connections,
            rlimit_nofile: worker_connections + cached_files + SPARE_FDS,
            cached_files,
        }
    };
    let mut w = workers.max(1);
    loop {
        let s = at(w);
        if s.rlimit_nofile <= fd_limit {
            return Ok(s);
        }
        if fixed || w >= max_workers {
            return Err(TooManyClients {
                clients,
                workers: w,
                needed: s.rlimit_nofile,
                limit: fd_limit,
                hint: if fixed {
                    "; ask for more with --server-workers"
                } else {
                    "; raise the hard limit (ulimit -Hn) or spread fewer clients"
                },
            });
        }
        w += 1;
    }
}

/// The configuration netgap writes for nginx serving `docroot` on
/// `listen` sized by `sizing`; every path is in `dir`. `user` (the user
/// and group names a root agent's services run as) makes the workers
/// switch to it when the master starts as root.
/// `multi_accept on`: a worker that takes one connection per wake-up
/// starves its backlog behind thousands of busy kept-alive clients (a
/// client that connected in the first hundreds of milliseconds could
/// wait seconds for its first response).
pub(crate) fn config(
    dir: &Path,
    docroot: &Path,
    listen: SocketAddr,
    sizing: &Sizing,
    user: Option<&(String, String)>,
) -> String {
    let d = dir.display();
    let user = user.map_or(String::new(), |(u, g)| format!("user {u} {g};\n"));
    let Sizing {
        workers,
        worker_connections,
        rlimit_nofile,
        cached_files,
    } = sizing;
    format!(
        "# Written by netgap for one web point; removed with its directory.
daemon off;
{user}master_process on;
worker_processes {workers};
worker_rlimit_nofile {rlimit_nofile};
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{
    worker_connections {worker_connections};
    multi_accept on;
}}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_timeout 120s;
    keepalive_requests 100000000;
    open_file_cache max={cached_files} inactive=60s;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    types {{ }}
    default_type application/octet-stream;
    server {{
        listen {listen} reuseport backlog=65535;
        root {root};
    }}
}}
",
        root = docroot.display()
    )
}

/// Starts nginx serving `docroot` (inside `dir`) on `listen` sized by
/// `sizing`, its error log `error.log` in `dir` (made by the caller with
/// [`RunDir::service_file`], so a failure at start can be quoted); returns once it is running (the caller waits until it
/// answers).
pub(crate) fn start(
    dir: RunDir,
    docroot: &Path,
    listen: SocketAddr,
    sizing: &Sizing,
) -> Result<Running, ServiceError> {
    let program = find_program("nginx", "nginx-light", "-v")?;
    let text = config(
        dir.path(),
        docroot,
        listen,
        sizing,
        dir.user_names().as_ref(),
    );
    let conf = dir.write("nginx.conf", text.as_bytes())?;
    let error_log = dir.path().join("error.log");
    let launch = Launch {
        program: program.path.clone(),
        args: vec![
            "-p".into(),
            dir.path().into(),
            "-e".into(),
            error_log.clone().into(),
            "-c".into(),
            conf.into(),
        ],
        stop_signal: libc::SIGTERM,
    };
    let record = ServiceRecord {
        name: NAME.into(),
        host: super::host_name(),
        program: program.path.display().to_string(),
        version: program.version,
        listen: listen.to_string(),
        workers: Some(sizing.workers),
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
    fn workers_grow_until_each_fits_the_descriptor_limit() {
        // A few clients: one worker per CPU, each able to hold them all.
        let s = size(10, 360, 2, false, 64, 20_000).unwrap();
        assert_eq!(s.workers, 2);
        assert_eq!(s.worker_connections, 5 + 1 + SPARE_CONNECTIONS);
        assert_eq!(s.cached_files, 360);
        assert_eq!(s.rlimit_nofile, s.worker_connections + 360 + SPARE_FDS);
        // 100,000 clients under a 20,000 limit: the fewest workers whose
        // share (with its slack) and cached files fit.
        let s = size(100_000, 1, 2, false, 64, 20_000).unwrap();
        assert_eq!(s.workers, 7, "{s:?}");
        assert!(s.rlimit_nofile <= 20_000, "{s:?}");
        let even = 100_000u64.div_ceil(6);
        assert!(even + even / 4 + SPARE_CONNECTIONS + 1 + SPARE_FDS > 20_000);
        assert!(s.worker_connections * u64::from(s.workers) >= 100_000);
        // A larger limit needs fewer workers.
        let big = size(100_000, 1, 2, false, 64, 1_048_576).unwrap();
        assert_eq!(big.workers, 2);
        assert!(big.worker_connections >= 100_000 / 2);
    }

    #[test]
    fn clients_beyond_what_the_workers_may_open_are_refused_with_a_remedy() {
        let e = size(100_000, 1, 2, true, 64, 20_000)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("100000 clients") && e.contains("--server-workers"),
            "{e}"
        );
        let e = size(2_000_000, 1, 2, false, 64, 20_000)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("64 worker processes") && e.contains("ulimit -Hn"),
            "{e}"
        );
    }

    #[test]
    fn the_config_carries_the_sizing_and_a_reuseport_listener() {
        let s = size(50_000, 1, 2, false, 64, 20_000).unwrap();
        let text = config(
            Path::new("/run/x"),
            Path::new("/run/x/www"),
            "10.0.0.1:8080".parse().unwrap(),
            &s,
            None,
        );
        assert!(!text.contains("user "));
        let root = config(
            Path::new("/run/x"),
            Path::new("/run/x/www"),
            "10.0.0.1:8080".parse().unwrap(),
            &s,
            Some(&("nobody".into(), "nogroup".into())),
        );
        assert!(root.contains("user nobody nogroup;"));
        assert!(text.contains(&format!("worker_processes {};", s.workers)));
        assert!(text.contains(&format!("worker_connections {};", s.worker_connections)));
        assert!(text.contains(&format!("worker_rlimit_nofile {};", s.rlimit_nofile)));
        assert!(text.contains("open_file_cache max=1 "));
        assert!(text.contains("listen 10.0.0.1:8080 reuseport"));
    }
}
