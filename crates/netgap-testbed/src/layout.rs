//! Where everything of a testbed is: its links, addresses and interfaces,
//! the hosts file that describes them, where each link is shaped, and the
//! permanent neighbours of the links after the first.

use crate::command::ns_prefix;
use crate::{state_dir, Params, Topology};
use netgap_core::hosts::{ControlAddr, HostEntry, HostsFile, LinkEntry, HOSTS_FILE_VERSION};
use std::net::{IpAddr, Ipv4Addr};

/// One planned link end, for the hosts file and the build.
pub(crate) struct LinkPlan {
    /// Its number among all the testbed's links: its namespace is `lID`.
    pub(crate) id: u32,
    pub(crate) a: u32,
    pub(crate) b: u32,
    pub(crate) index: u32,
    pub(crate) a_if: String,
    pub(crate) b_if: String,
    pub(crate) a_ip: Ipv4Addr,
    pub(crate) b_ip: Ipv4Addr,
}

/// The links of a mesh testbed (none on a switch, whose host pairs may
/// outnumber the subnets a mesh numbers them into).
pub(crate) fn mesh_links(p: &Params) -> Vec<LinkPlan> {
    let mut out = Vec::new();
    if p.topology != Topology::Mesh {
        return out;
    }
    let mut pair = 0u8;
    for a in 1..=p.hosts {
        for b in a + 1..=p.hosts {
            pair += 1;
            for k in 0..p.links {
                let net = 80 + k as u8;
                out.push(LinkPlan {
                    id: out.len() as u32,
                    a,
                    b,
                    index: k,
                    a_if: format!("p{b}l{k}"),
                    b_if: format!("p{a}l{k}"),
                    a_ip: Ipv4Addr::new(10, net, pair, 1),
                    b_ip: Ipv4Addr::new(10, net, pair, 2),
                });
            }
        }
    }
    out
}

/// The address of host `host` on switch link `link`: 10.77.link.host.
pub(crate) fn switch_ip(link: u32, host: u32) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, link as u8, host as u8)
}

/// The namespace of switch link `link` of a testbed with namespace prefix
/// `prefix`: `sw` for the first (as before a switch could have more),
/// `swK` for the others.
pub(crate) fn switch_netns(prefix: &str, link: u32) -> String {
    if link == 0 {
        format!("{prefix}sw")
    } else {
        format!("{prefix}sw{link}")
    }
}

/// A host's interface on switch link `link`.
pub(crate) fn switch_if(link: u32) -> String {
    format!("eth{link}")
}

/// The hosts file the testbed `name` with `p` is described by.
pub(crate) fn hosts_file(name: &str, p: &Params) -> HostsFile {
    let dir = state_dir(name);
    let prefix = ns_prefix(name);
    let links = mesh_links(p);
    let hosts = (1..=p.hosts)
        .map(|h| {
            let mut ends: Vec<LinkEntry> = Vec::new();
            // One switch link: the host's address is the one path, and the
            // hosts file stays as it always was.
            if p.topology == Topology::Switch && p.links > 1 {
                for peer in (1..=p.hosts).filter(|&o| o != h) {
                    for k in 0..p.links {
                        ends.push(LinkEntry {
                            peer: format!("h{peer}"),
                            index: k,
                            local: IpAddr::V4(switch_ip(k, h)),
                            remote: IpAddr::V4(switch_ip(k, peer)),
                            ifname: switch_if(k),
                            mtu_bytes: p.mtu_bytes,
                            rate_bps: p.rate_bps,
                        });
                    }
                }
            }
            if p.topology == Topology::Mesh {
                for l in &links {
                    let (peer, ifname, local, remote) = if l.a == h {
                        (l.b, &l.a_if, l.a_ip, l.b_ip)
                    } else if l.b == h {
                        (l.a, &l.b_if, l.b_ip, l.a_ip)
                    } else {
                        continue;
                    };
                    ends.push(LinkEntry {
                        peer: format!("h{peer}"),
                        index: l.index,
                        local: IpAddr::V4(local),
                        remote: IpAddr::V4(remote),
                        ifname: ifname.clone(),
                        mtu_bytes: p.mtu_bytes,
                        rate_bps: p.rate_bps,
                    });
                }
            }
            let address = match p.topology {
                Topology::Switch => IpAddr::V4(switch_ip(0, h)),
                // Every mesh host has at least one link (2 hosts or more).
                Topology::Mesh => ends
                    .first()
                    .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |l| l.local),
            };
            HostEntry {
                name: format!("h{h}"),
                control: ControlAddr::Unix(dir.join(format!("h{h}.sock"))).to_string(),
                address,
                netns: Some(format!("{prefix}h{h}")),
                links: ends,
            }
        })
        .collect();
    HostsFile {
        version: HOSTS_FILE_VERSION,
        topology: p.topology.as_str().into(),
        key_file: Some(dir.join("key")),
        hosts,
        testbed: Some(name.to_string()),
        conditions: Some(p.conditions()),
        forwarding: None,
        rate_scaled_from_bps: None,
    }
}

