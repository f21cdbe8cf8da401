/* xdp_stream.c - AF_XDP stream floor between two hosts (network namespaces
 * joined by veth), over libxdp's rings in copy mode: the sender fills
 * frames of -l payload bytes (default: the link's MTU) as fast as the
 * transmit ring and its doorbell take them for -t seconds; the receiver
 * counts what arrived.
 *
 * Receiver: xdp_stream -s -i IFACE -d PEER_MAC [-C CPU] [-e] [-T DEADLINE_S]
 * Sender:   xdp_stream -i IFACE -d PEER_MAC [-l BYTES] [-t SECONDS] [-C CPU]
 *                      [-e] [-T DEADLINE_S]
 *
 * Each frame is an Ethernet header, a 4-byte tag and the payload, copied
 * from a page-aligned private buffer on one side and into one on the
 * other.  There is no flow control: what the receiver's ring cannot take
 * is lost, counted and not recovered (netgap's xdp holds its sender back
 * with credit instead).  At the end the sender sends end frames until the
 * receiver answers with its count and prints one line:
 *   xdp_stream payload=N secs=S sent_bytes=.. sent_gbps=.. recv_bytes=..
 *   recv_gbps=.. lost_pct=..
 * recv_gbps is payload that arrived over the receiver's time from its first
 * frame to its last.
 */
#include "xsk_floor.h"

#define TAG_DATA 0u
#define TAG_END 1u
#define TAG_COUNT 2u
#define BATCH 32u /* frames one transmit kick sends in copy mode */

struct count {
	uint64_t bytes, frames, first_ns, last_ns;
};

static unsigned link_payload(const char *ifname)
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

static void send_tagged(struct xsk *x, uint32_t tag, const void *p, uint32_t n)
{
	uint64_t addr = xsk_tx_frame(x);
	char *f = xsk_frame(x, addr);
	memcpy(f + ETH_HDR, &tag, 4);
	memcpy(f + ETH_HDR + 4, p, n);
	xsk_send(x, addr, ETH_HDR + 4 + n, 0);
	xsk_flush(x);
}

/* Takes what the RX ring holds: data is counted and copied into buf, the
 * first frame of another tag is copied to *other; returns that tag or
 * TAG_DATA. */
static uint32_t take(struct xsk *x, struct count *c, char *buf, void *other, size_t other_n)
{
	uint32_t seen = TAG_DATA;
	__u32 idx = 0, n = xsk_ring_cons__peek(&x->rx, BATCH, &idx);
	uint64_t t = n ? now_ns() : 0;
	for (__u32 i = 0; i < n; i++) {
		const struct xdp_desc *d = xsk_ring_cons__rx_desc(&x->rx, idx + i);
		const char *f = xsk_umem__get_data(x->area, xsk_umem__add_offset_to_addr(d->addr));
		uint16_t et;
		memcpy(&et, f + 12, 2);
		if (d->len >= ETH_HDR + 4 && ntohs(et) == FLOOR_ETHERTYPE) {
			uint32_t tag, k = d->len - ETH_HDR - 4;
			memcpy(&tag, f + ETH_HDR, 4);
			if (tag == TAG_DATA) {
				memcpy(buf, f + ETH_HDR + 4, k);
				if (c->frames == 0)
					c->first_ns = t;
				c->last_ns = t;
				c->bytes += k;
				c->frames++;
			} else if (seen == TAG_DATA) {
				seen = tag;
				memcpy(other, f + ETH_HDR + 4, k < other_n ? k : other_n);
			}
		}
	}
	xsk_recycle(x, idx, n);
	return seen;
}

