/*
 * iwemu -- the iwscope lab's user-space link emulator.
 *
 * Bridges two TUN devices (A: the host's side of its access link, B: the core router's
 * side) and emulates one access link, per direction:
 *
 *   arrival -> random loss (Bernoulli or Gilbert-Elliott) -> drop-tail FIFO buffer
 *           -> serialisation at the configured rate -> one-way propagation delay
 *           (+ jitter that never reorders) -> delivery to the other TUN device.
 *
 * "down" is B -> A (towards the host), "up" is A -> B (from the host).  The model follows
 * mahimahi's mm-loss / mm-link / mm-delay.  Because the queue is FIFO and the rate is
 * constant between reconfigurations, the time a packet finishes serialisation is known
 * when it arrives (max(arrival, previous finish) + bits / rate), so every direction is a
 * single delay line ordered by delivery time, served by one timerfd.
 *
 * Rates count IP bytes (TUN is layer 3: no Ethernet framing).  Packets are never parsed:
 * IPv4 and IPv6 get the same loss, buffer, rate and delay (an IPv6 packet's header is 40
 * bytes, not 20, so it serialises 20 bytes longer than an IPv4 one of the same payload).
 * The kernel tells the families apart on write by the version nibble (IFF_NO_PI); "stats"
 * counts the IPv6 packets received per direction (rx_ipv6_packets).
 *
 * Control: a UNIX stream socket (--control PATH), one line per connection:
 *   "set down.rate=1000000 up.delay_ms=35 ..."  -> "ok" or "error: ..."
 *   "stats"                                      -> one JSON object (config + counters)
 *   "flush"                                      -> drops every queued packet (counted)
 * SIGTERM / SIGINT end it cleanly (the trace file is flushed).
 *
 * Trace (--trace PATH): one line per event: "<t_s> <dir> <ip_bytes> <event>", t_s from
 * CLOCK_MONOTONIC, event one of enqueue, deliver, drop_loss, drop_queue, drop_overflow.
 *
 * Standard C and Linux headers only.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define SLOT_DATA 2048          /* > any packet on a 1500-byte MTU TUN without vnet header */
#define READ_BUF 65536
#define DEFAULT_SLOTS 32768     /* per direction; memory is touched lazily */
#define READ_BATCH 64           /* packets read per wake-up per device before delivering */

enum { LOSS_BERNOULLI = 0, LOSS_GILBERT = 1 };

struct dir_cfg {
    double rate_bps;            /* 0 = unlimited */
    double delay_ms;
    double jitter_ms;           /* standard deviation of a normal, truncated at -delay */
    int loss_model;
    double loss;                /* Bernoulli loss probability */
    double ge_p;                /* Gilbert-Elliott: P(good -> bad) per packet */
    double ge_r;                /* P(bad -> good) per packet */
    double ge_loss_good;        /* loss probability in the good state */
    double ge_loss_bad;         /* loss probability in the bad state */
    uint64_t buffer_bytes;      /* 0 = unlimited */
    uint64_t buffer_packets;    /* 0 = unlimited */
};

struct slot {
    uint64_t deliver_ns;
    uint64_t tx_end_ns;
    uint32_t len;
    uint8_t data[SLOT_DATA];
};

struct counters {
    uint64_t rx_packets, rx_bytes;
    uint64_t rx_ipv6_packets;          /* of rx_packets: version nibble 6 */
    uint64_t delivered_packets, delivered_bytes;
    uint64_t lost_packets, lost_bytes;
    uint64_t queue_drop_packets, queue_drop_bytes;
    uint64_t overflow_drop_packets;
    uint64_t flushed_packets;
    uint64_t write_errors;
    uint64_t oversize_packets;
    uint64_t max_backlog_bytes;
    /* Delivery lateness (actual write time - scheduled time): the emulator's own timing error. */
    uint64_t late_max_ns, late_sum_ns, late_over_100us, late_over_1ms;
    uint64_t first_rx_ns, last_rx_ns, first_deliver_ns, last_deliver_ns;
    /* Time the serialiser had nothing to send between two enqueued packets: a rate measured
     * over the busy time alone is the emulator's own accuracy, whatever the sender did. */
    uint64_t idle_ns;
};

