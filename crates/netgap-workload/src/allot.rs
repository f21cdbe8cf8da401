//! Cyclic allotment of clients to client hosts: client `i` runs on client
//! host `i % hosts`, so 3 clients over 3 hosts are one each, 6 are two
//! each and 4 are 2, 1, 1 (the seeds' placement).

/// The client host of each client: `allot(clients, hosts)[i]` is the index
/// of the host that runs client `i`. Empty when `hosts` is 0.
pub(crate) fn allot(clients: u32, hosts: u32) -> Vec<u32> {
    if hosts == 0 {
        return Vec::new();
    }
    (0..clients).map(|i| i % hosts).collect()
}

/// Clients per host under [`allot`]: `counts(clients, hosts)[h]` clients run
/// on host `h`.
#[cfg(test)]
fn counts(clients: u32, hosts: u32) -> Vec<u32> {
    let mut c = vec![0; hosts as usize];
    for h in allot(clients, hosts) {
        c[h as usize] += 1;
    }
    c
}

/// The clients of host `host` under [`allot`], in increasing order.
pub(crate) fn clients_of(clients: u32, hosts: u32, host: u32) -> Vec<u32> {
    allot(clients, hosts)
        .into_iter()
        .enumerate()
        .filter(|&(_, h)| h == host)
        .map(|(i, _)| i as u32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_over_three_is_one_each() {
        assert_eq!(counts(3, 3), vec![1, 1, 1]);
        assert_eq!(allot(3, 3), vec![0, 1, 2]);
    }

    #[test]
    fn six_over_three_is_two_each() {
        assert_eq!(counts(6, 3), vec![2, 2, 2]);
        assert_eq!(clients_of(6, 3, 1), vec![1, 4]);
    }

    #[test]
    fn four_over_three_is_two_one_one() {
        assert_eq!(counts(4, 3), vec![2, 1, 1]);
        assert_eq!(clients_of(4, 3, 0), vec![0, 3]);
    }

    #[test]
    fn fewer_clients_than_hosts_leave_hosts_idle() {
        assert_eq!(counts(2, 3), vec![1, 1, 0]);
        assert!(allot(5, 0).is_empty());
    }
}