int main(int argc, char **argv)
{
	const char *ifname = NULL, *peer = NULL;
	unsigned payload = 0;
	double secs = 5;
	int server = 0, cpu = -1, event = 0;
	unsigned deadline = 300;
	int o;
	while ((o = getopt(argc, argv, "si:d:l:t:C:eT:")) != -1) {
		switch (o) {
		case 's': server = 1; break;
		case 'i': ifname = optarg; break;
		case 'd': peer = optarg; break;
		case 'l': payload = (unsigned)parse_size(optarg); break;
		case 't': secs = atof(optarg); break;
		case 'C': cpu = atoi(optarg); break;
		case 'e': event = 1; break;
		case 'T': deadline = (unsigned)atoi(optarg); break;
		default:
			fprintf(stderr, "usage: %s [-s] -i IFACE -d PEER_MAC [-l BYTES] [-t SECONDS]\n",
				argv[0]);
			return 1;
		}
	}
	if (!ifname || !peer) {
		fprintf(stderr, "error: give -i IFACE and -d PEER_MAC\n");
		return 1;
	}
	unsigned most = link_payload(ifname);
	if (payload == 0)
		payload = most;
	if (payload > most) {
		fprintf(stderr, "error: %u payload bytes do not fit a frame of %s (at most %u)\n",
			payload, ifname, most);
		return 1;
	}
	arm_deadline(deadline);
	pin_cpu(cpu);
	static struct xsk x;
	xsk_open(&x, ifname, peer, event);
	char *buf = page_buf(FRAME_BYTES);
	memset(buf, 'x', FRAME_BYTES);
	printf("ready xdp iface=%s attach=%s copy mode, %u payload bytes per frame, %s\n", ifname,
	       x.attach, payload, event ? "event (poll())" : "poll (spinning)");
	fflush(stdout);
	struct count c = {0};
	if (server) {
		char other[8];
		for (;;) {
			if (!xsk_wait_rx(&x, 1000))
				continue;
			if (take(&x, &c, buf, other, sizeof(other)) == TAG_END)
				break;
		}
		/* answer every end frame for a moment: an answer may be lost */
		uint64_t until = now_ns() + 300000000ull;
		do {
			send_tagged(&x, TAG_COUNT, &c, sizeof(c));
			struct count dummy = {0};
			while (xsk_wait_rx(&x, 50))
				if (take(&x, &dummy, buf, other, sizeof(other)) != TAG_END)
					break;
		} while (now_ns() < until);
		xsk_close(&x);
		return 0;
	}
	uint64_t sent = 0, t0 = now_ns(), end = t0 + (uint64_t)(secs * 1e9), t = t0;
	uint32_t tag = TAG_DATA;
	while (t < end) {
		for (unsigned i = 0; i < BATCH; i++) {
			uint64_t addr = xsk_tx_frame(&x);
			char *f = xsk_frame(&x, addr);
			memcpy(f + ETH_HDR, &tag, 4);
			memcpy(f + ETH_HDR + 4, buf, payload);
			xsk_send(&x, addr, ETH_HDR + 4 + payload, i == BATCH - 1);
			sent += payload;
		}
		xsk_reap(&x);
		t = now_ns();
	}
	xsk_flush(&x);
	double send_s = (double)(t - t0) / 1e9;
	struct count got = {0}, mine = {0};
	int answered = 0;
	for (int i = 0; i < 50 && !answered; i++) {
		uint32_t zero = 0;
		send_tagged(&x, TAG_END, &zero, 4);
		uint64_t until = now_ns() + 100000000ull;
		while (!answered && now_ns() < until)
			if (xsk_wait_rx(&x, 20))
				answered = take(&x, &mine, buf, &got, sizeof(got)) == TAG_COUNT;
	}
	if (!answered) {
		fprintf(stderr, "error: the receiver did not answer with its count\n");
		return 4;
	}
	double recv_s = got.frames > 1 ? (double)(got.last_ns - got.first_ns) / 1e9 : 0;
	printf("xdp_stream payload=%u secs=%.3f sent_bytes=%llu sent_gbps=%.3f recv_bytes=%llu "
	       "recv_frames=%llu recv_secs=%.3f recv_gbps=%.3f lost_pct=%.2f\n",
	       payload, send_s, (unsigned long long)sent, sent * 8 / send_s / 1e9,
	       (unsigned long long)got.bytes, (unsigned long long)got.frames, recv_s,
	       recv_s > 0 ? got.bytes * 8 / recv_s / 1e9 : 0.0,
	       sent ? 100.0 * (double)(sent - (got.bytes < sent ? got.bytes : sent)) / (double)sent
		    : 0.0);
	xsk_close(&x);
	return 0;
}