struct direction {
    const char *name;
    int in_fd, out_fd;
    struct dir_cfg cfg;
    struct slot *ring;
    uint32_t slots, head, count;     /* FIFO: head = oldest */
    uint32_t ser_head, ser_count;    /* packets not yet fully serialised (a suffix... prefix of FIFO) */
    uint64_t backlog_bytes;          /* bytes of those packets */
    uint64_t link_free_ns;           /* when the serialiser finishes its last packet */
    uint64_t last_deliver_ns;        /* to keep jitter from reordering */
    int ge_bad;
    uint64_t rng[4];
    struct counters c;
};

static volatile sig_atomic_t stop_requested = 0;
static FILE *trace_file = NULL;
static struct direction dirs[2];   /* 0 = down (B->A), 1 = up (A->B) */
static int active_rt_priority = 0;

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "iwemu: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(2);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* xoshiro256** seeded by splitmix64: small, fast, good enough for loss and jitter. */
static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static uint64_t rng_next(uint64_t *s) {
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl(s[3], 45);
    return result;
}
static double rng_uniform(uint64_t *s) { return (rng_next(s) >> 11) * 0x1.0p-53; }
static double rng_normal(uint64_t *s) {
    double u1 = rng_uniform(s), u2 = rng_uniform(s);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}
static void rng_seed(uint64_t *s, uint64_t seed) {
    for (int i = 0; i < 4; i++) s[i] = splitmix64(&seed);
}

static void trace(const struct direction *d, uint64_t t, uint32_t len, const char *event) {
    if (trace_file)
        fprintf(trace_file, "%llu.%09llu %s %u %s\n", (unsigned long long)(t / 1000000000ull),
                (unsigned long long)(t % 1000000000ull), d->name, len, event);
}

/* ---------- configuration ---------- */

static int parse_double(const char *v, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end) return -1;
    *out = x;
    return 0;
}

/* Applies "down.key=value" / "up.key=value" to dirs; on error writes a message to err. */
static int apply_setting(const char *token, char *err, size_t errlen) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", token);
    char *eq = strchr(buf, '=');
    if (!eq) { snprintf(err, errlen, "setting %s: expected key=value", token); return -1; }
    *eq = 0;
    const char *key = buf, *value = eq + 1;
    struct direction *targets[2];
    int ntargets = 0;
    if (!strncmp(key, "down.", 5)) { targets[ntargets++] = &dirs[0]; key += 5; }
    else if (!strncmp(key, "up.", 3)) { targets[ntargets++] = &dirs[1]; key += 3; }
    else if (!strncmp(key, "both.", 5)) { targets[ntargets++] = &dirs[0]; targets[ntargets++] = &dirs[1]; key += 5; }
    else { snprintf(err, errlen, "setting %s: key must start with down., up. or both.", token); return -1; }
    for (int i = 0; i < ntargets; i++) {
        struct dir_cfg *c = &targets[i]->cfg;
        double x = 0;
        if (!strcmp(key, "loss_model")) {
            if (!strcmp(value, "bernoulli")) c->loss_model = LOSS_BERNOULLI;
            else if (!strcmp(value, "gilbert")) c->loss_model = LOSS_GILBERT;
            else { snprintf(err, errlen, "setting %s: loss_model must be bernoulli or gilbert", token); return -1; }
            continue;
        }
        if (parse_double(value, &x)) { snprintf(err, errlen, "setting %s: not a number", token); return -1; }
        int is_prob = !strcmp(key, "loss") || !strncmp(key, "ge_", 3);
        if (x < 0 || (is_prob && x > 1)) { snprintf(err, errlen, "setting %s: out of range", token); return -1; }
        if (!strcmp(key, "rate")) c->rate_bps = x;
        else if (!strcmp(key, "delay_ms")) c->delay_ms = x;
        else if (!strcmp(key, "jitter_ms")) c->jitter_ms = x;
        else if (!strcmp(key, "loss")) c->loss = x;
        else if (!strcmp(key, "ge_p")) c->ge_p = x;
        else if (!strcmp(key, "ge_r")) c->ge_r = x;
        else if (!strcmp(key, "ge_loss_good")) c->ge_loss_good = x;
        else if (!strcmp(key, "ge_loss_bad")) c->ge_loss_bad = x;
        else if (!strcmp(key, "buffer_bytes")) c->buffer_bytes = (uint64_t)x;
        else if (!strcmp(key, "buffer_packets")) c->buffer_packets = (uint64_t)x;
        else { snprintf(err, errlen, "setting %s: unknown key %s", token, key); return -1; }
    }
    return 0;
}

