/* A 1-byte ping-pong, then a stream each way, over one TCP connection:
 *   direct server PORT ROUNDS STREAM_BYTES
 *   direct forkserver PORT ROUNDS STREAM_BYTES   (a child serves)
 *   direct execserver PORT ROUNDS STREAM_BYTES   (execs after the rounds:
 *     the new image must see the connection's end, not wait on it)
 *   direct client IP PORT ROUNDS STREAM_BYTES
 *   direct selectclient IP PORT ROUNDS STREAM_BYTES   (waits in select
 *     for each read: the connection must say it is readable there)
 *   direct pollclient IP PORT ROUNDS STREAM_BYTES   (the same in poll)
 *   direct epollclient IP PORT ROUNDS STREAM_BYTES   (the same in an
 *     epoll, the connection registered once, before its first read)
 *   direct epollserver PORT ROUNDS STREAM_BYTES   (the accepted connection
 *     non-blocking and waited on in an epoll; its first look, a peek,
 *     must return at once: it prints "first_peek_ms N (what it said)")
 *   direct threadclient IP PORT 0 STREAM_BYTES   (a second thread writes
 *     the stream in small pieces from the moment connect returns, while
 *     the connection is still being offered and while it goes direct)
 *   direct edgeserver PORT ROUNDS STREAM_BYTES   (waits for each round's
 *     request in epoll, edge-triggered, only once the request is there,
 *     and reads it short, as nginx serves a kept-alive client)
 *   direct quietserver PORT 0 STREAM_BYTES   (writes its stream, then
 *     makes no socket call for longer than the transport's silence limit
 *     while the client's stream arrives and the client waits for its
 *     answer, then reads; it is quiet again while the client closes)
 *   direct quietclient IP PORT 0 STREAM_BYTES   (its peer of the above;
 *     prints how long its close took)
 *   direct closeserver PORT 0 0   (waits until the client's first bytes
 *     are there, then closes without reading them: a reset, as the
 *     kernel's close with bytes unread)
 *   direct closeearlyserver PORT 0 0   (closes as soon as its library
 *     says the accepted connection went direct, without waiting for
 *     anything on it: before both ends finished connecting, as a rule)
 *   direct closegrantserver PORT 0 0   (moves the accepted connection
 *     into its wait for the direct grant, leaves the answer unread for
 *     500 ms, then closes; prints whether the grant was still unread then)
 *   direct closeclient IP PORT 0 0   (writes a few bytes, then its read
 *     must see the end or fail with ECONNRESET at once; prints how long
 *     it waited and which)
 *   direct closenowclient IP PORT 0 0   (writes a few bytes and closes
 *     at once, before its connection has gone direct; prints how long its
 *     close took)
 *   direct endserver PORT 0 STREAM_BYTES   (reads the client's stream,
 *     then must read its end within 10 s; prints how long it waited)
 *   direct exitclient IP PORT 0 STREAM_BYTES   (writes its stream and
 *     exits without closing the connection: the exit must end it, as the
 *     kernel closes an exiting process's sockets)
 *   direct resetserver PORT 0 STREAM_BYTES   (reads the client's stream,
 *     says so with one byte, then must read a reset within 10 s)
 *   direct resetexitclient IP PORT 0 STREAM_BYTES   (writes its stream,
 *     waits for the server's byte, sets SO_LINGER 0 and exits without
 *     closing: the exit must reset the connection, as the kernel's does)
 * Every byte is checked; the client prints the median round trip. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void put_all(int fd, const unsigned char *b, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            poll(&p, 1, 1000);
            continue;
        }
        if (w <= 0)
            die("write");
        b += w;
        n -= (size_t)w;
    }
}

/* Set: every read first waits in select, in poll, or in the epoll
 * `epfd` (5 s at most) for the descriptor to be readable. */
static int select_first, poll_first, epfd = -1;

static void wait_readable(int fd) {
    if (epfd >= 0) {
        struct epoll_event e;
        int r = epoll_wait(epfd, &e, 1, 5000);
        if (r < 0)
            die("epoll_wait");
        if (r == 0 || !(e.events & EPOLLIN) || e.data.fd != fd) {
            fprintf(stderr, "epoll: not readable within 5 s\n");
            exit(1);
        }
        return;
    }
    if (poll_first) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, 5000);
        if (r < 0)
            die("poll");
        if (r == 0 || !(p.revents & POLLIN)) {
            fprintf(stderr, "poll: not readable within 5 s\n");
            exit(1);
        }
        return;
    }
    fd_set rs;
    FD_ZERO(&rs);
    FD_SET(fd, &rs);
    struct timeval tv = {.tv_sec = 5};
    int r = select(fd + 1, &rs, NULL, NULL, &tv);
    if (r < 0)
        die("select");
    if (r == 0 || !FD_ISSET(fd, &rs)) {
        fprintf(stderr, "select: not readable within 5 s\n");
        exit(1);
    }
}

