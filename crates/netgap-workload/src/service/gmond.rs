//! gmond (Debian's `ganglia-monitor`), Ganglia's monitoring daemon,
//! configured so its host reports only itself: its metrics go by unicast
//! UDP to its own loopback address and port (no multicast, nothing leaves
//! the host), it hears only that port, and it answers on a TCP accept
//! channel with the XML of what it knows: its own host. Run in the
//! foreground (`-f -c CONF`); started as root it switches to the
//! unprivileged service user ([`super::user::ServiceUser`]).

use super::{find_program, free_udp_port, Launch, RunDir, Running, ServiceError};
use netgap_core::record::ServiceRecord;
use quick_xml::events::Event;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The service's name in records.
pub(crate) const NAME: &str = "gmond";

/// The metrics every gmond collects, each second: with the heartbeat and
/// the host's own facts its answer is about 8 KiB, in the 2 to 10 KiB of
/// the studies' clusters.
const METRICS: &[&str] = &[
    "cpu_num",
    "cpu_speed",
    "mem_total",
    "boottime",
    "machine_type",
    "os_name",
    "os_release",
    "cpu_user",
    "cpu_system",
    "cpu_idle",
    "load_one",
    "mem_free",
    "bytes_in",
    "bytes_out",
    "proc_run",
    "proc_total",
];

/// The metric modules the metrics come from.
const MODULES: &[(&str, &str)] = &[
    ("cpu_module", "modcpu.so"),
    ("load_module", "modload.so"),
    ("mem_module", "modmem.so"),
    ("net_module", "modnet.so"),
    ("proc_module", "modproc.so"),
    ("sys_module", "modsys.so"),
];

/// Where the installed metric modules are (Debian's multiarch library
/// directory, or a plain one).
fn module_dir() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("ganglia"))
        .collect();
    dirs.extend(["/usr/lib/ganglia", "/usr/lib64/ganglia"].map(PathBuf::from));
    dirs.into_iter().find(|d| d.join("modcpu.so").exists())
}

/// The configuration netgap writes for gmond: host `host_name`, metrics by
/// unicast to 127.0.0.1:`udp_port` and heard there only, XML on
/// `tcp`; `user` (a root agent's service user) is who it switches to.
pub(crate) fn config(
    modules: &Path,
    host_name: &str,
    udp_port: u16,
    tcp: SocketAddr,
    user: Option<&str>,
) -> String {
    let (setuid, user) = match user {
        Some(u) => ("yes", u),
        None => ("no", "nobody"),
    };
    let mut mods = String::from("  module {\n    name = \"core_metrics\"\n  }\n");
    for (name, file) in MODULES {
        mods.push_str(&format!(
            "  module {{\n    name = \"{name}\"\n    path = \"{}\"\n  }}\n",
            modules.join(file).display()
        ));
    }
    let metrics: String = METRICS
        .iter()
        .map(|m| format!("  metric {{\n    name = \"{m}\"\n  }}\n"))
        .collect();
    format!(
        "/* Written by netgap for one gather point; removed with its directory. */
globals {{
  daemonize = no
  setuid = {setuid}
  user = {user}
  debug_level = 0
  max_udp_msg_len = 1472
  mute = no
  deaf = no
  allow_extra_data = yes
  host_dmax = 0
  host_tmax = 20
  cleanup_threshold = 300
  gexec = no
  send_metadata_interval = 5
  override_hostname = \"{host_name}\"
}}
cluster {{
  name = \"netgap\"
  owner = \"netgap\"
}}
host {{
  location = \"netgap\"
}}
udp_send_channel {{
  host = 127.0.0.1
  port = {udp_port}
  ttl = 1
}}
udp_recv_channel {{
  bind = 127.0.0.1
  port = {udp_port}
}}
tcp_accept_channel {{
  bind = {ip}
  port = {port}
  gzip_output = no
}}
modules {{
{mods}}}
collection_group {{
  collect_once = yes
  time_threshold = 20
  metric {{
    name = \"heartbeat\"
  }}
}}
collection_group {{
  collect_every = 1
  time_threshold = 1
{metrics}}}
",
        ip = tcp.ip(),
        port = tcp.port()
    )
}

/// Starts gmond answering on `tcp`; returns once it runs (the caller
/// waits until its answer names its host).
pub(crate) fn start(dir: RunDir, tcp: SocketAddr) -> Result<Running, ServiceError> {
    let program = find_program("gmond", "ganglia-monitor", "--version")?;
    let modules = module_dir().ok_or(ServiceError::NotInstalled {
        program: "gmond's metric modules",
        package: "ganglia-monitor",
    })?;
    let udp_port = free_udp_port(std::net::Ipv4Addr::LOCALHOST.into())?;
    let host = super::host_name();
    let user = dir.user_names().map(|(u, _)| u);
    let text = config(&modules, &host, udp_port, tcp, user.as_deref());
    let conf = dir.write("gmond.conf", text.as_bytes())?;
    let launch = Launch {
        program: program.path.clone(),
        args: vec!["-f".into(), "-c".into(), conf.into()],
        stop_signal: libc::SIGKILL,
    };
    let record = ServiceRecord {
        name: NAME.into(),
        host,
        program: program.path.display().to_string(),
        version: program.version,
        listen: tcp.to_string(),
        workers: None,
        config: text,
        facts: Default::default(),
    };
    dir.hand_over()?;
    Running::spawn(NAME, launch, dir, record)
}