/* Applies a whitespace-separated list atomically: all settings or none. */
static int apply_settings(char *line, char *err, size_t errlen) {
    struct direction saved[2];
    memcpy(saved, dirs, sizeof dirs);
    char *save = NULL;
    for (char *tok = strtok_r(line, " \t\r\n", &save); tok; tok = strtok_r(NULL, " \t\r\n", &save)) {
        if (apply_setting(tok, err, errlen)) {
            memcpy(dirs, saved, sizeof dirs);
            return -1;
        }
    }
    return 0;
}

/* ---------- data path ---------- */

static uint64_t drop_serialised(struct direction *d, uint64_t now) {
    /* Packets whose serialisation has finished leave the backlog (they are "on the wire"). */
    while (d->ser_count && d->ring[d->ser_head].tx_end_ns <= now) {
        d->backlog_bytes -= d->ring[d->ser_head].len;
        d->ser_head = (d->ser_head + 1) % d->slots;
        d->ser_count--;
    }
    return d->backlog_bytes;
}

static int lose_packet(struct direction *d) {
    struct dir_cfg *c = &d->cfg;
    if (c->loss_model == LOSS_GILBERT) {
        if (d->ge_bad) { if (rng_uniform(d->rng) < c->ge_r) d->ge_bad = 0; }
        else { if (rng_uniform(d->rng) < c->ge_p) d->ge_bad = 1; }
        double p = d->ge_bad ? c->ge_loss_bad : c->ge_loss_good;
        return p > 0 && rng_uniform(d->rng) < p;
    }
    return c->loss > 0 && rng_uniform(d->rng) < c->loss;
}

static void on_arrival(struct direction *d, const uint8_t *pkt, uint32_t len, uint64_t now) {
    d->c.rx_packets++;
    d->c.rx_bytes += len;
    if (len && (pkt[0] >> 4) == 6) d->c.rx_ipv6_packets++;
    if (!d->c.first_rx_ns) d->c.first_rx_ns = now;
    d->c.last_rx_ns = now;
    if (len > SLOT_DATA) { d->c.oversize_packets++; trace(d, now, len, "drop_overflow"); return; }
    if (lose_packet(d)) {
        d->c.lost_packets++; d->c.lost_bytes += len; trace(d, now, len, "drop_loss"); return;
    }
    uint64_t backlog = drop_serialised(d, now);
    if ((d->cfg.buffer_bytes && backlog + len > d->cfg.buffer_bytes) ||
        (d->cfg.buffer_packets && d->ser_count + 1 > d->cfg.buffer_packets)) {
        d->c.queue_drop_packets++; d->c.queue_drop_bytes += len; trace(d, now, len, "drop_queue"); return;
    }
    if (d->count == d->slots) { d->c.overflow_drop_packets++; trace(d, now, len, "drop_overflow"); return; }
    if (d->c.delivered_packets + d->count > 0 && d->link_free_ns < now) d->c.idle_ns += now - d->link_free_ns;
    uint64_t start = d->link_free_ns > now ? d->link_free_ns : now;
    uint64_t tx_end = start;
    if (d->cfg.rate_bps > 0) tx_end += (uint64_t)llround((double)len * 8e9 / d->cfg.rate_bps);
    d->link_free_ns = tx_end;
    double delay_ns = d->cfg.delay_ms * 1e6;
    if (d->cfg.jitter_ms > 0) {
        delay_ns += rng_normal(d->rng) * d->cfg.jitter_ms * 1e6;
        if (delay_ns < 0) delay_ns = 0;
    }
    uint64_t deliver = tx_end + (uint64_t)llround(delay_ns);
    if (deliver < d->last_deliver_ns) deliver = d->last_deliver_ns;   /* never reorder */
    d->last_deliver_ns = deliver;
    uint32_t idx = (d->head + d->count) % d->slots;
    struct slot *s = &d->ring[idx];
    s->deliver_ns = deliver;
    s->tx_end_ns = tx_end;
    s->len = len;
    memcpy(s->data, pkt, len);
    d->count++;
    if (tx_end > now) {
        if (!d->ser_count) d->ser_head = idx;
        d->ser_count++;
        d->backlog_bytes += len;
        if (d->backlog_bytes > d->c.max_backlog_bytes) d->c.max_backlog_bytes = d->backlog_bytes;
    }
    trace(d, now, len, "enqueue");
}