static void get_all(int fd, unsigned char *b, size_t n) {
    while (n > 0) {
        if (select_first || poll_first || epfd >= 0)
            wait_readable(fd);
        ssize_t r = read(fd, b, n);
        if (r < 0 && (errno == EINTR || (errno == EAGAIN && epfd >= 0)))
            continue;
        if (r == 0) {
            fprintf(stderr, "read: early end of stream\n");
            exit(1);
        }
        if (r < 0)
            die("read");
        b += r;
        n -= (size_t)r;
    }
}

/* One read of a byte, waiting first as get_all does: 1, or 0 at the end. */
static ssize_t read_one(int fd, unsigned char *x) {
    for (;;) {
        if (select_first || poll_first || epfd >= 0)
            wait_readable(fd);
        ssize_t r = read(fd, x, 1);
        if (r < 0 && (errno == EINTR || (errno == EAGAIN && epfd >= 0)))
            continue;
        return r;
    }
}

static unsigned char pattern(size_t j, int seed) { return (unsigned char)(j * 7 + 3 + seed); }

static void send_stream(int fd, size_t n, int seed) {
    unsigned char *b = malloc(n);
    if (!b)
        die("malloc");
    for (size_t j = 0; j < n; j++)
        b[j] = pattern(j, seed);
    put_all(fd, b, n);
    free(b);
}

static void check_stream(int fd, size_t n, int seed) {
    unsigned char *b = malloc(n);
    if (!b)
        die("malloc");
    get_all(fd, b, n);
    for (size_t j = 0; j < n; j++)
        if (b[j] != pattern(j, seed)) {
            fprintf(stderr, "stream byte %zu is %u, not %u\n", j, b[j], pattern(j, seed));
            exit(1);
        }
    free(b);
}

struct writer {
    int fd;
    size_t n;
};

/* Writes stream 1 in 1 KiB pieces, so writes keep coming while the
 * library switches the connection from the offered ring to its direct
 * path. */
static void *write_pieces(void *arg) {
    struct writer *w = arg;
    unsigned char piece[1024];
    for (size_t at = 0; at < w->n;) {
        size_t k = w->n - at < sizeof piece ? w->n - at : sizeof piece;
        for (size_t j = 0; j < k; j++)
            piece[j] = pattern(at + j, 1);
        put_all(w->fd, piece, k);
        at += k;
    }
    return NULL;
}

static int cmp(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* Set (edgeserver): the epoll each round's request is awaited in. */
static int round_epoll = -1;

/* One round's request of the edge server: awaited in its edge-triggered
 * epoll once it has surely arrived (the client sends it as soon as it
 * reads the answer before), then read into a larger buffer, which an
 * edge-triggered program takes as having read everything there was. */
static unsigned char epoll_request(int fd) {
    usleep(2000);
    for (;;) {
        struct epoll_event ev;
        int n = epoll_wait(round_epoll, &ev, 1, 5000);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            fprintf(stderr, "epoll: the request is not reported within 5 s\n");
            exit(1);
        }
        unsigned char buf[64];
        ssize_t r = read(fd, buf, sizeof buf);
        if (r == 1)
            return buf[0];
        /* An event before the request (the connection's setup): wait
         * again, as an edge-triggered server does after EAGAIN. */
        if (r < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        fprintf(stderr, "epoll: read %zd bytes, not the 1-byte request\n", r);
        exit(1);
    }
}

/* Sleeps `ms` milliseconds without a socket call. */
static void quiet_for(long ms) {
    struct timespec t = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) < 0 && errno == EINTR)
        ;
}

/* Longer than the transport's silence limit (10 s): a peer that only its
 * program's calls answered would be given up meanwhile. */
#define QUIET_MS 10500L
/* Longer than the transport's close linger (300 ms). */
#define QUIET_AT_CLOSE_MS 500L

/* The quiet end: its stream, the long quiet, the client's stream, its
 * answer, a short quiet while the client closes, the client's end. */
static int quiet_server(int fd, size_t n) {
    unsigned char x;
    get_all(fd, &x, 1);
    send_stream(fd, n, 2);
    quiet_for(QUIET_MS);
    check_stream(fd, n, 1);
    x = 'k';
    put_all(fd, &x, 1);
    quiet_for(QUIET_AT_CLOSE_MS);
    get_all(fd, &x, 1);
    if (x != 'e' || read(fd, &x, 1) != 0) {
        fprintf(stderr, "no end from the client\n");
        return 1;
    }
    close(fd);
    printf("direct: ok\n");
    return 0;
}

