/* The ring operations of libxdp's <xdp/xsk.h> are inline functions, not
 * symbols of the library: this file gives each one a symbol so the Rust
 * side calls libxdp's own code instead of a copy of it. Built only with
 * the `xdp` feature (build.rs). */

#include <stdarg.h>
#include <xdp/libxdp.h>
#include <xdp/xsk.h>
#include <bpf/libbpf.h>
#include <bpf/bpf.h>

__u32 netgap_xsk_prod_reserve(struct xsk_ring_prod *r, __u32 nb, __u32 *idx)
{
	return xsk_ring_prod__reserve(r, nb, idx);
}

void netgap_xsk_prod_submit(struct xsk_ring_prod *r, __u32 nb)
{
	xsk_ring_prod__submit(r, nb);
}

__u64 *netgap_xsk_fill_addr(struct xsk_ring_prod *r, __u32 idx)
{
	return xsk_ring_prod__fill_addr(r, idx);
}

struct xdp_desc *netgap_xsk_tx_desc(struct xsk_ring_prod *r, __u32 idx)
{
	return xsk_ring_prod__tx_desc(r, idx);
}

int netgap_xsk_needs_wakeup(const struct xsk_ring_prod *r)
{
	return xsk_ring_prod__needs_wakeup(r);
}

__u32 netgap_xsk_cons_peek(struct xsk_ring_cons *r, __u32 nb, __u32 *idx)
{
	return xsk_ring_cons__peek(r, nb, idx);
}

void netgap_xsk_cons_release(struct xsk_ring_cons *r, __u32 nb)
{
	xsk_ring_cons__release(r, nb);
}

/* Whether a consumer ring holds an entry: one load of the producer index
 * when the cached view is empty, no system call (a poll-mode waiter's
 * cheap look before a whole pump). */
int netgap_xsk_cons_ready(struct xsk_ring_cons *r)
{
	return xsk_cons_nb_avail(r, 1) > 0;
}

const __u64 *netgap_xsk_comp_addr(const struct xsk_ring_cons *r, __u32 idx)
{
	return xsk_ring_cons__comp_addr(r, idx);
}

const struct xdp_desc *netgap_xsk_rx_desc(const struct xsk_ring_cons *r, __u32 idx)
{
	return xsk_ring_cons__rx_desc(r, idx);
}

/* Attaches XDP program `prog_fd` to interface `ifindex` in the mode of
 * `xdp_flags` through a BPF link: the program stays while the link's
 * descriptor is open and goes with it, the process's death included.
 * Here because libbpf's options structure is versioned by its size, which
 * LIBBPF_OPTS fills in for the libbpf built against. Returns the link's
 * descriptor or -errno. */
int netgap_xdp_link(int prog_fd, int ifindex, __u32 xdp_flags)
{
	LIBBPF_OPTS(bpf_link_create_opts, opts, .flags = xdp_flags);
	return bpf_link_create(prog_fd, ifindex, BPF_XDP, &opts);
}

static int quiet_libxdp(enum libxdp_print_level level, const char *fmt, va_list args)
{
	(void)level;
	(void)fmt;
	(void)args;
	return 0;
}

static int quiet_libbpf(enum libbpf_print_level level, const char *fmt, va_list args)
{
	(void)level;
	(void)fmt;
	(void)args;
	return 0;
}

/* libxdp and libbpf print their diagnostics to stderr; netgap reports a
 * failure in one line of its own instead. */
void netgap_xdp_quiet(void)
{
	libxdp_set_print(quiet_libxdp);
	libbpf_set_print(quiet_libbpf);
}
