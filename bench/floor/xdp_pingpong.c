/* xdp_pingpong.c - AF_XDP ping-pong latency floor between two hosts (two
 * network namespaces joined by veth, as a netgap testbed makes them), over
 * libxdp's rings in copy mode.
 *
 * Server: xdp_pingpong -s -i IFACE -d PEER_MAC [-C CPU] [-e] [-T DEADLINE_S]
 * Client: xdp_pingpong -i IFACE -d PEER_MAC [-m 1,1k,32k] [-n ITERS]
 *                      [-w WARMUP] [-C CPU] [-e] [-T DEADLINE_S] [-k]
 *
 * A message of N bytes goes as ceil(N / (MTU - 4)) Ethernet frames, each
 * a 4-byte message length and up to MTU - 4 bytes of it, copied out of a
 * page-aligned private buffer into transmit frames and, at the other end,
 * out of the received frames into another one.  The server reads a whole
 * message and sends one of the same length back; a message of length 0
 * tells it to exit (sent at the end unless -k).  Nothing more: no sequence
 * numbers, acknowledgments, retransmission, flow control or authenticator,
 * so a lost frame ends the run with an error (a ping-pong has one message
 * in flight, which an unshaped veth link does not lose in practice).
 * Waiting spins on the RX ring (-e: sleeps in poll() on the socket).
 * Prints "ready" once the socket is bound, then one line per size, as
 * pingpong does, labelled xdp_pingpong.
 */
#include "xsk_floor.h"

#define MAXMSG (1u << 20)
#define QUIT_TRIES 5

static unsigned payload_per_frame(const char *ifname)
{
	char path[128];
	snprintf(path, sizeof(path), "/sys/class/net/%s/mtu", ifname);
	FILE *f = fopen(path, "r");
	unsigned mtu = 0;
	if (!f || fscanf(f, "%u", &mtu) != 1)
		die(path);
	fclose(f);
	if (mtu + ETH_HDR > FRAME_BYTES)
		mtu = FRAME_BYTES - ETH_HDR;
	return mtu - 4;
}

static void send_msg(struct xsk *x, const char *buf, uint32_t n, unsigned per_frame)
{
	uint32_t off = 0;
	do {
		uint32_t k = n - off < per_frame ? n - off : per_frame;
		uint64_t addr = xsk_tx_frame(x);
		char *f = xsk_frame(x, addr);
		memcpy(f + ETH_HDR, &n, 4);
		memcpy(f + ETH_HDR + 4, buf + off, k);
		off += k;
		xsk_send(x, addr, ETH_HDR + 4 + k, 0);
	} while (off < n);
	xsk_flush(x);
}

/* Receives one whole message into buf; returns its length, or -1 if
 * nothing came within timeout_ms. */
static int64_t recv_msg(struct xsk *x, char *buf, int timeout_ms)
{
	uint64_t want = UINT64_MAX, got = 0;
	while (got < want) {
		if (!xsk_wait_rx(x, timeout_ms))
			return -1;
		__u32 idx = 0, n = xsk_ring_cons__peek(&x->rx, 64, &idx);
		for (__u32 i = 0; i < n; i++) {
			const struct xdp_desc *d = xsk_ring_cons__rx_desc(&x->rx, idx + i);
			const char *f = xsk_umem__get_data(x->area, xsk_umem__add_offset_to_addr(d->addr));
			uint16_t et;
			memcpy(&et, f + 12, 2);
			if (d->len >= ETH_HDR + 4 && ntohs(et) == FLOOR_ETHERTYPE) {
				uint32_t total, k = d->len - ETH_HDR - 4;
				memcpy(&total, f + ETH_HDR, 4);
				if (total > MAXMSG || got + k > total) {
					fprintf(stderr, "error: a frame past its message's end "
							"(message %u bytes, %llu already)\n",
						total, (unsigned long long)got);
					exit(4);
				}
				want = total;
				memcpy(buf + got, f + ETH_HDR + 4, k);
				got += k;
			}
		}
		xsk_recycle(x, idx, n);
	}
	return (int64_t)got;
}

