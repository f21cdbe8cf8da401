//! Apache httpd (Debian's `apache2`, the studies' own server): the event
//! MPM with keep-alive, sendfile and no access log, run in the foreground
//! (`-DFOREGROUND`) with its own configuration (`-f CONF`) whose pid file,
//! error log, mutexes and runtime files are all in its run directory. As
//! root its children switch to the unprivileged service user
//! ([`super::user::ServiceUser`]), which owns that directory.

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
        "Apache children of 64 threads"
    }

    /// Its `MaxRequestWorkers` (children x threads) at the most children
    /// a run may ask for.
    fn refuse_clients(&self, clients: u64, max_workers: u64) -> Option<String> {
        let max_clients = max_workers * u64::from(THREADS_PER_CHILD);
        (clients > max_clients).then(|| {
            format!(
                "Apache serves at most {max_clients} clients here (its \
                 MaxRequestWorkers: {max_workers} children of {THREADS_PER_CHILD} threads), not {clients}; \
                 use --server nginx for more"
            )
        })
    }

    fn start(&self, s: WebStart<'_>) -> Result<Running, ServiceError> {
        start(s.dir, s.docroot, s.listen, s.workers)
    }
}

/// Threads per child process of the event MPM.
pub(crate) const THREADS_PER_CHILD: u32 = 64;

/// Where Debian keeps Apache's loadable modules.
const MODULES: &str = "/usr/lib/apache2/modules";

/// The configuration netgap writes for Apache serving `docroot` on
/// `listen` with `children` processes of [`THREADS_PER_CHILD`] threads;
/// `user` (the user and group names a root agent's services run as) is
/// what its children switch to when it starts as root.
pub(crate) fn config(
    dir: &Path,
    docroot: &Path,
    listen: SocketAddr,
    children: u32,
    user: Option<&(String, String)>,
) -> String {
    let d = dir.display();
    let root = docroot.display();
    let max = children * THREADS_PER_CHILD;
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
ThreadsPerChild {THREADS_PER_CHILD}
ThreadLimit {THREADS_PER_CHILD}
MinSpareThreads {THREADS_PER_CHILD}
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

/// Starts Apache serving `docroot` on `listen` with `children` processes,
/// its error log `error.log` in `dir` (made by the caller with
/// [`RunDir::service_file`]).
pub(crate) fn start(
    dir: RunDir,
    docroot: &Path,
    listen: SocketAddr,
    children: u32,
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
        children,
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
        workers: Some(children * THREADS_PER_CHILD),
        config: text,
        facts: Default::default(),
    };
    dir.hand_over()?;
    Running::spawn(NAME, launch, dir, record)
}