/// What one gmond answer says: the hosts it names and their metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Answer {
    /// The `NAME` of every `HOST`, in order.
    pub hosts: Vec<String>,
    /// `METRIC` elements, all hosts.
    pub metrics: u32,
}

/// Most hosts one answer may name.
const MAX_HOSTS: usize = 4096;

/// Why an answer is not gmond's XML, one line.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GmondError {
    /// More hosts than an answer may name.
    #[error("more than {MAX_HOSTS} hosts")]
    TooManyHosts,
    /// A HOST element's attributes do not parse.
    #[error("{0}")]
    Attribute(#[from] quick_xml::events::attributes::AttrError),
    /// A HOST element has no NAME.
    #[error("a HOST without NAME")]
    NoName,
    /// A host's NAME does not unescape.
    #[error("{0}")]
    Name(Box<quick_xml::Error>),
    /// The document is not well-formed.
    #[error("bad XML at byte {at}: {source}")]
    Xml {
        /// Where the reader stopped, bytes from the start.
        at: u64,
        /// Why (boxed: the reader's error is large, the answer's is
        /// rare).
        source: Box<quick_xml::Error>,
    },
    /// The document has no GANGLIA_XML element.
    #[error("no GANGLIA_XML element")]
    NoRoot,
}

/// Parses gmond's XML (`GANGLIA_XML` / `CLUSTER` / `HOST` / `METRIC`);
/// never panics on any input.
pub(crate) fn parse(xml: &[u8]) -> Result<Answer, GmondError> {
    let mut reader = quick_xml::Reader::from_reader(xml);
    let mut answer = Answer::default();
    let mut root = false;
    loop {
        match reader.read_event() {
            Ok(Event::Start(e)) | Ok(Event::Empty(e)) => match e.name().as_ref() {
                b"GANGLIA_XML" => root = true,
                b"HOST" => {
                    if answer.hosts.len() >= MAX_HOSTS {
                        return Err(GmondError::TooManyHosts);
                    }
                    let name = e.try_get_attribute("NAME")?.ok_or(GmondError::NoName)?;
                    let name = name
                        .unescape_value()
                        .map_err(|e| GmondError::Name(Box::new(e)))?;
                    answer.hosts.push(name.chars().take(256).collect());
                }
                b"METRIC" => answer.metrics = answer.metrics.saturating_add(1),
                _ => {}
            },
            Ok(Event::Eof) => break,
            Ok(_) => {}
            Err(source) => {
                return Err(GmondError::Xml {
                    at: reader.buffer_position(),
                    source: Box::new(source),
                })
            }
        }
    }
    if !root {
        return Err(GmondError::NoRoot);
    }
    Ok(answer)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn answers_are_parsed_and_garbage_is_refused() {
        let xml = br#"<?xml version="1.0" encoding="ISO-8859-1" standalone="yes"?>
<!DOCTYPE GANGLIA_XML [ <!ELEMENT GANGLIA_XML (GRID|CLUSTER|HOST)*> ]>
<GANGLIA_XML VERSION="3.7.2" SOURCE="gmond">
<CLUSTER NAME="netgap" LOCALTIME="1" OWNER="netgap" LATLONG="" URL="">
<HOST NAME="h1" IP="127.0.0.1" TAGS="" REPORTED="1" TN="0" TMAX="20" DMAX="0" LOCATION="netgap" GMOND_STARTED="1">
<METRIC NAME="cpu_num" VAL="2" TYPE="uint16" UNITS="CPUs" TN="0" TMAX="1" DMAX="0" SLOPE="zero" SOURCE="gmond">
<EXTRA_DATA><EXTRA_ELEMENT NAME="GROUP" VAL="cpu"/></EXTRA_DATA>
</METRIC>
<METRIC NAME="load_one" VAL="0.1" TYPE="float" UNITS="" TN="0" TMAX="1" DMAX="0" SLOPE="both" SOURCE="gmond"/>
</HOST>
</CLUSTER>
</GANGLIA_XML>
"#;
        let a = parse(xml).unwrap();
        assert_eq!(a.hosts, vec!["h1".to_string()]);
        assert_eq!(a.metrics, 2);
        assert!(parse(b"<html></html>").is_err());
        assert!(parse(b"<GANGLIA_XML><HOST></HOST>").is_err());
        assert!(parse(&[0xff, 0x00, b'<', b'<']).is_err());
    }

    #[test]
    fn the_configuration_keeps_gmond_to_its_own_host() {
        let c = config(
            Path::new("/usr/lib/ganglia"),
            "h1",
            9000,
            "10.0.0.1:8649".parse().unwrap(),
            None,
        );
        assert!(c.contains("setuid = no"));
        let root = config(
            Path::new("/usr/lib/ganglia"),
            "h1",
            9000,
            "10.0.0.1:8649".parse().unwrap(),
            Some("nobody"),
        );
        assert!(root.contains("setuid = yes\n  user = nobody"));
        assert!(!c.contains("mcast"));
        assert!(c.contains("host = 127.0.0.1\n  port = 9000"));
        assert!(c.contains("bind = 10.0.0.1\n  port = 8649"));
        assert!(c.contains("daemonize = no"));
    }
}
