//! nginx (Debian's `nginx-light`): a static file server with keep-alive,
//! sendfile and no access log, its workers one per CPU unless told, run in
//! the foreground (`daemon off;`) with every path inside its run
//! directory (`-p DIR -e LOG -c CONF`).

use super::{find_program, io_err, Launch, RunDir, Running, ServiceError};
use netgap_core::record::ServiceRecord;
use std::net::SocketAddr;
use std::path::Path;

/// The service's name in records.
pub const NAME: &str = "nginx";

/// The configuration netgap writes for nginx serving `docroot` on
/// `listen` with `workers` worker processes; every path is in `dir`.
pub fn config(dir: &Path, docroot: &Path, listen: SocketAddr, workers: u32) -> String {
    let d = dir.display();
    format!(
        "# Written by netgap for one web point; removed with its directory.
daemon off;
master_process on;
worker_processes {workers};
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{
    worker_connections 4096;
}}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_timeout 120s;
    keepalive_requests 100000000;
    open_file_cache max=10000 inactive=60s;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    types {{ }}
    default_type application/octet-stream;
    server {{
        listen {listen};
        root {root};
    }}
}}
",
        root = docroot.display()
    )
}

/// Starts nginx serving `docroot` (inside `dir`) on `listen`; returns once
/// it is running (the caller waits until it answers).
pub fn start(
    dir: RunDir,
    docroot: &Path,
    listen: SocketAddr,
    workers: u32,
) -> Result<Running, ServiceError> {
    let program = find_program("nginx", "nginx-light", "-v")?;
    let text = config(dir.path(), docroot, listen, workers);
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
        workers: Some(workers),
        config: text,
        facts: Default::default(),
    };
    // The error log must exist before nginx starts so a failure at start
    // can be quoted.
    std::fs::File::create(&error_log).map_err(io_err(format!("making {}", error_log.display())))?;
    Running::spawn(NAME, launch, dir, record)
}