static void deliver_due(struct direction *d, uint64_t now) {
    while (d->count && d->ring[d->head].deliver_ns <= now) {
        struct slot *s = &d->ring[d->head];
        uint64_t late = now - s->deliver_ns;
        if (late > d->c.late_max_ns) d->c.late_max_ns = late;
        d->c.late_sum_ns += late;
        if (late > 100000ull) d->c.late_over_100us++;
        if (late > 1000000ull) d->c.late_over_1ms++;
        if (write(d->out_fd, s->data, s->len) != (ssize_t)s->len) d->c.write_errors++;
        else {
            d->c.delivered_packets++;
            d->c.delivered_bytes += s->len;
            if (!d->c.first_deliver_ns) d->c.first_deliver_ns = now;
            d->c.last_deliver_ns = now;
        }
        trace(d, now, s->len, "deliver");
        if (d->ser_count && d->ser_head == d->head) {   /* delivered before tx end: only with rate change */
            d->backlog_bytes -= s->len; d->ser_head = (d->ser_head + 1) % d->slots; d->ser_count--;
        }
        d->head = (d->head + 1) % d->slots;
        d->count--;
    }
}

static void flush_queue(struct direction *d, uint64_t now) {
    while (d->count) {
        trace(d, now, d->ring[d->head].len, "drop_flush");
        d->c.flushed_packets++;
        d->head = (d->head + 1) % d->slots;
        d->count--;
    }
    d->ser_count = 0; d->backlog_bytes = 0; d->link_free_ns = now; d->last_deliver_ns = now;
}

static void read_device(struct direction *d, uint8_t *buf) {
    for (int i = 0; i < READ_BATCH; i++) {
        ssize_t n = read(d->in_fd, buf, READ_BUF);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) return;
            die("read from %s side: %s", d->name, strerror(errno));
        }
        if (n == 0) return;
        on_arrival(d, buf, (uint32_t)n, now_ns());
    }
}

/* ---------- control ---------- */

static void append(char *out, size_t cap, size_t *len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out + *len, cap > *len ? cap - *len : 0, fmt, ap);
    va_end(ap);
    if (n > 0) *len += (size_t)n;
}

