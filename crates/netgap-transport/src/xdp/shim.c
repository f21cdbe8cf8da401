/* What the Rust side cannot call in libbpf and libxdp directly: a BPF
 * link made with an options structure libbpf versions by its size, and
 * the libraries' printing turned off. Built only with the `xdp` feature
 * (build.rs); the ring operations are Rust's (sys/ring.rs). */

#include <stdarg.h>
#include <xdp/libxdp.h>
#include <bpf/libbpf.h>
#include <bpf/bpf.h>

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
