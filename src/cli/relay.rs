//! Flags of `netgap relay`, and the relay's config made from them.

use anyhow::{anyhow, Result};
use netgap::relay::{RelayConfig, RelayOptions};
use std::path::PathBuf;

/// Flags of `netgap relay`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct RelayArgs {
    /// The interface the relay's xdp flows take (required): its xdp
    /// listens bind the interface's IPv4 address, and it opens flows only
    /// to addresses on the interface's subnet, at the MAC the kernel's
    /// neighbour table holds for each. Never the interface of the TCP
    /// connections it carries: while a flow is open, every frame of the
    /// interface's queue goes to the relay.
    #[arg(long, value_name = "NAME")]
    pub interface: Option<String>,
    /// The hosts whose connections the relay carries (required): their
    /// TCP addresses, each an address or a prefix, comma-separated
    /// (`10.77.0.2,10.78.0.0/16`). A connection to any other host, to this
    /// host or over loopback is refused.
    #[arg(long, value_name = "IP[/LEN],...", value_delimiter = ',')]
    pub peers: Vec<String>,
    /// The relays' shared key (required): a key file as `netgap key new
    /// FILE` makes it (mode 0600), the same for every relay its programs
    /// reach. Each link between two relays is keyed from it and from what
    /// names the link.
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Requests one user's programs may make a second (and at once):
    /// every connection to the relay's socket counts, a library's check
    /// that the relay runs too (a relayed connection costs its connector
    /// two).
    #[arg(long, default_value_t = 1000)]
    pub max_requests_per_uid: u32,
    /// Most connections one user's programs may have through the relay.
    #[arg(long, default_value_t = 16)]
    pub max_per_uid: u32,
    /// Most connections through the relay in all.
    #[arg(long, default_value_t = 64)]
    pub max_total: u32,
    /// Most links (other hosts' relays) held at once. Each is one flow on
    /// the interface's xdp port, which holds at most 256 flows and
    /// listeners.
    #[arg(long, default_value_t = 64)]
    pub max_links: u32,
    /// A link with no frame from the other relay for this long is broken
    /// (the relays send a keep-alive every third of it), in milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub timeout_ms: u64,
    /// Refuse direct connections: every connection stays on the relay's
    /// path. By default the relay makes a direct connection's program an
    /// AF_XDP socket of its own, on a queue of the connection's own that
    /// the steering limits to that connection's frames, and hands it
    /// over; the relay keeps only its setup.
    #[arg(long)]
    pub no_direct: bool,
    /// Most direct connections' queues one user's programs may hold at
    /// once (never every queue of the interface): half of a 32-queue
    /// link's by default, so a web client's workers all go direct and
    /// another user still finds queues.
    #[arg(long, default_value_t = 16)]
    pub max_direct_per_uid: u32,
}

impl RelayArgs {
    /// The relay's config: the flags checked, then the key file read.
    pub(crate) fn config(&self) -> Result<RelayConfig> {
        let options = RelayOptions {
            interface: self.interface.clone(),
            peers: self.peers.clone(),
            max_requests_per_uid: self.max_requests_per_uid,
            max_per_uid: self.max_per_uid,
            max_total: self.max_total,
            max_links: self.max_links,
            timeout_ms: self.timeout_ms,
            direct: !self.no_direct,
            max_direct_per_uid: self.max_direct_per_uid,
        };
        let Some(key_file) = &self.key else {
            return Err(anyhow!(
                "relay: --key FILE is required: the links between relays are keyed from it (make one with `netgap key new FILE` and give every relay the same)"
            ));
        };
        let key = netgap::auth::load_key(key_file).map_err(|e| anyhow!("relay: --key: {e}"))?;
        Ok(RelayConfig::new(options, key)?)
    }
}
