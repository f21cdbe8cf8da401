#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
/*
 * Two programs on two hosts that connect to each other before either
 * accepts, for the preload library's test. Usage: crossed ME PORT PEER_IP
 * PEER_PORT DIR, ME 1 or 2. It listens on PORT, says so with the file
 * DIR/ready-ME and waits for DIR/ready-PEER, connects to the peer, writes
 * its greeting on that connection, and only then accepts the peer's
 * connection; it reads the peer's greeting there, answers on it, and reads
 * the peer's answer on its own connection. Every byte is checked; it
 * prints "crossed: ok" and exits 0, or says what failed and exits 1. A
 * connect that waited for the peer's accept would hang both (the alarm
 * ends it).
 *
 * Both accept at once: across hosts, each host's relay gets its listen
 * before either has a link to the other, then a connect to the other's
 * end, and the two relays open their link from both sides.
 *
 * Then a close before the accept: program 1 connects to program 2 once
 * more, writes its greeting and closes at once; its close must return
 * within CLOSE_LIMIT_US (the kernel's does not wait for the peer's
 * accept), and it says so with DIR/closed-1. Program 2 accepts only then,
 * LATE_ACCEPT_US later, and reads every byte, then the end.
 */
#define BYTES 100000
#define CLOSE_LIMIT_US 100000
#define LATE_ACCEPT_US 300000

static void fill(unsigned char *b, int seed) {
    for (long i = 0; i < BYTES; i++) b[i] = (unsigned char)(i * 31 + seed);
}

static int check(const unsigned char *b, int seed) {
    for (long i = 0; i < BYTES; i++)
        if (b[i] != (unsigned char)(i * 31 + seed)) return 0;
    return 1;
}

static void fail(const char *what) {
    printf("crossed: %s failed: %s\n", what, strerror(errno));
    exit(1);
}

static void put(int fd, const unsigned char *b, const char *what) {
    for (long off = 0; off < BYTES;) {
        ssize_t n = write(fd, b + off, BYTES - off);
        if (n <= 0) fail(what);
        off += n;
    }
}

static long now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000L + t.tv_nsec / 1000;
}

static void get(int fd, unsigned char *b, const char *what) {
    for (long off = 0; off < BYTES;) {
        ssize_t n = read(fd, b + off, BYTES - off);
        if (n < 0) fail(what);
        if (n == 0) {
            printf("crossed: %s ended early at %ld bytes\n", what, off);
            exit(1);
        }
        off += n;
    }
}

int main(int argc, char **argv) {
    if (argc != 6) {
        printf("usage: crossed ME PORT PEER_IP PEER_PORT DIR\n");
        return 2;
    }
    alarm(60);
    int me = atoi(argv[1]), peer = 3 - me;
    char path[4096];
    static unsigned char out[BYTES], in[BYTES];

    int l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 4)) fail("listen");
    snprintf(path, sizeof path, "%s/ready-%d", argv[5], me);
    FILE *f = fopen(path, "w");
    if (!f) fail("the ready file");
    fclose(f);
    snprintf(path, sizeof path, "%s/ready-%d", argv[5], peer);
    struct stat st;
    while (stat(path, &st) != 0) usleep(10000);

    int c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in p = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[4]))};
    if (inet_pton(AF_INET, argv[3], &p.sin_addr) != 1) fail("the peer's address");
    if (connect(c, (struct sockaddr *)&p, sizeof p)) fail("connect");
    fill(out, me);
    put(c, out, "the greeting");

    int s = accept(l, NULL, NULL);
    if (s < 0) fail("accept");
    get(s, in, "reading the peer's greeting");
    if (!check(in, peer)) {
        printf("crossed: the peer's greeting differs\n");
        return 1;
    }
    fill(out, me + 100);
    put(s, out, "the answer");
    get(c, in, "reading the peer's answer");
    if (!check(in, peer + 100)) {
        printf("crossed: the peer's answer differs\n");
        return 1;
    }
    close(s);
    close(c);

    snprintf(path, sizeof path, "%s/closed-1", argv[5]);
    if (me == 1) {
        int late = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(late, (struct sockaddr *)&p, sizeof p)) fail("the second connect");
        fill(out, 7);
        put(late, out, "the greeting before the close");
        long t0 = now_us();
        if (close(late)) fail("the close before the accept");
        long took = now_us() - t0;
        if (took > CLOSE_LIMIT_US) {
            printf("crossed: the close before the accept took %ld us\n", took);
            return 1;
        }
        f = fopen(path, "w");
        if (!f) fail("the closed file");
        fclose(f);
    } else {
        while (stat(path, &st) != 0) usleep(10000);
        usleep(LATE_ACCEPT_US);
        int late = accept(l, NULL, NULL);
        if (late < 0) fail("the late accept");
        get(late, in, "reading the greeting of a closed connection");
        if (!check(in, 7)) {
            printf("crossed: the closed connection's greeting differs\n");
            return 1;
        }
        unsigned char more;
        ssize_t n = read(late, &more, 1);
        if (n != 0) {
            printf("crossed: after the closed connection's greeting, read gave %zd (%s), not its end\n",
                   n, n < 0 ? strerror(errno) : "a byte");
            return 1;
        }
        close(late);
    }
    printf("crossed: ok\n");
    close(l);
    return 0;
}