/// Every veth end of the testbed, `(namespace, interface)`: each host's
/// end and the shaping point facing it (on a switch its bridge port, of
/// each switch in turn, on a mesh the port of the link's own namespace).
/// MTU and offloads are the same on all of them.
pub(crate) fn link_ends(name: &str, p: &Params) -> Vec<(String, String)> {
    let prefix = ns_prefix(name);
    let mut ends = Vec::new();
    match p.topology {
        Topology::Switch => {
            for k in 0..p.links {
                let sw = switch_netns(&prefix, k);
                for h in 1..=p.hosts {
                    ends.push((format!("{prefix}h{h}"), switch_if(k)));
                    ends.push((sw.clone(), format!("h{h}")));
                }
            }
        }
        Topology::Mesh => {
            for l in mesh_links(p) {
                let mid = format!("{prefix}l{}", l.id);
                ends.push((format!("{prefix}h{}", l.a), l.a_if));
                ends.push((mid.clone(), format!("h{}", l.a)));
                ends.push((format!("{prefix}h{}", l.b), l.b_if));
                ends.push((mid, format!("h{}", l.b)));
            }
        }
    }
    ends
}

/// The shaping points, `(namespace, interface)`: the ports in the network
/// whose egress goes toward a host, where rate, delay and loss are applied.
pub(crate) fn shaping_points(name: &str, p: &Params) -> Vec<(String, String)> {
    let prefix = ns_prefix(name);
    link_ends(name, p)
        .into_iter()
        .filter(|(ns, _)| !is_host_netns(&prefix, ns))
        .collect()
}

/// Whether `ns` is a host's namespace (`PREFIXhN`).
fn is_host_netns(prefix: &str, ns: &str) -> bool {
    ns.strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('h'))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The bridges of the testbed, `(namespace, interface)`: each switch's,
/// or on a mesh the one in each link's namespace.
pub(crate) fn bridges(name: &str, p: &Params) -> Vec<(String, String)> {
    let prefix = ns_prefix(name);
    match p.topology {
        Topology::Switch => (0..p.links)
            .map(|k| (switch_netns(&prefix, k), "br0".into()))
            .collect(),
        Topology::Mesh => mesh_links(p)
            .iter()
            .map(|l| (format!("{prefix}l{}", l.id), "br0".into()))
            .collect(),
    }
}

/// The interface a host's relay takes for its xdp flows: its end of the
/// links after the first, when that is one interface (every link 1 of a
/// switch with `--links 2` or more, the one link 1 of a two-host mesh);
/// None otherwise (one link: the relay would take the TCP connections'
/// interface; a larger mesh: one interface per peer, no one to choose).
pub(crate) fn relay_interface(h: &HostEntry) -> Option<String> {
    let mut names: Vec<&str> = h
        .links
        .iter()
        .filter(|l| l.index == 1)
        .map(|l| l.ifname.as_str())
        .collect();
    names.sort_unstable();
    names.dedup();
    match names.as_slice() {
        [one] => Some((*one).to_string()),
        _ => None,
    }
}

