/* xsk_floor.h - the AF_XDP socket of the xdp floor programs: one UMEM and
 * its four rings over libxdp, bound to queue 0 of an interface in copy mode
 * (XDP_COPY; veth has no zero-copy), libxdp's default program attached in
 * the driver (native XDP) or, where the driver refuses, at the generic hook:
 * the same choices as netgap's xdp transport, so the two are compared on the
 * same path.  Frames are raw Ethernet frames of EtherType 0x88b5 (IEEE's
 * local experimental one, as netgap's) between two MAC addresses; anything
 * else arriving on the queue is given back to the fill ring unread.
 *
 * The UMEM holds NUM_FRAMES frames of FRAME_BYTES: the first half is lent
 * to the kernel through the fill ring for receiving, the second half is a
 * stack of free transmit frames, refilled from the completion ring.
 */
#ifndef XSK_FLOOR_H
#define XSK_FLOOR_H

#include "common.h"
#include <arpa/inet.h>
#include <bpf/libbpf.h>
#include <stdarg.h>
#include <linux/if_link.h>
#include <linux/if_xdp.h>
#include <net/if.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <xdp/libxdp.h>
#include <xdp/xsk.h>

#define NUM_FRAMES 4096u
#define FRAME_BYTES 4096u
#define RING_ENTRIES 2048u
#define RX_FRAMES (NUM_FRAMES / 2)
#define ETH_HDR 14
#define FLOOR_ETHERTYPE 0x88b5

struct xsk {
	struct xsk_ring_prod fill, tx;
	struct xsk_ring_cons comp, rx;
	struct xsk_umem *umem;
	struct xsk_socket *sock;
	char *area;
	int fd;
	int event; /* wait in poll() instead of spinning */
	uint64_t free_tx[NUM_FRAMES - RX_FRAMES];
	unsigned n_free;
	unsigned char src[6], dst[6];
	const char *attach;
};

static int parse_mac(const char *s, unsigned char *m)
{
	return sscanf(s, "%hhx:%hhx:%hhx:%hhx:%hhx:%hhx", &m[0], &m[1], &m[2], &m[3], &m[4],
		      &m[5]) == 6 ? 0 : -1;
}

static void xsk_fail(const char *what, int err)
{
	fprintf(stderr, "error: %s: %s\n", what, strerror(err < 0 ? -err : err));
	exit(2);
}

/* libxdp and libbpf print their diagnostics (no bpffs, so no dispatcher;
 * sections they skip) to stderr; the program reports a failure itself. */
static int quiet_libxdp(enum libxdp_print_level l, const char *f, va_list a)
{
	(void)l; (void)f; (void)a;
	return 0;
}

static int quiet_libbpf(enum libbpf_print_level l, const char *f, va_list a)
{
	(void)l; (void)f; (void)a;
	return 0;
}

static int xsk_try(struct xsk *x, const char *ifname, __u32 xdp_flags)
{
	struct xsk_socket_config scfg = {
		.rx_size = RING_ENTRIES,
		.tx_size = RING_ENTRIES,
		.libxdp_flags = 0,
		.xdp_flags = xdp_flags,
		.bind_flags = XDP_COPY | XDP_USE_NEED_WAKEUP,
	};
	return xsk_socket__create(&x->sock, ifname, 0, x->umem, &x->rx, &x->tx, &scfg);
}

static void xsk_open(struct xsk *x, const char *ifname, const char *dst_mac, int event)
{
	memset(x, 0, sizeof(*x));
	x->event = event;
	libxdp_set_print(quiet_libxdp);
	libbpf_set_print(quiet_libbpf);
	if (parse_mac(dst_mac, x->dst))
		xsk_fail("peer MAC (give aa:bb:cc:dd:ee:ff)", EINVAL);
	char path[128];
	snprintf(path, sizeof(path), "/sys/class/net/%s/address", ifname);
	FILE *f = fopen(path, "r");
	char line[64];
	if (!f || !fgets(line, sizeof(line), f) || parse_mac(line, x->src))
		xsk_fail(path, errno ? errno : EINVAL);
	fclose(f);
	size_t bytes = (size_t)NUM_FRAMES * FRAME_BYTES;
	x->area = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (x->area == MAP_FAILED)
		die("mmap");
	struct xsk_umem_config ucfg = {
		.fill_size = RING_ENTRIES,
		.comp_size = RING_ENTRIES,
		.frame_size = FRAME_BYTES,
		.frame_headroom = 0,
		.flags = 0,
	};
	int rc = xsk_umem__create(&x->umem, x->area, bytes, &x->fill, &x->comp, &ucfg);
	if (rc)
		xsk_fail("xsk_umem__create", rc);
	/* a socket of an earlier run may still hold the queue for a moment */
	for (int i = 0; i < 200; i++) {
		rc = xsk_try(x, ifname, XDP_FLAGS_DRV_MODE);
		x->attach = "native";
		if (rc) {
			rc = xsk_try(x, ifname, XDP_FLAGS_SKB_MODE);
			x->attach = "generic";
		}
		if (rc != -EBUSY)
			break;
		usleep(10000);
	}
	if (rc)
		xsk_fail("xsk_socket__create (queue 0, copy mode)", rc);
	x->fd = xsk_socket__fd(x->sock);
	__u32 idx;
	if (xsk_ring_prod__reserve(&x->fill, RX_FRAMES, &idx) != RX_FRAMES)
		xsk_fail("filling the fill ring", ENOSPC);
	for (__u32 i = 0; i < RX_FRAMES; i++)
		*xsk_ring_prod__fill_addr(&x->fill, idx + i) = (uint64_t)i * FRAME_BYTES;
	xsk_ring_prod__submit(&x->fill, RX_FRAMES);
	for (unsigned i = 0; i < NUM_FRAMES - RX_FRAMES; i++)
		x->free_tx[x->n_free++] = (uint64_t)(RX_FRAMES + i) * FRAME_BYTES;
}