static size_t stats_json(char *out, size_t cap) {
    size_t len = 0;
    uint64_t now = now_ns();
    append(out, cap, &len, "{\"pid\":%d,\"rt_priority\":%d,\"now_ns\":%llu", (int)getpid(), active_rt_priority,
           (unsigned long long)now);
    for (int i = 0; i < 2; i++) {
        struct direction *d = &dirs[i];
        struct dir_cfg *c = &d->cfg;
        struct counters *k = &d->c;
        drop_serialised(d, now);
        append(out, cap, &len,
               ",\"%s\":{\"config\":{\"rate\":%.17g,\"delay_ms\":%.17g,\"jitter_ms\":%.17g,"
               "\"loss_model\":\"%s\",\"loss\":%.17g,\"ge_p\":%.17g,\"ge_r\":%.17g,"
               "\"ge_loss_good\":%.17g,\"ge_loss_bad\":%.17g,\"buffer_bytes\":%llu,\"buffer_packets\":%llu},",
               d->name, c->rate_bps, c->delay_ms, c->jitter_ms,
               c->loss_model == LOSS_GILBERT ? "gilbert" : "bernoulli", c->loss, c->ge_p, c->ge_r,
               c->ge_loss_good, c->ge_loss_bad, (unsigned long long)c->buffer_bytes,
               (unsigned long long)c->buffer_packets);
        append(out, cap, &len,
               "\"rx_packets\":%llu,\"rx_bytes\":%llu,\"rx_ipv6_packets\":%llu,\"delivered_packets\":%llu,\"delivered_bytes\":%llu,"
               "\"lost_packets\":%llu,\"lost_bytes\":%llu,\"queue_drop_packets\":%llu,\"queue_drop_bytes\":%llu,"
               "\"overflow_drop_packets\":%llu,\"flushed_packets\":%llu,\"write_errors\":%llu,"
               "\"oversize_packets\":%llu,\"queued_packets\":%u,\"backlog_packets\":%u,\"backlog_bytes\":%llu,"
               "\"max_backlog_bytes\":%llu,\"late_max_ns\":%llu,\"late_sum_ns\":%llu,"
               "\"late_over_100us\":%llu,\"late_over_1ms\":%llu,\"first_rx_ns\":%llu,\"last_rx_ns\":%llu,"
               "\"first_deliver_ns\":%llu,\"last_deliver_ns\":%llu,\"idle_ns\":%llu}",
               (unsigned long long)k->rx_packets, (unsigned long long)k->rx_bytes,
               (unsigned long long)k->rx_ipv6_packets,
               (unsigned long long)k->delivered_packets, (unsigned long long)k->delivered_bytes,
               (unsigned long long)k->lost_packets, (unsigned long long)k->lost_bytes,
               (unsigned long long)k->queue_drop_packets, (unsigned long long)k->queue_drop_bytes,
               (unsigned long long)k->overflow_drop_packets, (unsigned long long)k->flushed_packets,
               (unsigned long long)k->write_errors, (unsigned long long)k->oversize_packets,
               d->count, d->ser_count, (unsigned long long)d->backlog_bytes,
               (unsigned long long)k->max_backlog_bytes, (unsigned long long)k->late_max_ns,
               (unsigned long long)k->late_sum_ns, (unsigned long long)k->late_over_100us,
               (unsigned long long)k->late_over_1ms, (unsigned long long)k->first_rx_ns,
               (unsigned long long)k->last_rx_ns, (unsigned long long)k->first_deliver_ns,
               (unsigned long long)k->last_deliver_ns, (unsigned long long)k->idle_ns);
    }
    append(out, cap, &len, "}\n");
    return len;
}

static void handle_control(int listen_fd) {
    int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) return;
    struct timeval tv = {.tv_sec = 0, .tv_usec = 200000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char line[4096];
    size_t got = 0;
    while (got < sizeof line - 1) {
        ssize_t n = read(fd, line + got, sizeof line - 1 - got);
        if (n <= 0) break;
        got += (size_t)n;
        if (memchr(line, '\n', got)) break;
    }
    line[got] = 0;
    char out[8192];
    size_t outlen = 0;
    char err[512] = "";
    if (!strncmp(line, "stats", 5)) outlen = stats_json(out, sizeof out);
    else if (!strncmp(line, "set ", 4)) {
        if (apply_settings(line + 4, err, sizeof err)) outlen = (size_t)snprintf(out, sizeof out, "error: %s\n", err);
        else outlen = (size_t)snprintf(out, sizeof out, "ok\n");
    } else if (!strncmp(line, "flush", 5)) {
        uint64_t now = now_ns();
        flush_queue(&dirs[0], now); flush_queue(&dirs[1], now);
        outlen = (size_t)snprintf(out, sizeof out, "ok\n");
    } else outlen = (size_t)snprintf(out, sizeof out, "error: unknown command (stats, set K=V..., flush)\n");
    if (outlen > sizeof out) outlen = sizeof out;
    ssize_t unused = write(fd, out, outlen);
    (void)unused;
    close(fd);
}