static void drain(struct xsk *x)
{
	__u32 idx = 0, n;
	while ((n = xsk_ring_cons__peek(&x->rx, 64, &idx)) > 0)
		xsk_recycle(x, idx, n);
}

int main(int argc, char **argv)
{
	const char *ifname = NULL, *peer = NULL, *sizes = "1,1k,32k";
	size_t iters = 100000, warmup = 10000;
	int server = 0, cpu = -1, event = 0, keep = 0;
	unsigned deadline = 300;
	int o;
	while ((o = getopt(argc, argv, "si:d:m:n:w:C:eT:k")) != -1) {
		switch (o) {
		case 's': server = 1; break;
		case 'i': ifname = optarg; break;
		case 'd': peer = optarg; break;
		case 'm': sizes = optarg; break;
		case 'n': iters = strtoull(optarg, NULL, 0); break;
		case 'w': warmup = strtoull(optarg, NULL, 0); break;
		case 'C': cpu = atoi(optarg); break;
		case 'e': event = 1; break;
		case 'T': deadline = (unsigned)atoi(optarg); break;
		case 'k': keep = 1; break;
		default:
			fprintf(stderr, "usage: %s [-s] -i IFACE -d PEER_MAC [-m SIZES] [-n ITERS]\n",
				argv[0]);
			return 1;
		}
	}
	if (!ifname || !peer) {
		fprintf(stderr, "error: give -i IFACE and -d PEER_MAC\n");
		return 1;
	}
	arm_deadline(deadline);
	pin_cpu(cpu);
	unsigned per_frame = payload_per_frame(ifname);
	static struct xsk x;
	xsk_open(&x, ifname, peer, event);
	char *buf = page_buf(MAXMSG), *in = page_buf(MAXMSG);
	memset(buf, 'x', MAXMSG);
	printf("ready xdp iface=%s attach=%s copy mode, %u payload bytes per frame, %s\n", ifname,
	       x.attach, per_frame, event ? "event (poll())" : "poll (spinning)");
	fflush(stdout);
	if (server) {
		for (;;) {
			int64_t n = recv_msg(&x, in, 1000);
			if (n < 0)
				continue;
			if (n == 0)
				break;
			send_msg(&x, in, (uint32_t)n, per_frame);
		}
		xsk_close(&x);
		return 0;
	}
	/* the server may still be setting up: one-byte probes until one comes
	 * back, then anything late is drained */
	int up = 0;
	for (int i = 0; i < 100 && !up; i++) {
		send_msg(&x, buf, 1, per_frame);
		up = recv_msg(&x, in, 100) == 1;
	}
	if (!up) {
		fprintf(stderr, "error: no answer from %s through %s\n", peer, ifname);
		return 4;
	}
	usleep(50000);
	drain(&x);
	uint64_t *samples = malloc(iters * sizeof(uint64_t));
	if (!samples)
		die("malloc");
	char *list = strdup(sizes);
	for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
		size_t n = parse_size(tok);
		if (n < 1 || n > MAXMSG) {
			fprintf(stderr, "error: message size %zu outside 1..%u bytes\n", n, MAXMSG);
			return 1;
		}
		size_t it = n > 4096 ? (iters + 9) / 10 : iters;
		uint64_t t0 = 0, prev = 0;
		for (size_t i = 0; i < warmup + it; i++) {
			if (i == warmup)
				t0 = prev = now_ns();
			send_msg(&x, buf, (uint32_t)n, per_frame);
			if (recv_msg(&x, in, 2000) != (int64_t)n) {
				fprintf(stderr, "error: no whole %zu-byte reply within 2 s "
						"(a frame was lost)\n", n);
				return 4;
			}
			if (i >= warmup) {
				uint64_t t = now_ns();
				samples[i - warmup] = t - prev;
				prev = t;
			}
		}
		report_rtt("xdp_pingpong", n, samples, it, prev - t0);
	}
	if (!keep)
		for (int i = 0; i < QUIT_TRIES; i++)
			send_msg(&x, buf, 0, per_frame);
	usleep(10000);
	xsk_close(&x);
	return 0;
}
