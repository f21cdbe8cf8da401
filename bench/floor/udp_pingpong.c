/* udp_pingpong.c - UDP ping-pong latency floor: blocking datagram sockets,
 * one datagram each way per iteration.
 *
 * Server: udp_pingpong -s [-b ADDR] [-p PORT] [-C CPU] [-T DEADLINE_S]
 * Client: udp_pingpong -c HOST [-p PORT] [-m 1,64,1k,32k] [-n ITERS]
 *                      [-w WARMUP] [-C CPU] [-T DEADLINE_S] [-k]
 *
 * The server sends every datagram back to where it came from, as it arrived;
 * an empty datagram tells it to exit (sent at the end unless -k).  The
 * client's socket is connected, so a send and a receive are one system call
 * each, with no address to pass.  UDP does not recover a lost datagram and
 * this program does not either: a reply that does not come within a second
 * ends the run with an error (on loopback or an unshaped veth link a
 * ping-pong has one datagram in flight, which is not lost in practice).
 * Prints one line per size, as pingpong does, labelled udp_pingpong.
 */
#include "common.h"
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#define MAXDGRAM 65507 /* largest UDP payload over IPv4 */

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

static void serve(const char *bind_addr, const char *port)
{
	struct sockaddr_storage a;
	socklen_t alen;
	int fd = make_socket(bind_addr, port, 1, &a, &alen);
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&a, alen) != 0)
		die("bind");
	char *buf = page_buf(MAXDGRAM);
	for (;;) {
		struct sockaddr_storage from;
		socklen_t flen = sizeof(from);
		ssize_t n = recvfrom(fd, buf, MAXDGRAM, 0, (struct sockaddr *)&from, &flen);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			die("recvfrom");
		}
		if (n == 0)
			break;
		if (sendto(fd, buf, (size_t)n, 0, (struct sockaddr *)&from, flen) != n)
			die("sendto");
	}
	close(fd);
}

static void round_trip(int fd, char *out, char *in, size_t n)
{
	if (send(fd, out, n, 0) != (ssize_t)n)
		die("send");
	for (;;) {
		ssize_t r = recv(fd, in, MAXDGRAM, 0);
		if (r == (ssize_t)n)
			return;
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			fprintf(stderr, "error: no reply to a %zu-byte datagram within 1 s (lost)\n", n);
			exit(4);
		}
		if (r < 0)
			die("recv");
		fprintf(stderr, "error: a %zd-byte reply to a %zu-byte datagram\n", r, n);
		exit(4);
	}
}

int main(int argc, char **argv)
{
	const char *host = NULL, *bind_addr = NULL, *port = "17790";
	const char *sizes = "1,64,1k,32k";
	size_t iters = 100000, warmup = 10000;
	int server = 0, cpu = -1, keep = 0;
	unsigned deadline = 300;
	int o;
	while ((o = getopt(argc, argv, "sc:b:p:m:n:w:C:T:k")) != -1) {
		switch (o) {
		case 's': server = 1; break;
		case 'c': host = optarg; break;
		case 'b': bind_addr = optarg; break;
		case 'p': port = optarg; break;
		case 'm': sizes = optarg; break;
		case 'n': iters = strtoull(optarg, NULL, 0); break;
		case 'w': warmup = strtoull(optarg, NULL, 0); break;
		case 'C': cpu = atoi(optarg); break;
		case 'T': deadline = (unsigned)atoi(optarg); break;
		case 'k': keep = 1; break;
		default:
			fprintf(stderr, "usage: %s -s [-b ADDR] | -c HOST [-m SIZES] [-n ITERS]\n", argv[0]);
			return 1;
		}
	}
	if (!server && !host) {
		fprintf(stderr, "error: give -s (server) or -c HOST (client)\n");
		return 1;
	}
	arm_deadline(deadline);
	pin_cpu(cpu);
	if (server) {
		serve(bind_addr, port);
		return 0;
	}
	struct sockaddr_storage a;
	socklen_t alen;
	int fd = make_socket(host, port, 0, &a, &alen);
	if (connect(fd, (struct sockaddr *)&a, alen) != 0)
		die("connect");
	struct timeval tv = {.tv_sec = 1};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	char *out = page_buf(MAXDGRAM), *in = page_buf(MAXDGRAM);
	memset(out, 'x', MAXDGRAM);
	uint64_t *samples = malloc(iters * sizeof(uint64_t));
	if (!samples)
		die("malloc");
	char *list = strdup(sizes);
	for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
		size_t n = parse_size(tok);
		if (n < 1 || n > MAXDGRAM) {
			fprintf(stderr, "error: message size %zu outside 1..%d bytes\n", n, MAXDGRAM);
			return 1;
		}
		for (size_t i = 0; i < warmup; i++)
			round_trip(fd, out, in, n);
		uint64_t t0 = now_ns(), prev = t0;
		for (size_t i = 0; i < iters; i++) {
			round_trip(fd, out, in, n);
			uint64_t t = now_ns();
			samples[i] = t - prev;
			prev = t;
		}
		report_rtt("udp_pingpong", n, samples, iters, prev - t0);
	}
	if (!keep && send(fd, out, 0, 0) != 0)
		die("send");
	return 0;
}