/// The permanent neighbour entries of the testbed's links after the
/// first, per host namespace, as `ip -batch` lines, given each host's
/// interfaces' MACs (`macs[(host, interface)]`). A relay opens a flow
/// only to the MAC its host's neighbour table holds, and while a relay's
/// xdp port is open its interface's frames (ARP too) go to the relay, so
/// these links are never resolved by the kernel: the testbed states them.
pub(crate) fn neighbour_lines(
    hosts: &HostsFile,
    macs: &std::collections::HashMap<(String, String), String>,
) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for h in &hosts.hosts {
        let Some(ns) = &h.netns else { continue };
        let mut lines = Vec::new();
        for l in h.links.iter().filter(|l| l.index >= 1) {
            let peer_if = hosts
                .host(&l.peer)
                .and_then(|p| p.links_to(&h.name).find(|b| b.index == l.index))
                .map(|b| b.ifname.clone());
            let Some(mac) = peer_if.and_then(|i| macs.get(&(l.peer.clone(), i))) else {
                continue;
            };
            lines.push(format!(
                "neigh replace {} lladdr {mac} dev {} nud permanent",
                l.remote, l.ifname
            ));
        }
        if !lines.is_empty() {
            out.push((ns.clone(), lines));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::is_own_netns;
    use crate::{MAX_LINKS, MAX_MULTILINK_SWITCH_HOSTS, MAX_SWITCH_HOSTS};
    use std::path::PathBuf;

    fn params(topology: Topology, hosts: u32, links: u32) -> Params {
        Params {
            hosts,
            topology,
            links,
            mtu_bytes: 9000,
            rate_bps: Some(1_000_000_000),
            agent_exe: PathBuf::from("/bin/true"),
            offload: None,
            delay_us: None,
            loss_ppm: None,
            forwarding_bps: None,
        }
    }

    #[test]
    fn a_mesh_hosts_file_has_every_link_on_both_ends() {
        let p = params(Topology::Mesh, 3, 2);
        let f = hosts_file("t1", &p);
        assert_eq!(f.check(), Ok(()));
        assert_eq!(f.hosts.len(), 3);
        for h in &f.hosts {
            // Two peers, two links each.
            assert_eq!(h.links.len(), 4, "{}", h.name);
            for l in &h.links {
                let peer = f.host(&l.peer).expect("peer");
                let back = peer
                    .links_to(&h.name)
                    .find(|b| b.index == l.index)
                    .expect("the other end");
                assert_eq!((back.local, back.remote), (l.remote, l.local));
                assert_eq!(l.mtu_bytes, 9000);
            }
            assert_eq!(h.address, h.links[0].local);
            assert_eq!(h.netns.as_deref(), Some(&*format!("ngtb-t1-{}", h.name)));
        }
        let subnets: std::collections::HashSet<_> = f
            .hosts
            .iter()
            .flat_map(|h| h.links.iter().map(|l| l.local.to_string()))
            .map(|a| a.rsplit_once('.').map(|(n, _)| n.to_string()))
            .collect();
        assert_eq!(subnets.len(), 6, "each of 3 pairs x 2 links its own subnet");
    }

    #[test]
    fn relays_take_the_second_link_where_it_is_one_interface() {
        let on = |t, n, k| {
            hosts_file("t", &params(t, n, k))
                .hosts
                .iter()
                .map(relay_interface)
                .collect::<Vec<_>>()
        };
        let s = |v: &str| Some(v.to_string());
        assert_eq!(on(Topology::Mesh, 2, 2), [s("p2l1"), s("p1l1")]);
        assert_eq!(
            on(Topology::Switch, 3, 2),
            [s("eth1"), s("eth1"), s("eth1")]
        );
        assert_eq!(on(Topology::Switch, 3, 1), [None, None, None]);
        assert_eq!(on(Topology::Mesh, 2, 1), [None, None]);
        // One interface per peer: none to choose.
        assert_eq!(on(Topology::Mesh, 3, 2), [None, None, None]);
    }

    #[test]
    fn links_after_the_first_get_permanent_neighbours_with_the_peers_macs() {
        let f = hosts_file("t", &params(Topology::Mesh, 2, 2));
        let mut macs = std::collections::HashMap::new();
        for (h, dev, mac) in [
            ("h1", "p2l0", "02:00:00:00:01:00"),
            ("h1", "p2l1", "02:00:00:00:01:01"),
            ("h2", "p1l0", "02:00:00:00:02:00"),
            ("h2", "p1l1", "02:00:00:00:02:01"),
        ] {
            macs.insert((h.to_string(), dev.to_string()), mac.to_string());
        }
        let lines = neighbour_lines(&f, &macs);
        assert_eq!(
            lines,
            [
                (
                    "ngtb-t-h1".to_string(),
                    vec![
                        "neigh replace 10.81.1.2 lladdr 02:00:00:00:02:01 dev p2l1 nud permanent"
                            .to_string()
                    ]
                ),
                (
                    "ngtb-t-h2".to_string(),
                    vec![
                        "neigh replace 10.81.1.1 lladdr 02:00:00:00:01:01 dev p1l1 nud permanent"
                            .to_string()
                    ]
                ),
            ]
        );
        // A switch with two links: every other host on eth1.
        let f = hosts_file("t", &params(Topology::Switch, 3, 2));
        let mut macs = std::collections::HashMap::new();
        for h in 1..=3 {
            for k in 0..2 {
                macs.insert(
                    (format!("h{h}"), format!("eth{k}")),
                    format!("02:00:00:00:0{h}:0{k}"),
                );
            }
        }
        let lines = neighbour_lines(&f, &macs);
        assert_eq!(lines.len(), 3);
        assert_eq!(
            lines[0].1,
            [
                "neigh replace 10.77.1.2 lladdr 02:00:00:00:02:01 dev eth1 nud permanent",
                "neigh replace 10.77.1.3 lladdr 02:00:00:00:03:01 dev eth1 nud permanent"
            ]
        );
        // One link: nothing.
        assert!(neighbour_lines(&hosts_file("t", &params(Topology::Mesh, 2, 1)), &macs).is_empty());
    }

    #[test]
    fn a_switch_hosts_file_puts_every_host_on_one_subnet() {
        let f = hosts_file("testbed", &params(Topology::Switch, 4, 1));
        assert_eq!(f.check(), Ok(()));
        let addrs: Vec<String> = f.hosts.iter().map(|h| h.address.to_string()).collect();
        assert_eq!(addrs, ["10.77.0.1", "10.77.0.2", "10.77.0.3", "10.77.0.4"]);
        assert_eq!(f.hosts[0].control, "unix:/run/netgap/testbed/h1.sock");
        assert_eq!(f.key_file, Some(PathBuf::from("/run/netgap/testbed/key")));
        // A switch has no mesh links to number, however many host pairs.
        let big = hosts_file("testbed", &params(Topology::Switch, MAX_SWITCH_HOSTS, 1));
        assert_eq!(big.check(), Ok(()));
        assert_eq!(big.hosts.len(), MAX_SWITCH_HOSTS as usize);
        assert!(big.hosts.iter().all(|h| h.links.is_empty()));
        assert_eq!(big.hosts[249].address.to_string(), "10.77.0.250");
        assert_eq!(
            link_ends("testbed", &params(Topology::Switch, 64, 1)).len(),
            128
        );
    }

    /// A switch with one link is built and described exactly as it was
    /// before a switch could have more: studies and tests read its names,
    /// addresses and hosts file.
    #[test]
    fn a_one_link_switch_keeps_its_hosts_file_names_and_ends() {
        let p = params(Topology::Switch, 3, 1);
        let json = serde_json::to_string(&hosts_file("t1", &p)).expect("serializes");
        assert_eq!(
            json,
            concat!(
                r#"{"version":1,"topology":"switch","key_file":"/run/netgap/t1/key","hosts":["#,
                r#"{"name":"h1","control":"unix:/run/netgap/t1/h1.sock","address":"10.77.0.1","netns":"ngtb-t1-h1","links":[]},"#,
                r#"{"name":"h2","control":"unix:/run/netgap/t1/h2.sock","address":"10.77.0.2","netns":"ngtb-t1-h2","links":[]},"#,
                r#"{"name":"h3","control":"unix:/run/netgap/t1/h3.sock","address":"10.77.0.3","netns":"ngtb-t1-h3","links":[]}],"#,
                r#""testbed":"t1","conditions":{"mtu_bytes":9000,"offload":null,"rate_bps":1000000000,"#,
                r#""delay_us":null,"loss_ppm":null,"bucket_bytes":null,"loss_by":null}}"#
            )
        );
        let shown = |v: Vec<(String, String)>| -> Vec<String> {
            v.iter().map(|(n, d)| format!("{n}/{d}")).collect()
        };
        assert_eq!(
            shown(link_ends("t1", &p)),
            [
                "ngtb-t1-h1/eth0",
                "ngtb-t1-sw/h1",
                "ngtb-t1-h2/eth0",
                "ngtb-t1-sw/h2",
                "ngtb-t1-h3/eth0",
                "ngtb-t1-sw/h3"
            ]
        );
        assert_eq!(shown(bridges("t1", &p)), ["ngtb-t1-sw/br0"]);
        assert_eq!(
            shown(shaping_points("t1", &p)),
            ["ngtb-t1-sw/h1", "ngtb-t1-sw/h2", "ngtb-t1-sw/h3"]
        );
    }

    #[test]
    fn a_switch_with_two_links_is_two_switches_each_host_on_both() {
        let p = params(Topology::Switch, 3, 2);
        let f = hosts_file("t1", &p);
        assert_eq!(f.check(), Ok(()));
        let addrs: Vec<String> = f.hosts.iter().map(|h| h.address.to_string()).collect();
        assert_eq!(addrs, ["10.77.0.1", "10.77.0.2", "10.77.0.3"]);
        let h2 = &f.hosts[1];
        let shown: Vec<String> = h2
            .links
            .iter()
            .map(|l| {
                format!(
                    "{}#{} {} {}->{}",
                    l.peer, l.index, l.ifname, l.local, l.remote
                )
            })
            .collect();
        assert_eq!(
            shown,
            [
                "h1#0 eth0 10.77.0.2->10.77.0.1",
                "h1#1 eth1 10.77.1.2->10.77.1.1",
                "h3#0 eth0 10.77.0.2->10.77.0.3",
                "h3#1 eth1 10.77.1.2->10.77.1.3",
            ]
        );
        for h in &f.hosts {
            assert_eq!(h.links.len(), 4, "{}: two peers, two links each", h.name);
            for l in &h.links {
                let peer = f.host(&l.peer).expect("peer");
                let back = peer
                    .links_to(&h.name)
                    .find(|b| b.index == l.index)
                    .expect("the other end");
                assert_eq!((back.local, back.remote), (l.remote, l.local));
                assert_eq!(back.ifname, l.ifname);
                assert_eq!((l.mtu_bytes, l.rate_bps), (9000, Some(1_000_000_000)));
            }
        }
        let shown = |v: Vec<(String, String)>| -> Vec<String> {
            v.iter().map(|(n, d)| format!("{n}/{d}")).collect()
        };
        assert_eq!(
            shown(link_ends("t1", &p)),
            [
                "ngtb-t1-h1/eth0",
                "ngtb-t1-sw/h1",
                "ngtb-t1-h2/eth0",
                "ngtb-t1-sw/h2",
                "ngtb-t1-h3/eth0",
                "ngtb-t1-sw/h3",
                "ngtb-t1-h1/eth1",
                "ngtb-t1-sw1/h1",
                "ngtb-t1-h2/eth1",
                "ngtb-t1-sw1/h2",
                "ngtb-t1-h3/eth1",
                "ngtb-t1-sw1/h3",
            ]
        );
        assert_eq!(
            shown(bridges("t1", &p)),
            ["ngtb-t1-sw/br0", "ngtb-t1-sw1/br0"]
        );
        assert_eq!(
            shown(shaping_points("t1", &p)),
            [
                "ngtb-t1-sw/h1",
                "ngtb-t1-sw/h2",
                "ngtb-t1-sw/h3",
                "ngtb-t1-sw1/h1",
                "ngtb-t1-sw1/h2",
                "ngtb-t1-sw1/h3",
            ]
        );
        // `down` finds every switch by its name.
        for (ns, _) in bridges("t1", &params(Topology::Switch, 2, MAX_LINKS)) {
            assert!(is_own_netns("t1", &ns), "{ns}");
        }
        // The last switch's subnet is still 10.77's, below any mesh subnet.
        let last = hosts_file("t1", &params(Topology::Switch, 2, MAX_LINKS));
        let l = last.hosts[0].links.last().expect("a link");
        assert_eq!(
            (l.ifname.as_str(), l.local.to_string()),
            ("eth7", "10.77.7.1".to_string())
        );
    }

    #[test]
    fn the_largest_multilink_switch_hosts_file_fits_what_a_hosts_file_may_be() {
        let f = hosts_file(
            "testbed",
            &params(Topology::Switch, MAX_MULTILINK_SWITCH_HOSTS, MAX_LINKS),
        );
        assert_eq!(f.check(), Ok(()));
        let text = serde_json::to_string_pretty(&f).expect("serializes");
        assert!(
            (text.len() as u64) < netgap_core::files::Cap::HOSTS.max_bytes,
            "{} bytes",
            text.len()
        );
    }

    #[test]
    fn every_link_end_is_conditioned_and_shaped_in_the_network() {
        let ends = link_ends("t1", &params(Topology::Switch, 2, 1));
        let shown: Vec<String> = ends.iter().map(|(n, d)| format!("{n}/{d}")).collect();
        assert_eq!(
            shown,
            [
                "ngtb-t1-h1/eth0",
                "ngtb-t1-sw/h1",
                "ngtb-t1-h2/eth0",
                "ngtb-t1-sw/h2"
            ]
        );
        assert_eq!(
            bridges("t1", &params(Topology::Switch, 2, 1)),
            [("ngtb-t1-sw".to_string(), "br0".to_string())]
        );
        let shaped: Vec<String> = shaping_points("t1", &params(Topology::Switch, 2, 1))
            .iter()
            .map(|(n, d)| format!("{n}/{d}"))
            .collect();
        assert_eq!(shaped, ["ngtb-t1-sw/h1", "ngtb-t1-sw/h2"]);
        let mesh = params(Topology::Mesh, 3, 2);
        let ends = link_ends("testbed", &mesh);
        assert_eq!(
            ends.len(),
            3 * 2 * 4,
            "3 pairs, 2 links, 2 ends and 2 ports"
        );
        let shaped: Vec<String> = shaping_points("testbed", &mesh)
            .iter()
            .map(|(n, d)| format!("{n}/{d}"))
            .collect();
        assert_eq!(shaped.len(), 3 * 2 * 2);
        assert_eq!(
            shaped[..4],
            ["ngtb-l0/h1", "ngtb-l0/h2", "ngtb-l1/h1", "ngtb-l1/h2"]
        );
        assert_eq!(bridges("testbed", &mesh).len(), 6, "one per link");
        for (ns, _) in bridges("testbed", &mesh) {
            assert!(is_own_netns("testbed", &ns), "{ns}");
        }
    }
}
