/* udp_stream.c - UDP stream floor: one sender writes datagrams of -l bytes
 * as fast as blocking sends go for -t seconds; the receiver counts what
 * arrived.
 *
 * Receiver: udp_stream -s [-b ADDR] [-p PORT] [-C CPU] [-T DEADLINE_S]
 * Sender:   udp_stream -c HOST [-p PORT] [-l SIZE] [-t SECONDS] [-C CPU]
 *                     [-T DEADLINE_S]
 *
 * UDP has no flow control: the sender may send more than the receiver
 * takes, and the difference is lost (counted, not recovered).  At the end
 * the sender sends empty datagrams until the receiver answers with its
 * count (bytes and datagrams that arrived, seconds from the first to the
 * last), and prints one line with both sides' figures:
 *   udp_stream size=N secs=S sent_bytes=.. sent_gbps=.. recv_bytes=..
 *   recv_gbps=.. lost_pct=..
 * recv_gbps is the goodput: bytes that arrived over the receiver's time.
 */
#include "common.h"
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#define MAXDGRAM 65507

struct count {
	uint64_t bytes, datagrams, first_ns, last_ns;
};

static int make_socket(const char *host, const char *port, int passive,
		       struct sockaddr_storage *addr, socklen_t *addrlen)
{
	struct addrinfo hints = {0}, *res;
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_DGRAM;
	hints.ai_flags = passive ? AI_PASSIVE : 0;
	int rc = getaddrinfo(host, port, &hints, &res);
	if (rc != 0) {
		fprintf(stderr, "error: %s:%s: %s\n", host ? host : "*", port, gai_strerror(rc));
		exit(2);
	}
	int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
	if (fd < 0)
		die("socket");
	int big = 4 << 20;
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
	memcpy(addr, res->ai_addr, res->ai_addrlen);
	*addrlen = res->ai_addrlen;
	freeaddrinfo(res);
	return fd;
}

static void receive(const char *bind_addr, const char *port)
{
	struct sockaddr_storage a;
	socklen_t alen;
	int fd = make_socket(bind_addr, port, 1, &a, &alen);
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&a, alen) != 0)
		die("bind");
	char *buf = page_buf(MAXDGRAM);
	struct count c = {0};
	for (;;) {
		struct sockaddr_storage from;
		socklen_t flen = sizeof(from);
		ssize_t n = recvfrom(fd, buf, MAXDGRAM, 0, (struct sockaddr *)&from, &flen);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			die("recvfrom");
		}
		if (n == 0) {
			/* the end: answer with the count (again for every empty
			 * datagram, in case an answer was lost), then linger a
			 * little for repeats before exiting */
			if (sendto(fd, &c, sizeof(c), 0, (struct sockaddr *)&from, flen) < 0)
				die("sendto");
			struct timeval tv = {.tv_usec = 300000};
			setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
			for (;;) {
				flen = sizeof(from);
				n = recvfrom(fd, buf, MAXDGRAM, 0, (struct sockaddr *)&from, &flen);
				if (n < 0)
					break;
				if (n == 0)
					sendto(fd, &c, sizeof(c), 0, (struct sockaddr *)&from, flen);
			}
			break;
		}
		uint64_t t = now_ns();
		if (c.datagrams == 0)
			c.first_ns = t;
		c.last_ns = t;
		c.bytes += (uint64_t)n;
		c.datagrams++;
	}
	close(fd);
}

int main(int argc, char **argv)
{
	const char *host = NULL, *bind_addr = NULL, *port = "17791";
	size_t size = 1472;
	double secs = 5;
	int server = 0, cpu = -1;
	unsigned deadline = 300;
	int o;
	while ((o = getopt(argc, argv, "sc:b:p:l:t:C:T:")) != -1) {
		switch (o) {
		case 's': server = 1; break;
		case 'c': host = optarg; break;
		case 'b': bind_addr = optarg; break;
		case 'p': port = optarg; break;
		case 'l': size = parse_size(optarg); break;
		case 't': secs = atof(optarg); break;
		case 'C': cpu = atoi(optarg); break;
		case 'T': deadline = (unsigned)atoi(optarg); break;
		default:
			fprintf(stderr, "usage: %s -s [-b ADDR] | -c HOST [-l SIZE] [-t SECONDS]\n", argv[0]);
			return 1;
		}
	}
	if (!server && !host) {
		fprintf(stderr, "error: give -s (receiver) or -c HOST (sender)\n");
		return 1;
	}
	if (size < 1 || size > MAXDGRAM) {
		fprintf(stderr, "error: datagram size %zu outside 1..%d bytes\n", size, MAXDGRAM);
		return 1;
	}
	arm_deadline(deadline);
	pin_cpu(cpu);
	if (server) {
		receive(bind_addr, port);
		return 0;
	}
	struct sockaddr_storage a;
	socklen_t alen;
	int fd = make_socket(host, port, 0, &a, &alen);
	if (connect(fd, (struct sockaddr *)&a, alen) != 0)
		die("connect");
	char *buf = page_buf(size);
	memset(buf, 'x', size);
	uint64_t sent = 0, t0 = now_ns(), end = t0 + (uint64_t)(secs * 1e9), t = t0;
	while (t < end) {
		for (int i = 0; i < 64; i++) {
			ssize_t n = send(fd, buf, size, 0);
			/* the receiver's socket may refuse for a moment (ICMP
			 * unreachable on loopback before it binds); keep going */
			if (n < 0 && errno != ECONNREFUSED && errno != EINTR && errno != ENOBUFS)
				die("send");
			if (n > 0)
				sent += (uint64_t)n;
		}
		t = now_ns();
	}
	double send_s = (double)(t - t0) / 1e9;
	struct timeval tv = {.tv_usec = 200000};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	struct count c;
	int got = 0;
	for (int i = 0; i < 25 && !got; i++) {
		if (send(fd, buf, 0, 0) < 0 && errno != ECONNREFUSED)
			die("send");
		ssize_t n = recv(fd, &c, sizeof(c), 0);
		got = n == (ssize_t)sizeof(c);
	}
	if (!got) {
		fprintf(stderr, "error: the receiver did not answer with its count\n");
		return 4;
	}
	double recv_s = c.datagrams > 1 ? (double)(c.last_ns - c.first_ns) / 1e9 : 0;
	printf("udp_stream size=%zu secs=%.3f sent_bytes=%llu sent_gbps=%.3f recv_bytes=%llu "
	       "recv_datagrams=%llu recv_secs=%.3f recv_gbps=%.3f lost_pct=%.2f\n",
	       size, send_s, (unsigned long long)sent, sent * 8 / send_s / 1e9,
	       (unsigned long long)c.bytes, (unsigned long long)c.datagrams, recv_s,
	       recv_s > 0 ? c.bytes * 8 / recv_s / 1e9 : 0.0,
	       sent ? 100.0 * (double)(sent - (c.bytes < sent ? c.bytes : sent)) / (double)sent : 0.0);
	return 0;
}