/* The client of `quiet_server`: its stream goes while the server is
 * quiet, and it waits for the answer meanwhile; its close comes while the
 * server is quiet again, and must return at once all the same. */
static int quiet_client(int fd, size_t n) {
    unsigned char x = 'g';
    put_all(fd, &x, 1);
    check_stream(fd, n, 2);
    send_stream(fd, n, 1);
    get_all(fd, &x, 1);
    if (x != 'k') {
        fprintf(stderr, "the answer is %u\n", x);
        return 1;
    }
    x = 'e';
    put_all(fd, &x, 1);
    long t0 = now_ns();
    close(fd);
    printf("close_ns %ld\n", now_ns() - t0);
    printf("direct: ok\n");
    return 0;
}

/* The bytes a closing client writes (Open MPI's connect sends a 24-byte
 * greeting). */
#define GREETING_BYTES 24

/* Waits until the client's first bytes are there, then closes without
 * reading them. */
static int close_server(int fd) {
    unsigned char b;
    ssize_t r = recv(fd, &b, 1, MSG_PEEK);
    if (r != 1)
        die("peek");
    close(fd);
    printf("closed with bytes unread\n");
    printf("direct: ok\n");
    return 0;
}

/* Reads a stream of `n` bytes, then the end, which a client that exits
 * without closing its connection still sends, as the kernel ends an
 * exiting process's connections; gives it 10 s. With `reset`, one byte
 * says the stream was read, and the client's exit must then reset the
 * connection (ECONNRESET), not end it. */
static int end_server(int fd, size_t n, int reset) {
    check_stream(fd, n, 1);
    struct timeval limit = {.tv_sec = 10};
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit))
        die("SO_RCVTIMEO");
    unsigned char x = 'r';
    if (reset)
        put_all(fd, &x, 1);
    long t0 = now_ns();
    ssize_t r = read(fd, &x, 1);
    int e = errno;
    printf("end_ms %ld\n", (now_ns() - t0) / 1000000);
    if (reset ? !(r < 0 && e == ECONNRESET) : r != 0) {
        fprintf(stderr, "no %s from the client: %s\n", reset ? "reset" : "end",
                r < 0 ? strerror(e) : r == 0 ? "the end" : "bytes");
        return 1;
    }
    close(fd);
    printf("direct: ok\n");
    return 0;
}

/* Whether the library's log (NETGAP_PRELOAD_LOG) has `line`. */
static int logged(const char *line) {
    const char *path = getenv("NETGAP_PRELOAD_LOG");
    static char text[1 << 16];
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f)
        return 0;
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    return strstr(text, line) != NULL;
}

/* Looks at the accepted connection without waiting (which moves it along
 * its setup) until the library says it went direct, then closes it. */
static int close_early_server(int fd) {
    unsigned char b;
    for (long i = 0; !logged("accepted connection moved to direct"); i++) {
        ssize_t r = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (r < 0 && errno != EAGAIN)
            die("peek");
        if (i > 20000)
            die("never direct");
        usleep(500);
    }
    close(fd);
    printf("closed once direct\n");
    printf("direct: ok\n");
    return 0;
}

/* Moves the accepted connection into its wait for the direct grant (a
 * non-blocking peek reads the hello and asks; writability is not said
 * until the answer), makes no call on it for 500 ms while the answer
 * comes, then closes: the close must end the connection on the path the
 * answer gave it, so the client is told at once. */
static int close_granting_server(int fd) {
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0)
        die("fcntl");
    unsigned char b;
    for (long i = 0;; i++) {
        if (recv(fd, &b, 1, MSG_PEEK) >= 0 || errno != EAGAIN)
            die("peek before the grant");
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        if (poll(&p, 1, 0) == 0)
            break;
        if (i > 6000)
            die("never waited for a grant");
        usleep(500);
    }
    usleep(500000);
    int unread = !logged("accepted connection moved to direct");
    close(fd);
    printf("closed_while_granting %d\n", unread);
    printf("direct: ok\n");
    return 0;
}

/* Writes its greeting; with `at_once` closes then, else reads, which must
 * see the server's end or its reset. */
