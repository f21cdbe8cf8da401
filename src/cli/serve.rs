//! `netgap serve` and `netgap key new`: the agent's flags checked into
//! its control address, limits, key, directories and relay, and the agent
//! started on them.

use super::ServeArgs;
use anyhow::{anyhow, Context, Result};
use netgap::agent::Agent;
use netgap::control::ControlAddr;
use std::net::{IpAddr, SocketAddr};

/// `netgap serve`.
pub(crate) fn serve(args: &ServeArgs) -> Result<()> {
    let control = match ControlAddr::parse(&args.bind) {
        Some(a @ ControlAddr::Unix(_)) => a,
        _ if args.bind == "auto" => {
            let a = netgap::hostlist::node_address().map_err(|e| anyhow!("--bind auto: {e}"))?;
            println!("--bind auto: {} ({})", a.ip, a.how);
            ControlAddr::Tcp(SocketAddr::new(a.ip, args.port))
        }
        _ => {
            let ip: IpAddr = args
                .bind
                .trim_matches(|c| c == '[' || c == ']')
                .parse()
                .with_context(|| {
                    format!(
                        "--bind {:?} is neither an IP address nor unix:PATH",
                        args.bind
                    )
                })?;
            ControlAddr::Tcp(SocketAddr::new(ip, args.port))
        }
    };
    if let ControlAddr::Tcp(a) = &control {
        if !a.ip().is_loopback() && args.key.is_none() {
            return Err(anyhow!(
                "refusing to listen on {} without --key: other hosts could drive this agent; make a key with `netgap key new FILE` and pass --key FILE on both ends",
                a.ip()
            ));
        }
    }
    let limits = netgap::limits::AgentLimits {
        max_flows: args.max_flows,
        max_duration: args.max_duration,
        max_rate_gbps: args.max_rate,
        max_message_bytes: args.max_message,
        max_memory_bytes: args.max_memory,
    };
    limits.validate().map_err(|e| anyhow!(e))?;
    let key = args
        .key
        .as_deref()
        .map(netgap::auth::load_key)
        .transpose()?;
    let relay = match (&args.relay_interface, &key) {
        (None, _) => None,
        (Some(_), None) => {
            return Err(anyhow!(
            "--relay-interface needs --key: the relays' shared key is derived from the agents' key"
        ))
        }
        (Some(name), Some(key)) => Some(
            netgap::workload::preload::RelaySetup::new(name, key)
                .map_err(|e| anyhow!("--relay-interface: {e}"))?,
        ),
    };
    // The directories the agent writes in are checked (and what killed
    // agents left in them removed) before anything is written or bound.
    let run_base = match &args.run_dir {
        Some(d) if d.is_relative() => std::env::current_dir()
            .context("reading the current directory for --run-dir")?
            .join(d),
        Some(d) => d.clone(),
        None => netgap::confined::default_run_base(),
    };
    let mut dirs = netgap::confined::AgentDirs::new(run_base);
    dirs.open_base()?;
    if let Some(io) = &args.io_dir {
        dirs = dirs.with_io_dir(io).map_err(|e| anyhow!("--io-dir: {e}"))?;
    }
    let mut agent = Agent::bind_control(&control)?
        .with_limits(limits)
        .with_dirs(dirs);
    if args.allow_services {
        agent = agent.allow_services();
    }
    if let Some(n) = args.flows_per_process {
        agent = agent.with_flows_per_process(n);
    }
    if let Some(ip) = &args.data_bind {
        let ip: IpAddr = ip
            .parse()
            .with_context(|| format!("--data-bind {ip:?} is not an IP address"))?;
        if !ip.is_loopback() && args.key.is_none() {
            return Err(anyhow!(
                "refusing data listeners on {ip} without --key: other hosts could connect to them; make a key with `netgap key new FILE` and pass --key FILE on both ends"
            ));
        }
        agent = agent.with_data_ip(ip);
    }
    if let Some(relay) = relay {
        agent = agent.with_relay(relay);
    }
    let keyed = key.is_some();
    if let Some(key) = key {
        agent = agent.with_key(key);
    }
    let shown = match &control {
        ControlAddr::Tcp(_) => agent
            .local_addr()
            .context("reading the listening address")?
            .to_string(),
        ControlAddr::Unix(_) => control.to_string(),
    };
    println!(
        "netgap agent {} listening on {shown}{}",
        netgap::VERSION,
        if keyed { " (key required)" } else { "" }
    );
    agent.serve().context("serving")?;
    Ok(())
}

/// `netgap key new`: a new key file.
pub(crate) fn new_key(file: &std::path::Path) -> Result<()> {
    netgap::auth::new_key_file(file)?;
    println!("wrote a new key to {}", file.display());
    Ok(())
}