/* ---------- setup ---------- */

static int open_tun(const char *netns_path, const char *name, int home_ns) {
    if (netns_path && *netns_path) {
        int nsfd = open(netns_path, O_RDONLY | O_CLOEXEC);
        if (nsfd < 0) die("open %s: %s", netns_path, strerror(errno));
        if (setns(nsfd, CLONE_NEWNET)) die("setns %s: %s", netns_path, strerror(errno));
        close(nsfd);
    }
    int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
    if (fd < 0) die("open /dev/net/tun: %s", strerror(errno));
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI;      /* no IFF_VNET_HDR: the kernel segments, packets <= MTU */
    snprintf(ifr.ifr_name, IFNAMSIZ, "%s", name);
    if (ioctl(fd, TUNSETIFF, &ifr)) die("TUNSETIFF %s: %s", name, strerror(errno));
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    if (home_ns >= 0 && setns(home_ns, CLONE_NEWNET)) die("setns back: %s", strerror(errno));
    return fd;
}

static void on_signal(int sig) { (void)sig; stop_requested = 1; }

static void usage(void) {
    fprintf(stderr,
            "usage: iwemu --a-dev NAME [--a-netns PATH] --b-dev NAME [--b-netns PATH]\n"
            "             [--control SOCKET] [--trace FILE] [--seed N] [--slots N] [--rt-priority N]\n"
            "             [SETTING...]\n"
            "SETTING: {down|up|both}.{rate,delay_ms,jitter_ms,loss,loss_model,ge_p,ge_r,\n"
            "         ge_loss_good,ge_loss_bad,buffer_bytes,buffer_packets}=VALUE\n"
            "A is the host's device (down = B->A), B the core's.  Prints \"ready\" when both exist.\n");
    exit(2);
}