static int close_client(int fd, int at_once) {
    unsigned char g[GREETING_BYTES];
    memset(g, 'g', sizeof g);
    put_all(fd, g, sizeof g);
    long t0 = now_ns();
    if (at_once) {
        close(fd);
        printf("close_ns %ld\n", now_ns() - t0);
        printf("direct: ok\n");
        return 0;
    }
    unsigned char b;
    ssize_t r = read(fd, &b, 1);
    int e = errno;
    printf("read_ms %ld (%s)\n", (now_ns() - t0) / 1000000,
           r > 0 ? "data" : r == 0 ? "end" : strerror(e));
    t0 = now_ns();
    close(fd);
    printf("close_ns %ld\n", now_ns() - t0);
    /* The end or a reset, as the kernel's: a server that closed with
     * nothing unread sends its end, and resets the greeting that comes
     * after; which the read sees first is a race. */
    if (r == 0 || (r < 0 && e == ECONNRESET))
        printf("direct: ok\n");
    return 0;
}

/* The image after exec: the inherited connection must have ended. */
static int after_exec(int fd) {
    unsigned char b;
    signal(SIGPIPE, SIG_IGN);
    ssize_t r = read(fd, &b, 1);
    int re = errno;
    ssize_t w = write(fd, "x", 1);
    int we = errno;
    printf("afterexec: read %zd (%s), write %zd (%s)\n", r, r < 0 ? strerror(re) : "-", w,
           w < 0 ? strerror(we) : "-");
    if (r == 0 && w < 0 && we == EPIPE) {
        printf("direct: ok\n");
        return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "afterexec") == 0)
        return after_exec(atoi(argv[2]));
    if (argc < 5)
        return 2;
    int execs = strcmp(argv[1], "execserver") == 0;
    int forks = strcmp(argv[1], "forkserver") == 0;
    int epoll_server = strcmp(argv[1], "epollserver") == 0;
    int quiet_end = strcmp(argv[1], "quietserver") == 0;
    int edges = strcmp(argv[1], "edgeserver") == 0;
    int closes = strcmp(argv[1], "closeserver") == 0;
    int closes_early = strcmp(argv[1], "closeearlyserver") == 0;
    int closes_granting = strcmp(argv[1], "closegrantserver") == 0;
    int resets = strcmp(argv[1], "resetserver") == 0;
    int ends = resets || strcmp(argv[1], "endserver") == 0;
    int server = forks || execs || epoll_server || quiet_end || edges || closes ||
                 closes_early || closes_granting || ends || strcmp(argv[1], "server") == 0;
    int threaded = strcmp(argv[1], "threadclient") == 0;
    select_first = strcmp(argv[1], "selectclient") == 0;
    poll_first = strcmp(argv[1], "pollclient") == 0;
    int epolls = strcmp(argv[1], "epollclient") == 0;
    int at = server ? 2 : 3;
    int port = atoi(argv[at]);
    long rounds = atol(argv[at + 1]);
    size_t stream = (size_t)atol(argv[at + 2]);
    int one = 1, fd;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (server) {
        int l = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        a.sin_addr.s_addr = htonl(INADDR_ANY);
        if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 4))
            die("listen");
        printf("listening\n");
        fflush(stdout);
        fd = accept(l, NULL, NULL);
        if (fd < 0)
            die("accept");
        close(l);
        if (forks) {
            /* The parent hands the connection to a child and closes its
             * copy, as a forking server does. */
            pid_t child = fork();
            if (child < 0)
                die("fork");
            if (child > 0) {
                int status = 0;
                close(fd);
                if (waitpid(child, &status, 0) < 0)
                    die("waitpid");
                if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
                    printf("direct: ok\n");
                return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
            }
        }
    } else {
        inet_pton(AF_INET, argv[2], &a.sin_addr);
        for (int tries = 0;; tries++) {
            fd = socket(AF_INET, SOCK_STREAM, 0);
            if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0)
                break;
            close(fd);
            if (tries > 400)
                die("connect");
            usleep(50000);
        }
    }
    if (epoll_server) {
        /* Its first look at once, whatever the library still waits for. */
        if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0)
            die("fcntl");
        unsigned char b;
        long t0 = now_ns();
        ssize_t r = recv(fd, &b, 1, MSG_PEEK);
        int e = errno;
        printf("first_peek_ms %ld (%s)\n", (now_ns() - t0) / 1000000,
               r > 0 ? "data" : r == 0 ? "end" : strerror(e));
        if (r < 0 && e != EAGAIN)
            die("recv");
    }
    if (epolls || epoll_server) {
        struct epoll_event e = {.events = EPOLLIN, .data.fd = fd};
        epfd = epoll_create1(EPOLL_CLOEXEC);
        if (epfd < 0 || epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &e) < 0)
            die("epoll");
    }
    if (closes)
        return close_server(fd);
    if (closes_early)
        return close_early_server(fd);
    if (closes_granting)
        return close_granting_server(fd);
    if (strcmp(argv[1], "closeclient") == 0 || strcmp(argv[1], "closenowclient") == 0)
        return close_client(fd, strcmp(argv[1], "closenowclient") == 0);
    if (ends)
        return end_server(fd, stream, resets);
    if (strcmp(argv[1], "exitclient") == 0) {
        send_stream(fd, stream, 1);
        printf("direct: ok\n");
        fflush(stdout);
        /* The connection stays open: the exit must end it. */
        exit(0);
    }
    if (strcmp(argv[1], "resetexitclient") == 0) {
        send_stream(fd, stream, 1);
        unsigned char x;
        get_all(fd, &x, 1);
        struct linger hard = {.l_onoff = 1, .l_linger = 0};
        if (setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof hard))
            die("SO_LINGER");
        printf("direct: ok\n");
        fflush(stdout);
        /* Open still, with SO_LINGER 0: the exit must reset it. */
        exit(0);
    }
    if (quiet_end)
        return quiet_server(fd, stream);
    if (strcmp(argv[1], "quietclient") == 0)
        return quiet_client(fd, stream);
    if (threaded) {
        struct writer w = {.fd = fd, .n = stream};
        pthread_t t;
        if (pthread_create(&t, NULL, write_pieces, &w))
            die("pthread_create");
        check_stream(fd, stream, 2);
        pthread_join(t, NULL);
        /* The end as the other modes make it (below). */
        unsigned char x = 'd';
        put_all(fd, &x, 1);
        if (read(fd, &x, 1) != 0) {
            fprintf(stderr, "no end of stream from the peer\n");
            return 1;
        }
        shutdown(fd, SHUT_WR);
        close(fd);
        printf("direct: ok\n");
        return 0;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int blocking = fcntl(fd, F_GETFL);
    if (edges) {
        struct epoll_event ev = {.events = EPOLLIN | EPOLLET};
        round_epoll = epoll_create1(0);
        if (round_epoll < 0 || fcntl(fd, F_SETFL, blocking | O_NONBLOCK) < 0 ||
            epoll_ctl(round_epoll, EPOLL_CTL_ADD, fd, &ev) < 0)
            die("epoll");
    }
    long *rtt = calloc((size_t)rounds + 1, sizeof *rtt);
    for (long i = 0; i < rounds; i++) {
        unsigned char c = (unsigned char)i, d;
        if (server) {
            if (edges)
                d = epoll_request(fd);
            else
                get_all(fd, &d, 1);
            if (d != c) {
                fprintf(stderr, "round %ld: got %u\n", i, d);
                return 1;
            }
            d = (unsigned char)(c + 1);
            put_all(fd, &d, 1);
        } else {
            long t0 = now_ns();
            put_all(fd, &c, 1);
            get_all(fd, &d, 1);
            rtt[i] = now_ns() - t0;
            if (d != (unsigned char)(c + 1)) {
                fprintf(stderr, "round %ld: got %u\n", i, d);
                return 1;
            }
        }
    }
    if (edges && fcntl(fd, F_SETFL, blocking) < 0)
        die("fcntl");
    if (execs) {
        char fdstr[16];
        snprintf(fdstr, sizeof fdstr, "%d", fd);
        fflush(stdout);
        execl("/proc/self/exe", argv[0], "afterexec", fdstr, (char *)NULL);
        die("exec");
    }
    if (server) {
        check_stream(fd, stream, 1);
        send_stream(fd, stream, 2);
    } else {
        send_stream(fd, stream, 1);
        check_stream(fd, stream, 2);
        qsort(rtt, (size_t)rounds, sizeof *rtt, cmp);
        printf("median_rtt_ns %ld\n", rounds > 0 ? rtt[rounds / 2] : 0);
    }
    /* The end of the stream, as the kernel's: the peer reads 0. The ends
     * come in one known order on every path: the client says it has read
     * everything, the server then shuts down, and the client shuts down
     * once it read the server's end. (A shutdown with bytes still on
     * their way is `preload_xdp.rs`'s half-closed connection.) */
    unsigned char x = 'd';
    if (server) {
        if (read_one(fd, &x) != 1 || x != 'd') {
            fprintf(stderr, "no word from the client that it read everything\n");
            return 1;
        }
        shutdown(fd, SHUT_WR);
    } else {
        put_all(fd, &x, 1);
    }
    if (read_one(fd, &x) != 0) {
        fprintf(stderr, "no end of stream from the peer\n");
        return 1;
    }
    if (!server)
        shutdown(fd, SHUT_WR);
    close(fd);
    printf("direct: ok\n");
    return 0;
}