static void xsk_close(struct xsk *x)
{
	xsk_socket__delete(x->sock);
	xsk_umem__delete(x->umem);
	munmap(x->area, (size_t)NUM_FRAMES * FRAME_BYTES);
}

/* Takes back the transmit frames the kernel has sent. */
static void xsk_reap(struct xsk *x)
{
	__u32 idx, n = xsk_ring_cons__peek(&x->comp, RING_ENTRIES, &idx);
	for (__u32 i = 0; i < n; i++)
		x->free_tx[x->n_free++] = *xsk_ring_cons__comp_addr(&x->comp, idx + i);
	if (n)
		xsk_ring_cons__release(&x->comp, n);
}

/* In copy mode the kernel transmits only inside a system call: the kick. */
static void xsk_kick(struct xsk *x)
{
	if (!xsk_ring_prod__needs_wakeup(&x->tx))
		return;
	if (sendto(x->fd, NULL, 0, MSG_DONTWAIT, NULL, 0) < 0 && errno != EAGAIN &&
	    errno != EBUSY && errno != ENOBUFS && errno != ENETDOWN)
		die("sendto (transmit kick)");
}

/* Kicks until the kernel has taken every queued transmit descriptor: in
 * copy mode one kick sends at most 32 frames (the kernel's budget per
 * socket and call). */
static void xsk_flush(struct xsk *x)
{
	while (xsk_prod_nb_free(&x->tx, RING_ENTRIES) < RING_ENTRIES) {
		if (sendto(x->fd, NULL, 0, MSG_DONTWAIT, NULL, 0) < 0 && errno != EAGAIN &&
		    errno != EBUSY && errno != ENOBUFS && errno != ENETDOWN)
			die("sendto (transmit kick)");
		xsk_reap(x);
	}
}

/* A free transmit frame's address, waiting for completions if none is. */
static uint64_t xsk_tx_frame(struct xsk *x)
{
	while (x->n_free == 0) {
		xsk_reap(x);
		if (x->n_free == 0)
			xsk_kick(x);
	}
	return x->free_tx[--x->n_free];
}

/* Queues one frame of `len` bytes built at `addr`; `kick` rings the
 * doorbell now (else the caller does after a batch). */
static void xsk_send(struct xsk *x, uint64_t addr, uint32_t len, int kick)
{
	__u32 idx;
	while (xsk_ring_prod__reserve(&x->tx, 1, &idx) != 1) {
		xsk_kick(x);
		xsk_reap(x);
	}
	struct xdp_desc *d = xsk_ring_prod__tx_desc(&x->tx, idx);
	d->addr = addr;
	d->len = len;
	xsk_ring_prod__submit(&x->tx, 1);
	if (kick)
		xsk_kick(x);
}

/* Writes the Ethernet header at the start of a transmit frame. */
static char *xsk_frame(struct xsk *x, uint64_t addr)
{
	char *f = xsk_umem__get_data(x->area, addr);
	memcpy(f, x->dst, 6);
	memcpy(f + 6, x->src, 6);
	uint16_t et = htons(FLOOR_ETHERTYPE);
	memcpy(f + 12, &et, 2);
	return f;
}

/* Gives the n frames just peeked from the RX ring at idx back to the
 * kernel through the fill ring, in one batch, and releases them. (The fill
 * ring has room: it and the RX ring together hold at most RX_FRAMES.) */
static void xsk_recycle(struct xsk *x, __u32 idx, __u32 n)
{
	__u32 fidx;
	if (n == 0)
		return;
	while (xsk_ring_prod__reserve(&x->fill, n, &fidx) != n)
		;
	for (__u32 i = 0; i < n; i++) {
		uint64_t addr = xsk_ring_cons__rx_desc(&x->rx, idx + i)->addr;
		*xsk_ring_prod__fill_addr(&x->fill, fidx + i) = addr & ~(uint64_t)(FRAME_BYTES - 1);
	}
	xsk_ring_prod__submit(&x->fill, n);
	xsk_ring_cons__release(&x->rx, n);
}

/* Waits until the RX ring holds a frame, for at most timeout_ms (spinning
 * in poll mode, in poll() in event mode); returns 0 on timeout. */
static int xsk_wait_rx(struct xsk *x, int timeout_ms)
{
	if (xsk_cons_nb_avail(&x->rx, 1))
		return 1;
	uint64_t end = now_ns() + (uint64_t)timeout_ms * 1000000ull;
	for (unsigned spins = 0;; spins++) {
		if (x->event) {
			struct pollfd p = {.fd = x->fd, .events = POLLIN};
			if (poll(&p, 1, timeout_ms) < 0 && errno != EINTR)
				die("poll");
		} else if (xsk_ring_prod__needs_wakeup(&x->fill)) {
			recvfrom(x->fd, NULL, 0, MSG_DONTWAIT, NULL, NULL);
		}
		if (xsk_cons_nb_avail(&x->rx, 1))
			return 1;
		if ((spins & 1023) == 0 && now_ns() > end)
			return 0;
	}
}

#endif