int main(int argc, char **argv) {
    const char *a_dev = NULL, *b_dev = NULL, *a_ns = NULL, *b_ns = NULL, *control = NULL, *trace_path = NULL;
    uint64_t seed = 1;
    uint32_t slots = DEFAULT_SLOTS;
    int rt_priority = 0;
    dirs[0].name = "down";
    dirs[1].name = "up";
    for (int i = 0; i < 2; i++) dirs[i].cfg.ge_loss_bad = 1.0;
    char settings[8192] = "";
    size_t settings_len = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
#define ARG(flag, var) if (!strcmp(a, flag)) { if (++i >= argc) usage(); var = argv[i]; continue; }
        ARG("--a-dev", a_dev) ARG("--b-dev", b_dev) ARG("--a-netns", a_ns) ARG("--b-netns", b_ns)
        ARG("--control", control) ARG("--trace", trace_path)
        if (!strcmp(a, "--seed")) { if (++i >= argc) usage(); seed = strtoull(argv[i], NULL, 10); continue; }
        if (!strcmp(a, "--rt-priority")) { if (++i >= argc) usage(); rt_priority = atoi(argv[i]); continue; }
        if (!strcmp(a, "--slots")) { if (++i >= argc) usage(); slots = (uint32_t)strtoul(argv[i], NULL, 10); continue; }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) usage();
        if (a[0] == '-') usage();
        append(settings, sizeof settings, &settings_len, "%s ", a);
    }
    if (!a_dev || !b_dev || slots < 2) usage();
    char err[512];
    if (apply_settings(settings, err, sizeof err)) die("%s", err);
    rng_seed(dirs[0].rng, seed * 2 + 0);
    rng_seed(dirs[1].rng, seed * 2 + 1);

    prctl(PR_SET_TIMERSLACK, 1UL);   /* default 50 us slack would add to every delay */
    if (rt_priority > 0) {
        /* On a busy machine a SCHED_OTHER emulator is descheduled for tens of ms, which
         * shows up as delay spikes and idle link time; SCHED_FIFO keeps it on time.  It
         * sleeps between packets, so it only uses what the traffic needs. */
        struct sched_param sp = {.sched_priority = rt_priority};
        if (sched_setscheduler(0, SCHED_FIFO, &sp)) {
            /* e.g. a container without CAP_SYS_NICE or with no real-time budget: keep going,
             * less accurate on a busy machine; "stats" reports rt_priority 0. */
            fprintf(stderr, "iwemu: warning: SCHED_FIFO %d not available (%s); normal scheduling\n",
                    rt_priority, strerror(errno));
            rt_priority = 0;
        }
        active_rt_priority = rt_priority;
    }
    int home_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    int a_fd = open_tun(a_ns, a_dev, home_ns);
    int b_fd = open_tun(b_ns, b_dev, -1);   /* stay in B's namespace (the core) */
    close(home_ns);

    for (int i = 0; i < 2; i++) {
        dirs[i].slots = slots;
        dirs[i].ring = mmap(NULL, (size_t)slots * sizeof(struct slot), PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (dirs[i].ring == MAP_FAILED) die("mmap: %s", strerror(errno));
    }
    dirs[0].in_fd = b_fd; dirs[0].out_fd = a_fd;
    dirs[1].in_fd = a_fd; dirs[1].out_fd = b_fd;

    if (trace_path) {
        trace_file = fopen(trace_path, "we");
        if (!trace_file) die("open trace %s: %s", trace_path, strerror(errno));
        setvbuf(trace_file, NULL, _IOFBF, 1 << 20);
    }
    int ctl_fd = -1;
    if (control) {
        ctl_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        if (strlen(control) >= sizeof addr.sun_path) die("control path too long: %s", control);
        strcpy(addr.sun_path, control);
        unlink(control);
        if (bind(ctl_fd, (struct sockaddr *)&addr, sizeof addr) || listen(ctl_fd, 16))
            die("control socket %s: %s", control, strerror(errno));
    }
    int timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN};
    ev.data.fd = a_fd; epoll_ctl(ep, EPOLL_CTL_ADD, a_fd, &ev);
    ev.data.fd = b_fd; epoll_ctl(ep, EPOLL_CTL_ADD, b_fd, &ev);
    ev.data.fd = timer_fd; epoll_ctl(ep, EPOLL_CTL_ADD, timer_fd, &ev);
    if (ctl_fd >= 0) { ev.data.fd = ctl_fd; epoll_ctl(ep, EPOLL_CTL_ADD, ctl_fd, &ev); }

    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    printf("ready\n");
    fflush(stdout);

    uint8_t *buf = malloc(READ_BUF);
    uint64_t armed = 0, last_flush = now_ns();
    struct epoll_event events[8];
    while (!stop_requested) {
        uint64_t now = now_ns();
        deliver_due(&dirs[0], now);
        deliver_due(&dirs[1], now);
        uint64_t next = 0;
        for (int i = 0; i < 2; i++)
            if (dirs[i].count && (!next || dirs[i].ring[dirs[i].head].deliver_ns < next))
                next = dirs[i].ring[dirs[i].head].deliver_ns;
        if (trace_file && now - last_flush > 1000000000ull) { fflush(trace_file); last_flush = now; }
        if (next != armed) {
            struct itimerspec its = {0};
            if (next) { its.it_value.tv_sec = next / 1000000000ull; its.it_value.tv_nsec = next % 1000000000ull; }
            timerfd_settime(timer_fd, TFD_TIMER_ABSTIME, &its, NULL);
            armed = next;
        }
        int n = epoll_wait(ep, events, 8, trace_file ? 1000 : -1);
        if (n < 0) { if (errno == EINTR) continue; die("epoll_wait: %s", strerror(errno)); }
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == a_fd) read_device(&dirs[1], buf);
            else if (fd == b_fd) read_device(&dirs[0], buf);
            else if (fd == timer_fd) { uint64_t x; ssize_t r = read(timer_fd, &x, sizeof x); (void)r; armed = 0; }
            else if (fd == ctl_fd) handle_control(ctl_fd);
        }
    }
    if (trace_file) fclose(trace_file);
    if (control) unlink(control);
    return 0;
}
